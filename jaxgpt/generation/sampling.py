"""How one answer is drawn: the one sampling-parameters type, and the host-side draw of a token.

    params = SamplingParams(max_tokens=64, temperature=0.8, top_k=50, seed=1, stop=("\\n\\n",))
    token = sample_next(logits, rng, params)          # logits: (V,) of the tokenizer's ids only
    token = sample_from_top(values, ids, V, rng, params)  # the same, from a row's top-k candidates
    entry = logprob_entry(logits, token, k=5, offset=0)

Every caller of the engine (chat, judge, evaluation, the server, RL) describes an answer with a
SamplingParams; a bad value is a ValueError of one line naming the parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

ON_FULL = ("stop", "slide")
MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI allows 5; vLLM 20)
_TOP_P_SLACK = 1e-9  # mass this close to top_p counts as reaching it: float rounding adds no token


@dataclass(frozen=True)
class SamplingParams:
    """One answer: how its tokens are drawn and where it ends. temperature 0 is greedy."""

    max_tokens: int = 256  # tokens drawn at most (a stop token included)
    temperature: float = 1.0
    top_k: int | None = None  # keep the k most likely tokens (ties: the lower id)
    top_p: float | None = None  # keep the smallest set of most likely tokens with this much probability
    seed: int = 0  # the row's numpy generator: the same seed gives the same answer
    stop: tuple[str, ...] = ()  # text: the answer is cut before the first one
    stop_ids: frozenset[int] = frozenset()  # tokens that end the answer (end-of-text, a template's end)
    end: tuple[int, ...] = ()  # a chat template's end of several tokens: the answer is cut before it
    allowed_ids: tuple[int, ...] | None = None  # draw among these ids only (multiple choice's letters)
    logprobs: int | None = None  # per token drawn: its logprob and this many alternatives; None: none
    echo: bool = False  # the prompt first: an output with its tokens' logprobs (scored when logprobs is set)
    on_full: Literal["stop", "slide"] = "stop"  # a full context ends the answer, or slides the window

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 0")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k} must be >= 1")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs={self.logprobs} must be in 0..{MAX_LOGPROBS}")
        if self.on_full not in ON_FULL:
            raise ValueError(f"on_full={self.on_full!r} must be one of {', '.join(ON_FULL)}")
        if self.allowed_ids is not None and not self.allowed_ids:
            raise ValueError("allowed_ids is empty: give at least one token id, or None for every id")
        if any(not s for s in self.stop):
            raise ValueError(f"stop={self.stop!r}: a stop string must not be empty")


def filter_logits(logits: np.ndarray, top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """A float64 copy of 1-D logits with every token outside the kept set at -inf.

    top_k keeps exactly the k largest logits (ties go to the lower token id). top_p then keeps the
    smallest set of most likely tokens whose probabilities (renormalised after top_k) add up to
    >= top_p; the most likely token is always kept.
    """
    out = np.array(logits, dtype=np.float64)
    if (top_k is None or top_k >= out.size) and (top_p is None or top_p >= 1.0):
        return out  # nothing to filter: no sort (GPT-2's 50,257 logits take milliseconds to sort)
    order = np.argsort(-out, kind="stable")  # most likely first, ties by lower id
    if top_k is not None and top_k < out.size:
        out[order[top_k:]] = -np.inf
    if top_p is not None and top_p < 1.0:
        ranked = out[order]
        probs = np.exp(ranked - ranked[0])
        probs /= probs.sum()
        mass_before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        out[order[mass_before >= top_p - _TOP_P_SLACK]] = -np.inf
    return out


def sample_next(logits: np.ndarray, rng: np.random.Generator, params: SamplingParams) -> int:
    """One token id from 1-D logits: argmax when temperature is 0, else a filtered softmax draw;
    only among params.allowed_ids when given."""
    if params.allowed_ids is not None:
        masked = np.full(logits.shape, -np.inf)
        allowed = np.asarray(params.allowed_ids)
        masked[allowed] = logits[allowed]
        logits = masked
    if params.temperature <= 0.0:
        return int(np.argmax(logits))
    scaled = np.asarray(logits, np.float64) / params.temperature
    if params.top_k is not None and params.top_k < scaled.size and (params.top_p is None or params.top_p >= 1.0):
        token = _draw_top_k(scaled, params.top_k, rng)
        if token is not None:
            return token
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    probs = np.exp(filtered - filtered.max())
    return int(rng.choice(probs.size, p=probs / probs.sum()))


def _draw_top_k(scaled: np.ndarray, k: int, rng: np.random.Generator) -> int | None:
    """sample_next's top-k draw, the same token from the same generator state, without sorting the
    vocabulary (GPT-2's 50,257 logits: 0.3 ms here against 5.5; an RL step draws 65,536 of them). The
    k kept ids come from a partition (ties at the k-th value go to the lower ids, as the stable sort's);
    the probabilities are the whole vector's (its sum, in numpy's order); the draw is Generator.choice's
    own: one rng.random() against the cumulative sum, run over the kept ids in id order (the ids between
    them add zeros). None (the caller's sort then draws) where a logit is NaN or every kept one is -inf."""
    if np.isnan(scaled).any():
        return None
    n = scaled.size
    kth = np.partition(scaled, n - k)[n - k]  # the k-th largest
    above = np.flatnonzero(scaled > kth)
    kept = np.sort(np.concatenate([above, np.flatnonzero(scaled == kth)[: k - above.size]]))
    return _draw_kept(scaled[kept], kept, n, rng)


def sample_from_top(
    values: np.ndarray, ids: np.ndarray, n: int, rng: np.random.Generator, params: SamplingParams
) -> int | None:
    """sample_next's token, from the same generator state, for params that keep the top_k only
    (temperature > 0, top_k < n, no top_p or allowed_ids), given a row's k' >= top_k most likely ids
    of its n logits and their values, largest first, ties to the lower id (a decode step's
    lax.top_k on the device: the host moves and partitions no (n,) row). None, the generator
    untouched, where sample_next must see the whole row (every kept logit -inf); a row with a NaN
    the caller hands to sample_next itself."""
    k = params.top_k
    assert params.temperature > 0 and k is not None and k <= len(ids) and k < n, (params, len(ids), n)
    order = np.argsort(ids[:k])
    kept = ids[:k][order].astype(np.int64)
    return _draw_kept(np.asarray(values[:k][order], np.float64) / params.temperature, kept, n, rng)


def _draw_kept(scaled: np.ndarray, kept: np.ndarray, n: int, rng: np.random.Generator) -> int | None:
    """The draw among the kept ids (ascending) of n, given their scaled logits: as Generator.choice
    over the whole (n,) vector of probabilities, zeros elsewhere (so its sum is numpy's over n)."""
    top = scaled.max()
    if top == -np.inf:
        return None
    probs = np.zeros(n)
    probs[kept] = np.exp(scaled - top)
    cdf = np.cumsum(probs[kept] / probs.sum())
    cdf /= cdf[-1]
    return int(kept[np.searchsorted(cdf, rng.random(), side="right")])


@dataclass
class TokenLogprob:
    """One token of an answer's (or an echoed prompt's) logprobs: its logprob under the model (None for
    a prompt's first token), the most likely tokens there (ids, logprobs), and its first character's
    offset in the text (the answer's, or the prompt's for an echoed prompt)."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None
    offset: int


def logprob_entry(logits: np.ndarray, token: int, k: int, offset: int) -> TokenLogprob:
    """The token's logprob under the model (before temperature and filters, as vLLM reports) and the
    k most likely tokens. logits: (V,) of the tokenizer's ids."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max()
    logp = shifted - np.log(np.exp(shifted).sum())
    best = np.argpartition(-logp, k)[:k] if 0 < k < logp.size else np.arange(logp.size if k else 0)
    best = best[np.argsort(-logp[best], kind="stable")]
    return TokenLogprob(token, float(logp[token]), [(int(i), float(logp[i])) for i in best], offset)
