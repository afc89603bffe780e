"""OpenAI GPT-2 weights (Hugging Face layout) into a run directory, and back (import_gpt2.py).

An import writes a run directory that every tool accepts:

    runs/gpt2/model.json          gpt2, vocab/context/sizes from the file, qkv_bias, tied embeddings
                                  (bias=false when every bias in the file is exactly zero)
    runs/gpt2/train.json          a fine-tuning run on the built-in corpus with the gpt2 tokenizer,
                                  "init_from": "pretrained"
    runs/gpt2/pretrained/         a weights-only checkpoint: model.safetensors (our dotted keys),
                                  model.json, train.json, meta.json (step 0, "weights_only": true)

    uv run test_generation.py runs/gpt2     # samples from pretrained/ until the run has checkpoints
    uv run evaluate.py runs/gpt2
    uv run train.py runs/gpt2               # fine-tunes FROM pretrained/ at step 0 with a fresh optimiser

Only an untied `lm_head.weight` is transposed (Conv1D weights are (in, out), as nnx.Linear
kernels; c_attn is our qkv layout). The causal-mask buffers are skipped. The head count comes from
--n-heads, a config.json beside the file, the size table, or emb_dim / 64.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, ModelConfig, default_tokenizer
from jaxgpt.conversations.template import TemplateError, read_template
from jaxgpt.files import write_tensors
from jaxgpt.interop import hf_tokenizer as tk
from jaxgpt.interop import imported

# name -> (n_layers, emb_dim, n_heads); all four have vocab 50257 and context 1024.
VARIANTS = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}
HUB_ORG = "openai-community"
_LAYER = re.compile(r"^h\.(\d+)\.")
_BUFFERS = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")  # causal masks, not weights
# Our per-block name -> Hugging Face's (after "h.{i}.").
_BLOCK = {
    "ln1.scale": "ln_1.weight",
    "ln1.bias": "ln_1.bias",
    "attn.qkv.kernel": "attn.c_attn.weight",
    "attn.qkv.bias": "attn.c_attn.bias",
    "attn.proj.kernel": "attn.c_proj.weight",
    "attn.proj.bias": "attn.c_proj.bias",
    "ln2.scale": "ln_2.weight",
    "ln2.bias": "ln_2.bias",
    "mlp.fc.kernel": "mlp.c_fc.weight",
    "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.out.kernel": "mlp.c_proj.weight",
    "mlp.out.bias": "mlp.c_proj.bias",
}
_TOP = {
    "tok_emb.embedding": "wte.weight",
    "pos_emb.embedding": "wpe.weight",
    "ln_f.scale": "ln_f.weight",
    "ln_f.bias": "ln_f.bias",
}


class WeightsError(ValueError):
    """A GPT-2 file that cannot be imported or a run that cannot be exported (one line)."""


# ----------------------------------------------------------------------------- reading Hugging Face files


def read_hf(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a Hugging Face GPT-2 safetensors file, keys without the "transformer." prefix
    that GPT2LMHeadModel checkpoints carry, mask buffers dropped."""
    try:
        raw = load_file(str(path))
    except FileNotFoundError:
        raise WeightsError(f"{path}: file not found") from None
    except (SafetensorError, OSError) as e:
        raise WeightsError(f"{path}: not a readable safetensors file ({e})") from None
    out = {}
    for key, value in raw.items():
        key = key.removeprefix("transformer.")
        if not _BUFFERS.match(key):
            out[key] = value
    return out


def infer_config(
    tensors: dict[str, np.ndarray], where: str, *, n_heads: int | None = None, hf_config: dict[str, Any] | None = None
) -> ModelConfig:
    """model.json for a GPT-2 state dict: sizes from the shapes, heads as the module docstring says."""
    for key in ("wte.weight", "wpe.weight"):
        if key not in tensors or tensors[key].ndim != 2:
            raise WeightsError(f"{where}: no 2-D {key!r}; not a GPT-2 state dict (keys: {sorted(tensors)[:4]} ...)")
    vocab, C = tensors["wte.weight"].shape
    ctx = tensors["wpe.weight"].shape[0]
    layers = sorted({int(m.group(1)) for k in tensors if (m := _LAYER.match(k))})
    if layers != list(range(len(layers))) or not layers:
        raise WeightsError(f"{where}: transformer blocks h.N are missing or not numbered 0..L-1 (found {layers[:8]})")
    L = len(layers)
    if hf_config:
        for key, want in (("activation_function", "gelu_new"), ("layer_norm_epsilon", 1e-5)):
            if key in hf_config and hf_config[key] != want:
                raise WeightsError(f"{where}: config.json {key}={hf_config[key]!r}; this model uses {want!r}")
    if n_heads is None and hf_config and "n_head" in hf_config:
        n_heads = int(hf_config["n_head"])
    if n_heads is None:
        n_heads = next((h for layers, c, h in VARIANTS.values() if (layers, c) == (L, C)), None)
    if n_heads is None and C % 64 == 0:
        n_heads = C // 64  # GPT-2's head size is 64 at every size
    if n_heads is None:
        raise WeightsError(f"{where}: cannot tell the number of heads for emb_dim={C}; pass --n-heads")
    tied = "lm_head.weight" not in tensors or np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"])
    # Every bias exactly zero: a bias-free model's export (export writes zeros), so the round
    # trip gives back bias=false. A trained GPT-2 never has all its biases at exactly zero.
    biases = [v for k, v in tensors.items() if k.endswith(".bias")]
    bias = not biases or any(np.any(v) for v in biases)
    try:
        return ModelConfig(
            architecture="gpt2",
            vocab_size=int(vocab),
            context_length=int(ctx),
            emb_dim=int(C),
            n_heads=n_heads,
            n_layers=L,
            qkv_bias=bias,
            bias=bias,
            drop_rate=0.0,
            tie_embeddings=tied,
        )
    except ConfigError as e:
        raise WeightsError(f"{where}: {e}") from None


