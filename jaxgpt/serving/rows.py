"""The server's KV cache: a fixed number of rows, each prefilled on its own while the others decode.

    dec = RowDecoder(model, rows=16)
    logits = dec.prefill_row(3, prompt_ids)          # (V,) numpy: row 3 restarts from this prompt
    logits = dec.step(tokens, advance=busy)          # (16, V): one token per busy row (KVDecoder.step)
    scores = prompt_logprobs(model, prompt_ids, 5)   # each prompt token's logprob and the top 5 (echo)

A RowDecoder is sampling.KVDecoder (the same cache, decode-step programs and attention spans)
plus `prefill_row`: one prompt, padded to sampling.prefill_length's buckets, through the model's
forward pass with a cache of its own, whose keys and values are then written into one row of the
shared cache in place (the cache is donated). A prefill is then one program per padded length
whatever the other rows hold, and a row's numbers never depend on its neighbours: its prefill is a
batch of one, and every decode step runs the same (rows, span) program, computing each row alone.

`prompt_logprobs` scores a prompt with the model's own forward pass (model.features and its head,
as evaluate.py's scoring does), one program per padded length.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgpt.model.gpt import KVCache, head_logits, head_weight
from jaxgpt.model.sampling import KVDecoder, prefill_length

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI allows 5; vLLM 20)


def _prefill_row(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    last: jax.Array,
    row: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One right-padded prompt (1, P) through the model with a fresh (L, 1, K, D, P) cache, whose
    slots then overwrite slots 0..P-1 of `row` of the shared caches (donated: in place). Slots past
    the prompt hold padding or an earlier request's values: a decode step writes each slot before
    any query reads it. Returns the caches and the (1, V) logits at `last`."""
    model = nnx.merge(graphdef, state)
    L, _, K, D, _ = cache_k.shape
    P = tokens.shape[1]
    small = KVCache(jnp.zeros((L, 1, K, D, P), cache_k.dtype), jnp.zeros((L, 1, K, P, D), cache_v.dtype))
    x, small = model.cached_features(tokens, small)  # (1, P, C)
    cache_k = jax.lax.dynamic_update_slice(cache_k, small.k, (0, row, 0, 0, 0))
    cache_v = jax.lax.dynamic_update_slice(cache_v, small.v, (0, row, 0, 0, 0))
    return cache_k, cache_v, model.logits(x[jnp.arange(1), last])  # (1, V)


