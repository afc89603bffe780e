"""Smoke test for language models: continue "Every effort moves you" from a checkpoint.

    uv run test_generation.py runs/tiny                          # greedy, 50 new tokens
    uv run test_generation.py runs/tiny --temperature 0.8 --top-k 40 --seed 1 --max-new-tokens 200
    uv run test_generation.py runs/tiny/checkpoints/best --prompt "To be"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import checkpointing as ckpt
from config import ConfigError
from generate import add_sampling_args, check_sampling_args, continuation, load_model
from tokenizer import TokenizerError

PROMPT = "Every effort moves you"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument("--prompt", default=PROMPT)
    add_sampling_args(parser)
    args = parser.parse_args(argv)
    check_sampling_args(parser, args)
    try:
        model, _cfg, tok, path = load_model(args.checkpoint)
    except (ConfigError, ckpt.CheckpointError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Checkpoint: {path}")
    print(args.prompt + continuation(model, tok, args.prompt, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
