"""The PyTorch side of `uv run -m bench compare`: a plain PyTorch GPT-2 training step, timed.

Run by the reference interpreter (a venv with torch, docs/performance.md "The PyTorch reference"),
never by the project's: this file imports nothing of the project, and torch only inside `main`, so
the project's tests read its table and its arguments without torch installed.

    $JAXGPT_TORCH_PYTHON bench/torch_step.py --config cpu-small [--bf16] [--json out.json]
    $JAXGPT_TORCH_PYTHON bench/torch_step.py --all --json out.json

The model is the one `uv run -m bench train --config NAME` builds (bench/train_step.py,
`reference_configs`): GPT-2 with learned positions, pre-LayerNorm blocks, causal attention
(torch's scaled_dot_product_attention), a 4x tanh-GELU MLP, a final LayerNorm and the head tied to
the token embedding; every bias on, dropout 0; weights N(0, 0.02), the two residual projections
of each block N(0, 0.02 / sqrt(2 L)), biases 0. Written as functions over a dict of tensors (the
same torch.nn.functional calls nn.Linear, nn.LayerNorm and nn.Embedding make). One step: random
inputs and targets, the cross-entropy in float32, AdamW at 3e-4 (betas 0.9 / 0.999, eps 1e-8,
decay 0.1 on the 2-D tensors only), the gradient's global norm clipped to 1.0. --bf16 runs the
forward under torch.autocast("cpu", bfloat16): bfloat16 matmuls over float32 weights, as our
compute_dtype "bfloat16". Five untimed steps, then --windows windows of --steps-per-window steps.

--json writes a list, one object per config, with the keys bench/compare.py reads: config,
tokens_per_s_median / _min / _max (over the windows), flops_per_token, threads, compiled,
autocast_bf16, torch (its version).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# name: (vocab, context, layers, heads, dims, batch); bench/train_step.py's REFERENCE_CONFIGS is this table
CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "char-tiny": (65, 256, 6, 6, 384, 8),
    "cpu-small": (256, 128, 4, 4, 128, 16),
    "gpt2-vocab": (50304, 256, 4, 4, 256, 4),
    "nano-cpu": (257, 64, 4, 4, 128, 12),  # nanoGPT's CPU recipe for Tiny Shakespeare, on bytes
}
UNTIMED_STEPS = 5
LEARNING_RATE, WEIGHT_DECAY, MAX_NORM = 3e-4, 0.1, 1.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="cpu-small")
    p.add_argument("--all", action="store_true", help="every config, one after the other")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--windows", type=int, default=5, help="timed windows (default: %(default)s)")
    p.add_argument("--steps-per-window", type=int, default=10, help="steps per timed window (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward pass")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16) around the forward pass")
    p.add_argument("--json", type=Path, default=None, help="write the figures (a list, one per config) here")
    return p


def flops_per_token(vocab: int, context: int, layers: int, dims: int) -> int:
    """6 x (the blocks' matmul weights + the head) + attention's two products: bench train's count."""
    return 6 * (12 * layers * dims * dims + vocab * dims) + 12 * layers * dims * context


def init_params(torch: Any, vocab: int, context: int, layers: int, dims: int) -> dict[str, Any]:
    """Every trainable tensor, by name; linear weights (out, in) as F.linear takes them."""

    def normal(*size: int, std: float = 0.02) -> Any:
        return (torch.randn(*size) * std).requires_grad_()

    def const(value: float, size: int) -> Any:
        return torch.full((size,), value).requires_grad_()

    residual_std = 0.02 / math.sqrt(2 * layers)
    params = {
        "tok": normal(vocab, dims),
        "pos": normal(context, dims),
        "lnf.w": const(1.0, dims),
        "lnf.b": const(0.0, dims),
    }
    for i in range(layers):
        params |= {
            f"{i}.ln1.w": const(1.0, dims),
            f"{i}.ln1.b": const(0.0, dims),
            f"{i}.qkv.w": normal(3 * dims, dims),
            f"{i}.qkv.b": const(0.0, 3 * dims),
            f"{i}.proj.w": normal(dims, dims, std=residual_std),
            f"{i}.proj.b": const(0.0, dims),
            f"{i}.ln2.w": const(1.0, dims),
            f"{i}.ln2.b": const(0.0, dims),
            f"{i}.fc.w": normal(4 * dims, dims),
            f"{i}.fc.b": const(0.0, 4 * dims),
            f"{i}.out.w": normal(dims, 4 * dims, std=residual_std),
            f"{i}.out.b": const(0.0, dims),
        }
    return params


def make_forward(F: Any, layers: int, heads: int) -> Callable[[dict[str, Any], Any], Any]:
    """The forward pass: token ids (B, T) -> logits (B, T, V)."""

    def forward(p: dict[str, Any], idx: Any) -> Any:
        B, T = idx.shape
        C = p["tok"].shape[1]
        x = F.embedding(idx, p["tok"]) + p["pos"][:T]  # (B, T, C)
        for i in range(layers):
            h = F.layer_norm(x, (C,), p[f"{i}.ln1.w"], p[f"{i}.ln1.b"])
            q, k, v = F.linear(h, p[f"{i}.qkv.w"], p[f"{i}.qkv.b"]).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, p[f"{i}.proj.w"], p[f"{i}.proj.b"])
            h = F.layer_norm(x, (C,), p[f"{i}.ln2.w"], p[f"{i}.ln2.b"])
            h = F.gelu(F.linear(h, p[f"{i}.fc.w"], p[f"{i}.fc.b"]), approximate="tanh")  # (B, T, 4C)
            x = x + F.linear(h, p[f"{i}.out.w"], p[f"{i}.out.b"])
        x = F.layer_norm(x, (C,), p["lnf.w"], p["lnf.b"])
        return F.linear(x, p["tok"])  # the tied head

    return forward