def hf_to_ours(tensors: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> dict[str, np.ndarray]:
    """Hugging Face GPT-2 tensors -> our dotted parameter names (float32), every key and shape checked."""
    mapping = dict(_TOP)
    for i in range(cfg.n_layers):
        mapping.update({f"blocks.{i}.{ours}": f"h.{i}.{theirs}" for ours, theirs in _BLOCK.items()})
    used = set(mapping.values())
    if not cfg.tie_embeddings:
        used.add("lm_head.weight")
    elif "lm_head.weight" in tensors:
        used.add("lm_head.weight")  # equal to wte.weight (checked by infer_config): nothing to keep
    unexpected = sorted(set(tensors) - used)
    if unexpected:
        raise WeightsError(f"{where}: unexpected tensors {unexpected[:3]} (not GPT-2's layout?)")
    out = {}
    expected = _expected_shapes(cfg)
    for ours, theirs in mapping.items():
        if theirs not in tensors:
            raise WeightsError(f"{where}: missing tensor {theirs!r}")
        if ours in expected:  # a bias-free model: the file's (all-zero) biases are read and dropped
            out[ours] = tensors[theirs]
    if not cfg.tie_embeddings:
        out["head.kernel"] = tensors["lm_head.weight"].T  # nn.Linear (V, C) -> kernel (C, V)
    for key, shape in expected.items():
        if tuple(out[key].shape) != shape:
            raise WeightsError(
                f"{where}: {mapping.get(key, 'lm_head.weight')} has shape "
                f"{tuple(out[key].shape)}, expected {shape} for {cfg.n_layers} layers x {cfg.emb_dim} dims"
            )
    assert set(out) == set(expected), sorted(set(out) ^ set(expected))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


# model.json options whose function Hugging Face's GPT2LMHeadModel cannot compute, with the value
# that it can (GPT-2's own); `norm_scale: false` and `bias: false` export as ones and zeros instead.
_NOT_GPT2 = {
    "positions": "learned",
    "norm": "layernorm",
    "embed_norm": False,
    "qk_norm": False,
    "mlp": "gelu",
    "logit_softcap": None,
    "value_embeds": False,
    "embed_skips": False,
    "unet_skips": False,
    "window_pattern": None,
}


def gpt2_layout_problem(cfg: ModelConfig) -> str | None:
    """Why `cfg` has no Hugging Face GPT-2 layout (every option that has none, in one line), or None."""
    found = []
    if cfg.kv_heads != cfg.n_heads:
        found.append(f"n_kv_heads={cfg.n_kv_heads} (GPT-2's keys and values have every head, n_heads={cfg.n_heads})")
    found += [
        f"{key}={getattr(cfg, key)!r} (GPT-2's is {gpt2!r})"
        for key, gpt2 in _NOT_GPT2.items()
        if getattr(cfg, key) != gpt2
    ]
    if not found:
        return None
    verb = "has" if len(found) == 1 else "have"
    return f"model.json {', '.join(found)} {verb} no Hugging Face GPT-2 layout; export needs a GPT-2-shaped model"


def ours_to_hf(weights: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our parameters -> the Hugging Face GPT-2 layout. A bias the model has not (qkv_bias=false,
    bias=false) is written as zeros and a LayerNorm scale it has not (norm_scale=false) as ones,
    which compute the same: GPT-2's layout has no bias-free or scale-free form."""

    def get(ours: str) -> np.ndarray:
        if ours in weights or not ours.endswith((".bias", ".scale")):
            return weights[ours]
        if ours.endswith(".scale"):
            return np.ones(cfg.emb_dim, np.float32)
        width = {"attn.qkv.bias": 3, "mlp.fc.bias": 4}.get(ours.split(".", 2)[-1], 1)
        return np.zeros(width * cfg.emb_dim, np.float32)

    out = {theirs: get(ours) for ours, theirs in _TOP.items()}
    for i in range(cfg.n_layers):
        for ours, theirs in _BLOCK.items():
            out[f"h.{i}.{theirs}"] = get(f"blocks.{i}.{ours}")
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = weights["head.kernel"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config_json(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """config.json for transformers' GPT2LMHeadModel."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context_length,
        "n_ctx": cfg.context_length,
        "n_embd": cfg.emb_dim,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": cfg.drop_rate,
        "embd_pdrop": cfg.drop_rate,
        "attn_pdrop": cfg.drop_rate,
        "initializer_range": 0.02,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "torch_dtype": "float32",
    }


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    from flax import nnx  # imported late: reading and checking files needs no JAX

    from jaxgpt.model.gpt import abstract_model

    # The file layout: per-layer keys, as store.py writes them even for a scan_layers model.
    flat = nnx.to_flat_state(nnx.state(abstract_model(dataclasses.replace(cfg, scan_layers=False)), nnx.Param))
    return {".".join(map(str, path)): tuple(var.get_value().shape) for path, var in flat}


# ----------------------------------------------------------------------------- import


def fetch(variant: str) -> Path:
    """Download (or find in the Hugging Face cache) openai-community/<variant>'s model.safetensors."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise WeightsError(
            f"{variant}: downloading needs huggingface_hub (uv sync, or "
            f"`uv run --with huggingface_hub ...`); or pass a local model.safetensors"
        ) from None
    repo = f"{HUB_ORG}/{variant}"
    try:
        path = Path(hf_hub_download(repo_id=repo, filename="model.safetensors"))
        hf_hub_download(repo_id=repo, filename="config.json")  # beside it in the cache: gives n_head
    except Exception as e:  # network, auth and cache errors come in many types; name the first line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise WeightsError(
            f"{repo}: download failed ({type(e).__name__}: {first[:200]}); "
            f"offline, pass a local model.safetensors instead"
        ) from e
    return path


def _source_file(source: str) -> tuple[Path, str]:
    """(safetensors path, description) for a variant name, a file or a folder holding one."""
    path = Path(source)
    if path.is_dir():
        path = path / "model.safetensors"
    if path.is_file():
        return path, str(path)
    if source in VARIANTS:
        return fetch(source), f"{HUB_ORG}/{source}"
    raise WeightsError(f"{source}: neither a file nor a GPT-2 variant ({', '.join(VARIANTS)})")


def import_run(
    source: str | Path, run_dir: Path, *, n_heads: int | None = None, tokenizer: str = "gpt2", force: bool = False
) -> Path:
    """Turn a GPT-2 safetensors file (or variant name) into a run directory; returns pretrained/."""
    run_dir = Path(run_dir)
    imported.check_target(run_dir, force, WeightsError)
    path, described = _source_file(str(source))
    hf_cfg_path = path.with_name("config.json")
    hf_cfg = json.loads(hf_cfg_path.read_text()) if hf_cfg_path.is_file() else None
    tensors = read_hf(path)
    cfg = infer_config(tensors, str(path), n_heads=n_heads, hf_config=hf_cfg)
    weights = hf_to_ours(tensors, cfg, str(path))
    del tensors
    return imported.write_run(run_dir, weights, cfg, tokenizer, {}, described)


# ----------------------------------------------------------------------------- export


def export_run(path: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Write a checkpoint (or a run's latest) as Hugging Face GPT-2: model.safetensors, config.json and
    the run's tokenizer as AutoTokenizer reads it (with a fine-tuned run's chat template)."""
    ckpt_dir, cfg, train = ckpt.checkpoint_configs(Path(path))  # the same resolution test_generation.py uses
    if cfg.architecture != "gpt2":
        raise WeightsError(f"{ckpt_dir}: architecture {cfg.architecture!r} has no GPT-2 counterpart")
    problem = gpt2_layout_problem(cfg)
    if problem is not None:
        raise WeightsError(f"{ckpt_dir}: {problem}")
    out_dir = Path(out_dir)
    target = out_dir / "model.safetensors"
    if target.exists() and not force:
        raise WeightsError(f"{target}: already exists; pass --force to overwrite")
    name = train.get("tokenizer", default_tokenizer(train.get("dataset", {}).get("source", "builtin")))
    try:
        tokenizer_json = tk.run_tokenizer_json(ckpt_dir, name)
        # config.json's bos/eos: the run's end-of-text id (a trained tokenizer's from its file in the checkpoint).
        eot_id, _ = tk.eot_of(tokenizer_json, f"{ckpt_dir}: tokenizer {name!r}")
        template = read_template(ckpt_dir)
    except (tk.ConversionError, TemplateError) as e:
        raise WeightsError(str(e)) from None
    weights = load_file(str(ckpt_dir / ckpt.WEIGHTS))
    hf = ours_to_hf(weights, cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    write_tensors(hf, tmp, metadata={"format": "pt"})  # transformers refuses files without it
    os.replace(tmp, target)
    chat = None if template is None else template.jinja()
    tk.write_tokenizer(out_dir, tokenizer_json, context_length=cfg.context_length, chat_template=chat)
    _write_json(out_dir / "config.json", hf_config_json(cfg, eot_id))
    return target


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
