"""Attention: causal, grouped-query heads as full heads with each key/value head repeated, sliding
windows (tiled per layer, hiding exactly the tokens before them, static or traced), and rotary
positions (scores that depend only on the distance; no position table)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW
from flax import nnx
from model_reference import (
    MODERN,
    T_CTX,
    C,
    H,
    assert_causal,
    flat_params,
    gpt_cfg,
    np_softmax,
    np_windows,
    randomise,
    tokens,
)

from jaxgpt.model.gpt import build_model
from jaxgpt.model.layers import Rotary
from jaxgpt.ops import select


@pytest.mark.parametrize("t", [0, 5, T_CTX - 1])
def test_causal_without_dropout(t: int) -> None:
    model = build_model(gpt_cfg(), seed=8)
    randomise(model, seed=14)
    assert_causal(lambda x: model(x), t)


# ----------------------------------------------------------------------------- grouped-query heads and windows


def test_grouped_heads_are_full_heads_with_each_key_value_head_repeated() -> None:
    """The same function as a model whose H key/value heads are the K ones each repeated H / K times."""
    cfg = gpt_cfg(**MODERN, n_kv_heads=2, n_layers=2)
    model = build_model(cfg, seed=3)
    randomise(model, seed=11)
    p, idx = flat_params(model), tokens(1)
    full = {k: v for k, v in p.items() if ".attn.q." not in k and ".attn.kv." not in k}
    for i in range(2):
        kv = p[f"blocks.{i}.attn.kv.kernel"].reshape(C, 2, 2, 8)  # (C, k|v, K, D)
        k, v = (np.repeat(kv[:, j], 2, axis=1).reshape(C, C) for j in range(2))  # head h <- K-head h // 2
        full[f"blocks.{i}.attn.qkv.kernel"] = np.concatenate([p[f"blocks.{i}.attn.q.kernel"], k, v], axis=1)
    dense = build_model(dataclasses.replace(cfg, n_kv_heads=H), seed=0)
    nnx.update(
        dense,
        nnx.from_flat_state(
            [
                (path, var.replace(jnp.asarray(full[".".join(map(str, path))], jnp.float32)))
                for path, var in nnx.to_flat_state(nnx.state(dense, nnx.Param))
            ]
        ),
    )
    np.testing.assert_allclose(np.asarray(model(idx)), np.asarray(dense(idx)), atol=1e-5)
    assert np.abs(np.asarray(model(idx))).max() > 1.0


def test_windows_are_tiled_and_the_last_layer_is_always_full() -> None:
    for pattern, layers, short, want in (
        ("SSSL", 6, 4, [4, 4, 4, 16, 4, 16]),
        ("S", 3, 2, [2, 2, 16]),
        ("L", 2, None, [16, 16]),
        ("SL", 5, 7, [7, 16, 7, 16, 7, 16][:4] + [16]),
    ):
        cfg = gpt_cfg(window_pattern=pattern, n_layers=layers, short_window=short)
        assert list(cfg.layer_windows()) == want == np_windows(cfg), (pattern, cfg.layer_windows())
    assert gpt_cfg(window_pattern="SL").layer_windows() == (T_CTX // 4, T_CTX)  # short_window null: a quarter
    assert gpt_cfg().layer_windows() == (T_CTX,) * 2


@pytest.mark.parametrize("kernel", ["xla", "per_head"])
@pytest.mark.parametrize("traced", [pytest.param(False, id="static", marks=SLOW), pytest.param(True, id="traced")])
def test_a_window_hides_exactly_the_tokens_before_it(kernel: str, traced: bool) -> None:
    """ops.attention with grouped heads and a window of 3, static (an unrolled layer's) or traced (a
    scanned one's), against numpy; and a value changed outside a query's window leaves that
    query's output as it was, inside the window it does not."""
    ops = select(gpt_cfg(attention=kernel), "cpu")
    rng = np.random.default_rng(0)
    T, Hq, Kv, D, w = 8, 4, 2, 8, 3
    q = rng.standard_normal((1, T, Hq, D)).astype(np.float32)
    k, v = (rng.standard_normal((1, T, Kv, D)).astype(np.float32) for _ in range(2))
    attend = (
        jax.jit(lambda q, k, v, w: ops.attention(q, k, v, window=w))
        if traced
        else (lambda q, k, v, w: ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), window=w))
    )
    got = np.asarray(attend(q, k, v, jnp.int32(w) if traced else w))  # (1, T, H*D)
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    kk, vv = k[0][:, np.arange(Hq) // 2].transpose(1, 0, 2), v[0][:, np.arange(Hq) // 2].transpose(1, 0, 2)
    scores = np.where((s <= t) & (t - s < w), q[0].transpose(1, 0, 2) @ kk.transpose(0, 2, 1) / np.sqrt(D), -np.inf)
    want = (np_softmax(scores) @ vv).transpose(1, 0, 2).reshape(T, Hq * D)
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    for pos in range(T):
        v2 = v.copy()
        v2[0, pos] += 5.0
        changed = np.abs(np.asarray(attend(q, k, v2, jnp.int32(w) if traced else w))[0] - got[0]).max(-1) > 1e-4
        np.testing.assert_array_equal(changed, (np.arange(T) >= pos) & (np.arange(T) - pos < w), err_msg=str(pos))


# ----------------------------------------------------------------------------- rotary positions


def test_rotary_scores_depend_only_on_the_distance() -> None:
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32) for _ in range(2))
    rotary = jax.jit(Rotary(16, 10000.0).__call__)  # one program per shape, not an op at a time

    def score(m: int, n: int) -> float:
        return float((rotary(q, jnp.array([m])) * rotary(k, jnp.array([n]))).sum())

    for d in (0, 1, 5):
        scores = [score(m + d, m) for m in (0, 3, 11, 40)]
        assert max(scores) - min(scores) <= 1e-4, (d, scores)
    assert abs(score(5, 0) - score(6, 0)) > 1e-3  # and the distance does matter
    # A decode step's (B, 1) positions rotate each row by its own position, as a prefill's (T,) do.
    x = jnp.asarray(rng.standard_normal((3, 1, 2, 16)), jnp.float32)
    rows = rotary(x, jnp.array([[0], [4], [9]]))
    for b, pos in enumerate((0, 4, 9)):
        full = rotary(jnp.broadcast_to(x[b : b + 1], (1, 10, 2, 16)), jnp.arange(10))
        np.testing.assert_allclose(rows[b, 0], full[0, pos], atol=1e-6)


def test_rotary_config_records_its_base_and_has_no_position_table() -> None:
    cfg = gpt_cfg(positions="rotary")
    assert cfg.rope_base == 10000.0  # resolved: the config written beside checkpoints says which base
    assert dataclasses.replace(cfg).rope_base == 10000.0
    assert "pos_emb.embedding" not in flat_params(build_model(cfg))
