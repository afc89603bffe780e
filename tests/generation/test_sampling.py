"""How one token is drawn from logits (generation/sampling.py): top-k and top-p filters, the draw in
proportion, and the top-k draws without a sort (a partition on the host, the device's candidates)
against the sorted one."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.generation.decoder import top_candidates
from jaxgpt.generation.sampling import SamplingParams, filter_logits, sample_from_top, sample_next


def logits_of(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, np.float64))


def kept(logits: np.ndarray, **kw) -> set[int]:
    return set(np.flatnonzero(np.isfinite(filter_logits(logits, **kw))).tolist())


def test_top_k_keeps_exactly_the_k_largest() -> None:
    x = np.array([0.1, 3.0, -2.0, 2.5, 0.7, 2.9])
    assert kept(x, top_k=1) == {1}
    assert kept(x, top_k=3) == {1, 3, 5}
    assert kept(x, top_k=6) == kept(x, top_k=100) == set(range(6))
    ties = np.array([1.0, 2.0, 2.0, 2.0, 0.0])
    assert kept(ties, top_k=2) == {1, 2}  # exactly k: ties go to the lower id
    kept_vals = filter_logits(x, top_k=3)[[1, 3, 5]]
    assert np.array_equal(kept_vals, x[[1, 3, 5]])  # kept logits are untouched


def test_top_p_keeps_the_smallest_nucleus() -> None:
    # Token 2 has 0.5, token 0 0.25, tokens 3 and 1 0.125 each (shuffled on purpose).
    x = logits_of([0.25, 0.125, 0.5, 0.125])
    assert kept(x, top_p=0.01) == {2}  # the most likely token always stays
    assert kept(x, top_p=0.5) == {2}  # exactly reaching top_p is enough
    assert kept(x, top_p=0.51) == {2, 0}
    assert kept(x, top_p=0.75) == {2, 0}
    assert kept(x, top_p=0.76) in ({2, 0, 1}, {2, 0, 3})
    assert kept(x, top_p=0.76) == {2, 0, 1}  # equal probabilities: the lower id first
    assert kept(x, top_p=1.0) == {0, 1, 2, 3}
    # top_k first, then top_p over the renormalised survivors: {2: 2/3, 0: 1/3}.
    assert kept(x, top_k=2, top_p=0.6) == {2}
    assert kept(x, top_k=2, top_p=0.7) == {2, 0}


def test_sampling_draws_only_kept_tokens_in_proportion() -> None:
    x = logits_of([0.25, 0.125, 0.5, 0.125])
    rng = np.random.default_rng(0)
    draws = [sample_next(x, rng, SamplingParams(temperature=1.0, top_p=0.75)) for _ in range(4000)]
    counts = np.bincount(draws, minlength=4) / len(draws)
    assert counts[1] == counts[3] == 0
    assert counts[2] == pytest.approx(2 / 3, abs=0.03) and counts[0] == pytest.approx(1 / 3, abs=0.03)
    assert sample_next(x, rng, SamplingParams(temperature=0.0)) == 2  # temperature 0 is greedy
    assert sample_next(x, rng, SamplingParams(temperature=0.0, allowed_ids=(1, 3))) == 1  # among the allowed


def logit_row(g: np.random.Generator, case: int) -> tuple[int, np.ndarray]:
    """Case `case`'s vocabulary size and float32 logits, drawn from `g`: GPT-2's 50,304 among smaller
    ones, three scales, every third case rounded (many ties, some at the k-th value), every fourth with
    a third of its ids at -inf."""
    V = int(g.choice([7, 50, 1000, 50304]))
    x = (g.standard_normal(V) * g.choice([0.1, 1.0, 5.0])).astype(np.float32)
    if case % 3 == 0:
        x = np.round(x, 1)
    if case % 4 == 0:
        x[g.integers(0, V, V // 3)] = -np.inf
    return V, x


def test_a_top_k_draw_is_the_sorted_filters_draw_from_the_same_generator_state() -> None:
    """sample_next's top-k path (a partition, no sort) draws the token the whole-vocabulary sort and
    Generator.choice draw, and leaves the generator where they leave it: over vocabularies of 7 to
    GPT-2's 50,304, ties at the k-th value, -inf logits, temperatures; a NaN takes the sorting path."""

    def sorted_draw(x: np.ndarray, rng: np.random.Generator, p: SamplingParams) -> int:
        f = filter_logits(np.asarray(x, np.float64) / p.temperature, p.top_k, p.top_p)
        probs = np.exp(f - f.max())
        return int(rng.choice(probs.size, p=probs / probs.sum()))

    g = np.random.default_rng(0)
    for case in range(120):
        V, x = logit_row(g, case)
        params = SamplingParams(temperature=float(g.choice([0.7, 1.0, 1.3])), top_k=int(g.integers(1, min(V, 80))))
        for seed in range(4):
            a, b = np.random.default_rng(seed), np.random.default_rng(seed)
            assert sample_next(x, a, params) == sorted_draw(x, b, params), (case, seed)
            assert a.random() == b.random()  # the same state after the draw
    nan = np.array([1.0, np.nan, 0.5, 2.0], np.float32)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert sample_next(nan, a, SamplingParams(top_k=2)) == sorted_draw(nan, b, SamplingParams(top_k=2))


def test_a_draw_from_the_devices_top_candidates_is_sample_nexts_draw() -> None:
    """sample_from_top, given a row's 64 likeliest tokens as the decoder's step_top chooses them,
    draws sample_next's token from the same generator state and leaves it where sample_next
    does: ties at the k-th value, -inf logits, temperatures, top_k from 1 to 64; where every kept
    logit is -inf it hands the row back (None) with the generator untouched."""
    g = np.random.default_rng(1)
    handed_back = 0
    for case in range(120):
        V, x = logit_row(g, case)
        if case % 29 == 0:
            x[:] = -np.inf
        params = SamplingParams(temperature=float(g.choice([0.7, 1.0, 1.3])), top_k=int(g.integers(1, min(V, 65))))
        values, ids = (np.asarray(a) for a in top_candidates(jnp.asarray(x), min(V, 64)))
        for seed in range(4):
            a, b = np.random.default_rng(seed), np.random.default_rng(seed)
            token = sample_from_top(values, ids, V, a, params)
            if token is None:
                handed_back += 1
                assert np.isneginf(x).all() and a.random() == np.random.default_rng(seed).random()
                continue
            assert token == sample_next(x, b, params), (case, seed)
            assert a.random() == b.random()  # the same state after the draw
    assert handed_back == 4 * 5  # the five all -inf rows, every seed
