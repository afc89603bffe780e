"""The PyTorch side of `uv run -m bench generate`: transformers' GPT2LMHeadModel.generate, timed.

Run by the reference interpreter (a python with torch and transformers, docs/performance.md
"The PyTorch reference"), never by the project's: torch and transformers are not dependencies of
this project, this file imports nothing of it, and torch only inside `main`, so the project's
tests parse its arguments without torch installed.

    $JAXGPT_TORCH_PYTHON bench/torch_generate.py --dtype bfloat16 --batch-size 8 --json out.json

A randomly initialised GPT-2 of the given shape (GPT2Config + GPT2LMHeadModel(config): no
download), its weights in --dtype (`model.to(torch.bfloat16)`, as one loads a bfloat16 model),
greedy `generate` with its KV cache (`use_cache=True`) from random prompts, exactly --new-tokens
new tokens per row (min_new_tokens = max_new_tokens: end-of-text cannot stop a row early). One
untimed call first, then --repeats timed calls; ms/token = a call's time / new tokens, the
prompt's prefill included, as on our side. Threads as torch sets them by default (no
torch.set_num_threads, as bench/torch_step.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls after one untimed")
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--context-length", type=int, default=1024)
    parser.add_argument("--emb-dim", type=int, default=768)
    parser.add_argument("--n-layers", type=int, default=12)
    parser.add_argument("--n-heads", type=int, default=12)
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=args.vocab_size,
        n_positions=args.context_length,
        n_embd=args.emb_dim,
        n_layer=args.n_layers,
        n_head=args.n_heads,
    )
    model = GPT2LMHeadModel(config).eval().to(getattr(torch, args.dtype))
    prompts = torch.randint(0, args.vocab_size, (args.batch_size, args.prompt_tokens))
    mask = torch.ones_like(prompts)

    def generate() -> float:
        started = time.perf_counter()
        out = model.generate(
            prompts,
            attention_mask=mask,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=config.eos_token_id,
        )
        seconds = time.perf_counter() - started
        assert out.shape == (args.batch_size, args.prompt_tokens + args.new_tokens), out.shape
        return seconds

    generate()  # first-call allocations and kernel choices, as our side's compile is excluded
    times = [generate() for _ in range(args.repeats)]
    ms = [1e3 * t / args.new_tokens for t in times]
    figures = {
        "side": "torch",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "params": sum(p.numel() for p in model.parameters()),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "ms_per_token_median": statistics.median(ms),
        "ms_per_token": ms,
    }
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}: "
        f"{args.dtype} batch {args.batch_size}: {figures['ms_per_token_median']:.1f} ms/token "
        f"(median of {args.repeats}: {', '.join(f'{m:.1f}' for m in ms)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