def measure(
    torch: Any, name: str, *, windows: int, steps_per_window: int, compile_model: bool, bf16: bool
) -> dict[str, Any]:
    """One config's steady-state tokens/s, per timed window."""
    import torch.nn.functional as F

    vocab, context, layers, heads, dims, batch = CONFIGS[name]
    torch.manual_seed(0)
    params = init_params(torch, vocab, context, layers, dims)
    matrices = [t for t in params.values() if t.dim() >= 2]
    others = [t for t in params.values() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": WEIGHT_DECAY}, {"params": others, "weight_decay": 0.0}],
        lr=LEARNING_RATE,
        fused=False,
    )
    forward = make_forward(F, layers, heads)
    if compile_model:
        forward = torch.compile(forward)

    def step() -> float:
        x = torch.randint(0, vocab, (batch, context))
        y = torch.randint(0, vocab, (batch, context))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(params, x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM)
        opt.step()
        return loss.item()  # waits for the step, as our side's block on the result

    for _ in range(UNTIMED_STEPS):
        step()
    rates = []
    for _ in range(windows):
        started = time.perf_counter()
        for _ in range(steps_per_window):
            step()
        rates.append(batch * context * steps_per_window / (time.perf_counter() - started))
    return {
        "config": name,
        "tokens_per_s_median": statistics.median(rates),
        "tokens_per_s_min": min(rates),
        "tokens_per_s_max": max(rates),
        "flops_per_token": flops_per_token(vocab, context, layers, dims),
        "threads": torch.get_num_threads(),
        "compiled": compile_model,
        "autocast_bf16": bf16,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    if args.threads is not None and args.threads != torch.get_num_threads():
        # Only when asked for another count: a set_num_threads call, even to the current count,
        # changes how OpenMP's threads wait between parallel regions, and can slow every op.
        torch.set_num_threads(args.threads)
    results = [
        measure(
            torch,
            name,
            windows=args.windows,
            steps_per_window=args.steps_per_window,
            compile_model=args.compile,
            bf16=args.bf16,
        )
        for name in (sorted(CONFIGS) if args.all else [args.config])
    ]
    for r in results:
        print(
            f"{r['config']:>11}: {r['tokens_per_s_median']:,.0f} tokens/s (min {r['tokens_per_s_min']:,.0f}, "
            f"max {r['tokens_per_s_max']:,.0f}; torch {r['torch']}, {r['threads']} threads"
            f"{', autocast bf16' if r['autocast_bf16'] else ''})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
