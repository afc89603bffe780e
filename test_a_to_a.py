"""Smoke test for A-to-A models: feed a stanza, print the argmax output; it should be the input.

    uv run test_a_to_a.py runs/a-to-a                 # the run's latest checkpoint
    uv run test_a_to_a.py runs/a-to-a/checkpoints/best

Exits 0 when the output reproduces the input exactly, 1 when it does not, 2 on bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxgpt import caches
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.checkpoints.store import load_model
from jaxgpt.cli import refuse
from jaxgpt.config import ConfigError
from jaxgpt.data.tokenizer import TokenizerError

# The Rime of the Ancient Mariner (Coleridge, 1798), first stanza.
STANZA = """It is an ancient Mariner,
And he stoppeth one of three.
'By thy long grey beard and glittering eye,
Now wherefore stopp'st thou me?"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument("--text", default=STANZA, help="text to feed instead of the stanza")
    args = parser.parse_args(argv)
    caches.enable_compile_cache()
    try:
        model, cfg, tok, path = load_model(args.checkpoint)
    except (ConfigError, ckpt.CheckpointError, TokenizerError) as e:
        return refuse(e)
    ids = tok.encode(args.text)
    out: list[int] = []
    for start in range(0, len(ids), cfg.context_length):  # A-to-A has no context: chunks are exact
        chunk = jnp.asarray([ids[start : start + cfg.context_length]], jnp.int32)  # (1, T)
        out.extend(np.asarray(model(chunk)[0].argmax(-1)).tolist())
    output = tok.decode(out)
    print(f"Checkpoint: {path}\n\nInput:\n{args.text}\n\nOutput (argmax):\n{output}\n")
    same = out == ids
    print(
        "Reproduced exactly."
        if same
        else f"Not reproduced: {sum(a != b for a, b in zip(out, ids))} of {len(ids)} tokens differ."
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
