"""Smoke test for language models: continue "Every effort moves you" from a checkpoint.

    uv run test_generation.py runs/tiny                          # greedy, 50 new tokens
    uv run test_generation.py runs/tiny --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1 --max-new-tokens 200
    uv run test_generation.py runs/tiny/checkpoints/best --prompt "To be" --prompt "Once upon"   # one batch
    uv run test_generation.py runs/gpt2                          # an imported GPT-2 (import_gpt2.py)

The prompts are drawn together by the generation engine (jaxgpt/generation/: a KV cache and a compiled
one-token step); the last line reports the speed in tokens per second.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxgpt import caches
from jaxgpt.checkpoints.layout import CheckpointError
from jaxgpt.cli import add_sampling_args, check_sampling_args, command_parser, refuse, sampling_params
from jaxgpt.config import ConfigError
from jaxgpt.data.tokenizer import TokenizerError

PROMPT = "Every effort moves you"


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument(
        "--prompt", action="append", default=None, help=f"text to continue; repeat for a batch (default: {PROMPT!r})"
    )
    add_sampling_args(parser)
    args = parser.parse_args(argv)
    check_sampling_args(parser, args)
    prompts = args.prompt or [PROMPT]
    if any(p == "" for p in prompts):
        parser.error("--prompt must not be empty")
    caches.enable_compile_cache()
    from jaxgpt.checkpoints.store import load_model  # JAX starts here, after the checks

    try:
        model, _cfg, tok, path = load_model(args.checkpoint)
    except (ConfigError, CheckpointError, TokenizerError) as e:
        return refuse(e)
    from jaxgpt.generation.engine import Engine

    print(f"Checkpoint: {path}")
    engine = Engine(model, tok, rows=len(prompts))
    params = dataclasses.replace(sampling_params(args), stop_ids=frozenset({tok.eot_id}))
    for prompt, done in zip(prompts, engine.generate([tok.encode(p) for p in prompts], params)):
        print(("\n" if len(prompts) > 1 else "") + prompt + done.text.text)
    print(f"\n[{engine.stats.summary()}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