def _prefill_row_on_leaves(
    graphdef: nnx.GraphDef,
    treedef: Any,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    last: jax.Array,
    row: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """_prefill_row over the state's leaves (as KVDecoder's steps: no nnx.State to flatten per call)."""
    return _prefill_row(graphdef, jax.tree.unflatten(treedef, leaves), cache_k, cache_v, tokens, last, row)


@dataclass(frozen=True)
class PromptScores:
    """What a prompt's echo reports: for each token after the first, its logprob given the tokens
    before it and the `k` most likely tokens there (ids and logprobs, most likely first)."""

    logprobs: np.ndarray  # (n - 1,) float32
    top_ids: np.ndarray  # (n - 1, k) int32
    top_logprobs: np.ndarray  # (n - 1, k) float32


def _score(
    graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array, n_vocab: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(1, P) ids -> position t's logprob of token t + 1 (P - 1,) and its MAX_LOGPROBS most likely
    next ids and their logprobs (P - 1, MAX_LOGPROBS): the model's forward pass and head, as
    scoring.ending_losses runs them; ids past the tokenizer's n_vocab never rank."""
    model = nnx.merge(graphdef, state)
    x = model.features(tokens)[0, :-1]  # (P-1, C)
    logits = head_logits(model.ops, model.cfg, head_weight(model), x)  # (P-1, V) float32
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[0, 1:, None], axis=-1)[:, 0]
    ranked = jnp.where(jnp.arange(logp.shape[-1]) < n_vocab, logp, -jnp.inf)
    top_logprobs, top_ids = jax.lax.top_k(ranked, min(MAX_LOGPROBS, n_vocab))
    return chosen, top_ids, top_logprobs


def _score_on_leaves(
    graphdef: nnx.GraphDef, treedef: Any, n_vocab: int, leaves: list[jax.Array], tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _score(graphdef, jax.tree.unflatten(treedef, leaves), tokens, n_vocab)


class RowDecoder(KVDecoder):
    """KVDecoder's cache and decode steps for `rows` rows, each row started on its own (prefill_row)."""

    def __init__(self, model: nnx.Module, rows: int, n_vocab: int) -> None:
        super().__init__(model, rows)
        self.n_vocab = n_vocab
        self._prefill_leaves, self._prefill_treedef = jax.tree.flatten(self.state)
        # Echo's logprobs run the model itself, as evaluate.py's scoring does.
        self._scoring_graphdef, scoring = nnx.split(model)
        self._scoring_leaves, self._scoring_treedef = jax.tree.flatten(scoring)
        self._programs: dict[tuple[str, int], Any] = {}  # ("prefill" | "score", padded length) -> compiled

    def _compiled(self, kind: str, length: int) -> Any:
        """The prefill or scoring program for prompts padded to `length`, compiled ahead of time once
        (a call then hashes no graph and flattens no state, as KVDecoder's steps)."""
        if (kind, length) not in self._programs:
            started = time.perf_counter()
            tokens = jnp.zeros((1, length), jnp.int32)
            if kind == "prefill":
                lowered = jax.jit(_prefill_row_on_leaves, static_argnums=(0, 1), donate_argnums=(3, 4)).lower(
                    self.graphdef,
                    self._prefill_treedef,
                    self._prefill_leaves,
                    *self._cache,
                    tokens,
                    jnp.zeros((1,), jnp.int32),
                    jnp.int32(0),
                )
            else:
                lowered = jax.jit(_score_on_leaves, static_argnums=(0, 1, 2)).lower(
                    self._scoring_graphdef, self._scoring_treedef, self.n_vocab, self._scoring_leaves, tokens
                )
            self._programs[kind, length] = lowered.compile()
            self.compile_s += time.perf_counter() - started
        return self._programs[kind, length]

    def prefill_row(self, row: int, prompt: Sequence[int]) -> np.ndarray:
        """Restart `row` from `prompt` (1..context_length ids, positions from 0); returns its
        next-token logits (V,). The other rows keep their caches and lengths."""
        n, ctx = len(prompt), self.cfg.context_length
        if not 0 <= row < self.batch_size or not 1 <= n <= ctx:
            raise ValueError(f"prefill_row: row {row} of {self.batch_size}, a prompt of 1..{ctx} ids, got {n}")
        tokens = np.zeros((1, prefill_length(n, ctx, self.bucket)), np.int32)
        tokens[0, :n] = prompt
        prefill = self._compiled("prefill", tokens.shape[1])
        *self._cache, logits = prefill(
            self._prefill_leaves, *self._cache, jnp.asarray(tokens), jnp.asarray([n - 1], jnp.int32), jnp.int32(row)
        )
        lengths = self.lengths.copy()  # step() replaces the array: never change one it handed out
        lengths[row] = n
        self.lengths = lengths
        return np.asarray(logits[0])

    def prompt_logprobs(self, prompt: Sequence[int], k: int) -> PromptScores:
        """Each prompt token's logprob after the ones before it, and the `k` (<= MAX_LOGPROBS) most
        likely tokens at each position; the prompt is padded to prefill_length's buckets (the
        padding comes after every scored position: it changes nothing)."""
        n, ctx = len(prompt), self.cfg.context_length
        assert 1 <= n <= ctx and 0 <= k <= MAX_LOGPROBS, (n, k)
        tokens = np.zeros((1, prefill_length(n, ctx, self.bucket)), np.int32)
        tokens[0, :n] = prompt
        score = self._compiled("score", tokens.shape[1])
        chosen, top_ids, top_lp = jax.device_get(score(self._scoring_leaves, jnp.asarray(tokens)))
        return PromptScores(chosen[: n - 1], top_ids[: n - 1, :k], top_lp[: n - 1, :k])

    def warm_up(self) -> float:
        """Compile what a first short request runs (a 16-token prefill, the shortest span's step,
        a 16-token echo); longer prompts and spans compile when first needed. Returns the seconds."""
        started = time.perf_counter()
        self.prefill_row(0, [0])
        self.prompt_logprobs([0, 0], 1)
        self.step(np.zeros(self.batch_size, np.int32), np.zeros(self.batch_size, bool))
        self.lengths = np.zeros(self.batch_size, np.int64)
        return time.perf_counter() - started
