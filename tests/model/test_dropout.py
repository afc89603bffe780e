"""Dropout: off without rngs (the numpy reference's output), its masks a function of the key, its
hand-written attention path causal and equal to the fused one, and a rate that changes no parameter."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from model_reference import TOL, L, assert_causal, flat_params, gpt_cfg, np_gpt2, randomise, tokens

from jaxgpt.model.gpt import GPT, build_model


@pytest.fixture(scope="module")
def dropout_model() -> GPT:
    model = build_model(gpt_cfg(drop_rate=0.5, qkv_bias=True), seed=7)
    randomise(model, seed=13)
    return model


def test_causal_with_dropout_path(dropout_model: GPT) -> None:
    # Same dropout key for both inputs: the masks are identical, only the token differs. This
    # covers the hand-written attention path used while dropout is active.
    assert_causal(lambda x: dropout_model(x, nnx.Rngs(dropout=0)), 6)


def test_dropout_is_off_without_rngs(dropout_model: GPT) -> None:
    idx = tokens(4)
    a, b = np.asarray(dropout_model(idx)), np.asarray(dropout_model(idx))
    np.testing.assert_array_equal(a, b)
    # ... and equals the numpy reference, i.e. no hidden scaling or masking at evaluation.
    np.testing.assert_allclose(
        a, np_gpt2(flat_params(dropout_model), dropout_model.cfg, np.asarray(idx)), atol=TOL, rtol=0
    )


def test_dropout_keys(dropout_model: GPT) -> None:
    idx = tokens(5)
    det = np.asarray(dropout_model(idx))
    k0a = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    k0b = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    k1 = np.asarray(dropout_model(idx, nnx.Rngs(dropout=1)))
    np.testing.assert_array_equal(k0a, k0b)  # same key, same masks
    assert np.abs(k0a - k1).max() > 1e-2  # different key, different masks
    assert np.abs(k0a - det).max() > 1e-2  # dropout really is on with rngs
    assert np.all(np.isfinite(k0a))


def test_manual_attention_path_matches_fused(dropout_model: GPT) -> None:
    """With rngs and drop_rate > 0 attention is spelled out by hand. Zero every Dropout's rate
    (the attention module still takes the manual branch) and it must equal the fused path."""
    idx = tokens(6)
    want = np.asarray(dropout_model(idx))
    dropouts = [m for _, m in nnx.iter_graph(dropout_model) if isinstance(m, nnx.Dropout)]
    assert len(dropouts) == 1 + 3 * L  # embedding + (attn, resid, mlp) per block
    try:
        for d in dropouts:
            d.rate = 0.0
        assert all(b.attn.drop_rate > 0 for b in dropout_model.blocks)
        got = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    finally:
        for d in dropouts:
            d.rate = 0.5
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_zero_drop_rate_ignores_rngs() -> None:
    model = build_model(gpt_cfg(drop_rate=0.0), seed=9)
    idx = tokens(7)
    np.testing.assert_array_equal(np.asarray(model(idx, nnx.Rngs(dropout=0))), np.asarray(model(idx)))
    np.testing.assert_array_equal(np.asarray(model(idx, nnx.Rngs(dropout=1))), np.asarray(model(idx)))


def test_drop_rate_does_not_change_params() -> None:
    a = flat_params(build_model(gpt_cfg(drop_rate=0.0), seed=10))
    b = flat_params(build_model(gpt_cfg(drop_rate=0.3), seed=10))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
