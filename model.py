"""Show the model a run directory describes: every parameter tensor, the counts, the FLOPs of a
training token, how it runs on this backend and which part of the optimiser trains each tensor.

    uv run model.py runs/gpt2-small          # a table (shapes only: no weights are made or read)
    uv run model.py runs/gpt2-small --json   # the same as JSON

The model's code is jaxgpt/model/: gpt.py (GPT-2 and its modern variants, the A-to-A model, their
shapes), layers.py (the parts model.json chooses), connections.py (value embeddings and skips),
loss.py (the training loss) and sampling.py (decoding with a KV cache); how matmuls and attention
run on each backend is jaxgpt/ops/ (select.py chooses once per model). The optimiser is
jaxgpt/training/optimizer.py (and muon.py); the keys of model.json: docs/configs.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import ConfigError, load_run_configs
from jaxgpt.training.mfu import flops_per_token


def describe(run_dir: Path) -> dict[str, Any]:
    """What `main` prints, as a dict: the configs are checked first, then JAX builds the model's
    shapes (jax.eval_shape: no parameter is allocated, a 1.5B model describes in a second)."""
    model_cfg, train_cfg = load_run_configs(run_dir)  # JAX starts after this check
    import jax
    from flax import nnx

    from jaxgpt.model.gpt import abstract_model, matrix_mask
    from jaxgpt.ops import select
    from jaxgpt.training import muon
    from jaxgpt.training.optimizer import peak_rates

    ops = select(model_cfg)
    model = abstract_model(model_cfg, ops)
    params = nnx.state(model, nnx.Param)
    flat = [(".".join(map(str, path)), tuple(var.get_value().shape)) for path, var in nnx.to_flat_state(params)]
    if train_cfg.optimizer == "muon":
        routing = muon.routing_table(model, muon.routes(model))
    else:  # AdamW decays the matrices only (optimizer.make_transform's mask)
        decayed = jax.tree.leaves(matrix_mask(params))
        routing = {}
        for (name, shape), decay in zip(flat, decayed):
            entry = routing.setdefault("decayed" if decay else "not decayed", {"tensors": 0, "params": 0, "names": []})
            entry["tensors"] += 1
            entry["params"] += math.prod(shape)
            if (pattern := re.sub(r"\.\d+\.", ".*.", name)) not in entry["names"]:
                entry["names"].append(pattern)
    seq_len = train_cfg.seq_len(model_cfg)
    kv_width = model_cfg.kv_heads * model_cfg.head_dim  # C, or K D with grouped-query attention
    kv_bytes = 2 * model_cfg.n_layers * kv_width * 4 if model_cfg.architecture == "gpt2" else 0
    return {
        "run": str(run_dir),
        "architecture": model_cfg.architecture,
        "tensors": [{"name": name, "shape": list(shape), "params": math.prod(shape)} for name, shape in flat],
        "params": sum(math.prod(shape) for _, shape in flat),
        "flops_per_token": flops_per_token(model_cfg, seq_len),
        "sequence_length": seq_len,
        "backend": ops.backend,
        "compute_dtype": ops.compute_dtype,
        "attention": ops.attention_kernel,
        "kv_cache_bytes_per_token": kv_bytes,  # float32 keys and values of every layer, per row
        "optimizer": train_cfg.optimizer,
        "peak_rates": peak_rates(train_cfg),
        "routing": routing,
    }


def _grouped(tensors: list[dict[str, Any]]) -> list[tuple[str, list[int], int, int]]:
    """(name with layer numbers as *, shape, layers, params) per distinct tensor, in model order."""
    rows: dict[tuple[str, tuple[int, ...]], list[Any]] = {}
    for t in tensors:
        key = (re.sub(r"^blocks\.\d+\.", "blocks.*.", t["name"]), tuple(t["shape"]))
        row = rows.setdefault(key, [0, 0])
        row[0] += 1
        row[1] += t["params"]
    return [(name, list(shape), n, p) for (name, shape), (n, p) in rows.items()]


def report(d: dict[str, Any]) -> str:
    lines = [
        f"{d['run']}: {d['architecture']}, {d['params']:,} parameters",
        f"  {'tensor':<40} {'shape':<20} {'n':>4} {'params':>14}",
    ]
    for name, shape, n, p in _grouped(d["tensors"]):
        lines.append(f"  {name:<40} {'x'.join(map(str, shape)):<20} {n:>4} {p:>14,}")
    lines.append(
        f"FLOPs per training token at sequence length {d['sequence_length']}: "
        f"{d['flops_per_token']:.4g} (6N + 12LTC; a windowed layer counts its window for T)"
    )
    lines.append(
        f"On {d['backend']}: compute dtype {d['compute_dtype']}, attention {d['attention']}"
        + (
            f"; KV cache {d['kv_cache_bytes_per_token']:,} bytes per token per row"
            if d["kv_cache_bytes_per_token"]
            else ""
        )
    )
    lines.append(f"optimizer {d['optimizer']}: parameters by part")
    for part, e in d["routing"].items():
        rate = d["peak_rates"].get(part, d["peak_rates"].get("adamw"))
        lines.append(
            f"  {part:<11} lr {rate:<8.3g} {e['tensors']:>4} tensors {e['params']:>14,} params: {', '.join(e['names'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        d = describe(args.run_dir)
    except ConfigError as e:
        return refuse(e)
    print(json.dumps(d, indent=2) if args.json else report(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
