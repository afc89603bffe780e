"""`uv run -m bench generate`: sampling speed, the KV cache against the full forward pass per token.

Greedy decoding on a randomly initialised model (GPT-2 124M's shape unless a run's model.json or
--model overrides say otherwise), compilation excluded from both sides.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from config import ModelConfig
from generate import BUCKET, KVDecoder, full_forward_logits
from model import build_model

GPT2_124M = ModelConfig(architecture="gpt2", vocab_size=50257, context_length=1024, emb_dim=768,
                        n_heads=12, n_layers=12, qkv_bias=True, tie_embeddings=True)


def bench_generate(*, new_tokens: int = 256, prompt_tokens: int = 16, batch_size: int = 1,
          cfg: ModelConfig = GPT2_124M, uncached: bool = True, log: Any = print) -> dict[str, float]:
    """Greedy decoding speed, KV cache vs re-running the full forward pass for every token.

    Compilation is excluded from both: the uncached baseline runs one program over a window just
    long enough for the whole generation (prompt + new tokens, rounded up to BUCKET), its best
    case; the cached path is prefill + (new_tokens - 1) decode steps.
    """
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, size=(batch_size, prompt_tokens)).tolist()
    log(f"model: {cfg.n_layers} layers, {cfg.emb_dim} dims, vocab {cfg.vocab_size}, "
        f"{sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) / 1e6:.1f}M params; "
        f"batch {batch_size}, prompt {prompt_tokens}, {new_tokens} new tokens; {jax.devices()[0].platform}")

    dec = KVDecoder(model, batch_size)

    def cached() -> list[np.ndarray]:
        tokens = [dec.prefill(prompts).argmax(-1)]
        for _ in range(new_tokens - 1):
            tokens.append(dec.step(tokens[-1]).argmax(-1))
        return tokens

    cached()  # compiles the prefill bucket and every attention span the run needs
    t0 = time.perf_counter()
    cached_tokens = cached()
    cached_s = time.perf_counter() - t0
    result = {"cached_s": cached_s, "cached_tok_s": new_tokens * batch_size / cached_s,
              "compile_step_s": dec.compile_s}
    log(f"cached:   {cached_s:7.2f} s  {result['cached_tok_s']:8.1f} tok/s  "
        f"({1e3 * cached_s / new_tokens:.1f} ms/token; {len(dec._steps)} decode step program(s) compiled "
        f"in {dec.compile_s:.1f} s)")
    if not uncached:
        return result

    width = min(cfg.context_length, -(-(prompt_tokens + new_tokens) // BUCKET) * BUCKET)
    windows = np.zeros((batch_size, width), np.int32)
    windows[:, :prompt_tokens] = prompts
    last = np.full(batch_size, prompt_tokens - 1)
    full_forward_logits(model, windows, last)  # compile
    t0 = time.perf_counter()
    same = 0
    for i in range(new_tokens):
        nxt = full_forward_logits(model, windows, last).argmax(-1)
        same += int((nxt == cached_tokens[i]).all())
        if i + 1 < new_tokens:
            last = last + 1
            windows[np.arange(batch_size), last] = nxt
    full_s = time.perf_counter() - t0
    result.update(full_s=full_s, full_tok_s=new_tokens * batch_size / full_s, speedup=full_s / cached_s,
                  same_greedy_tokens=same / new_tokens)
    log(f"uncached: {full_s:7.2f} s  {result['full_tok_s']:8.1f} tok/s  (window {width}; "
        f"{1e3 * full_s / new_tokens:.1f} ms/token)")
    log(f"speed-up: {result['speedup']:.1f}x; greedy tokens identical at {same}/{new_tokens} steps")
    return result
