"""QK-norm and rotary on the heads side by side (`Ops.qk_lanes`: layers.norm_lanes, Rotary.lanes): the
same numbers as on (B, T, H, D) heads, in a layer, a model against the numpy reference, its gradients
and a KV-cached decode. A TPU lays a 64-wide head in half a lane tile; whether the lane form is faster
there is measured on the chip (docs/log.md), not here: here it must only compute the same."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cases
from flax import nnx
from model_reference import (
    ALL_NEW,
    MODERN,
    TOL,
    equations,
    flat_params,
    forward,
    gpt_cfg,
    np_modern,
    randomise_all,
    square_loss_grads,
    tokens,
)

from jaxgpt.generation import decoder as g
from jaxgpt.model.gpt import build_model
from jaxgpt.model.layers import Identity, Rotary, make_norm, norm_lanes
from jaxgpt.ops.select import select

B, T, N, D = 2, 12, 3, 8


def test_rotary_on_lanes_is_the_heads_rotation() -> None:
    """The same products and sums; XLA may fuse them into other multiply-adds: within float32 rounding."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((B, T, N * D)) * 3, jnp.float32)
    rotary = Rotary(D, 100.0)
    for positions in (jnp.arange(T) + 5, jnp.asarray(rng.integers(0, 50, (B, T))), jnp.asarray([[7], [30]])):
        xs = x[:, : positions.shape[-1]] if positions.shape[-1] == 1 else x
        want = jax.jit(rotary.__call__)(xs.reshape(*xs.shape[:2], N, D), positions).reshape(xs.shape)
        got = jax.jit(rotary.lanes)(xs, positions)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
        assert np.abs(np.asarray(got) - np.asarray(xs)).max() > 1  # rotated, not passed through


@pytest.mark.parametrize(
    "norm, scale",
    [("rmsnorm", False), ("rmsnorm", True), ("layernorm", True), ("layernorm", False)],
    ids=["rms", "rms-scale", "layernorm-scale-bias", "layernorm"],
)
def test_norm_on_lanes_is_each_heads_norm(norm: str, scale: bool) -> None:
    cfg = gpt_cfg(norm=norm, norm_scale=scale, bias=True)
    with nnx.use_eager_sharding(False):  # as build_model makes it
        module = make_norm(cfg, D, nnx.Rngs(0))
    rng = np.random.default_rng(1)
    for name in ("scale", "bias"):  # learned values away from 1 and 0, different per lane of a head
        if getattr(module, name, None) is not None:
            getattr(module, name).set_value(jnp.asarray(rng.uniform(0.5, 1.5, D), jnp.float32))
    # heads of different sizes and offsets: a statistic taken over the wrong lanes is far off
    x = jnp.asarray(
        rng.standard_normal((B, T, N, D)) * rng.uniform(0.1, 10, (1, 1, N, 1)) + rng.standard_normal((1, 1, N, 1)) * 4,
        jnp.float32,
    )
    want = np.asarray(module(x)).reshape(B, T, N * D)
    got = np.asarray(jax.jit(lambda a: norm_lanes(module, a, D))(x.reshape(B, T, N * D)))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert norm_lanes(Identity(), x, D) is x


def heads_model(cfg, seed: int) -> nnx.Module:
    """QK-norm and rotary on the heads, whatever the backend's default (a TPU's is lanes for heads under 128)."""
    return build_model(cfg, seed, ops=dataclasses.replace(select(cfg), qk_lanes=False))


def lanes_twin(model: nnx.Module) -> nnx.Module:
    """The same weights, QK-norm and rotary on lanes."""
    twin = build_model(model.cfg, ops=dataclasses.replace(select(model.cfg), qk_lanes=True))
    nnx.update(twin, nnx.state(model, nnx.Param))
    return twin


def shapes(jaxpr: jax_core.Jaxpr) -> set[tuple[int, ...]]:
    """Every shape a program's equations make, in its sub-programs (a scan's body) too."""
    return {tuple(v.aval.shape) for eqn, _ in equations(jaxpr) for v in eqn.outvars}


OPTIONS = {
    "modern": {**MODERN, "logit_softcap": 3.0},
    "layernorm-biases-qk-norm": {**MODERN, "norm": "layernorm", "bias": True, "qkv_bias": True},
    "2026": {**MODERN, **ALL_NEW, "logit_softcap": 3.0},  # grouped heads: keys on fewer lanes than queries
    "2026-scan-remat": {**MODERN, **ALL_NEW, "scan_layers": True, "remat": True},
}


@pytest.mark.parametrize("kw", cases(OPTIONS, fast={"layernorm-biases-qk-norm", "2026"}))
def test_a_model_on_lanes_is_the_reference_and_the_heads_model_with_its_gradients(kw: dict) -> None:
    model = heads_model(gpt_cfg(**kw), seed=3)
    randomise_all(model, seed=11)
    twin, idx = lanes_twin(model), tokens(1)
    # the heads' rotation slices (..., heads, D/2) halves; the lanes' never make one
    half = (model.cfg.n_kv_heads or model.cfg.n_heads, model.cfg.emb_dim // model.cfg.n_heads // 2)
    made = {m: {s[-2:] for s in shapes(jax.make_jaxpr(lambda: m(idx))().jaxpr)} for m in (model, twin)}
    assert half in made[model] and half not in made[twin]
    got, heads = np.asarray(forward(twin, idx)), np.asarray(forward(model, idx))
    if not model.cfg.scan_layers:  # the reference reads per-layer weights; the scanned model is the heads one's
        np.testing.assert_allclose(got, np_modern(flat_params(model), model.cfg, np.asarray(idx)), atol=TOL, rtol=0)
    np.testing.assert_allclose(got, heads, atol=1e-5 * np.abs(heads).max(), rtol=0)

    def grads(m: nnx.Module) -> dict:
        return {".".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(square_loss_grads(m, idx))}

    ours, theirs = grads(twin), grads(model)
    assert ours.keys() == theirs.keys() and any("q_norm" in k or "qkv" in k for k in ours)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], atol=1e-4 * np.abs(theirs[k]).max() + 1e-12, rtol=0, err_msg=k)


def test_a_kv_cached_decode_on_lanes_gives_the_heads_decodes_logits() -> None:
    """A decode step's one position a row, (B, 1) positions: the lanes' tables tile per row."""
    model = heads_model(gpt_cfg(**MODERN, **ALL_NEW), seed=3)
    randomise_all(model, seed=11)
    runs = []
    twin = lanes_twin(model)
    assert g.decoding_model(twin, 2).ops.qk_lanes  # the decoder's copy keeps the form
    for m in (model, twin):
        dec = g.KVDecoder(m, 2)
        logits = [dec.prefill([[1, 2, 3], [4, 5]])]
        for t in range(4):
            logits.append(dec.step([6 + t, 7 + t], advance=np.array([True, t % 2 == 0])))
        runs.append(np.stack(logits))
    np.testing.assert_allclose(runs[1], runs[0], atol=1e-5 * np.abs(runs[0]).max(), rtol=0)
    assert np.abs(runs[0]).max() > 1


def test_a_tpu_puts_heads_narrower_than_a_lane_tile_on_lanes_and_no_other_backend_does() -> None:
    """The chip's timing (docs/log.md, eighth session): 64-wide heads ran faster on lanes (the modern
    recipe's step 284.5 ms against 303.7), 128-wide ones slower (the 2026 recipe's 6 heads)."""
    for emb_dim, n_heads, lanes in ((768, 12, True), (768, 6, False), (64, 2, True), (1024, 8, False)):
        cfg = gpt_cfg(**MODERN, emb_dim=emb_dim, n_heads=n_heads, context_length=256)
        assert select(cfg, "tpu").qk_lanes is lanes, (emb_dim, n_heads)
        assert not select(cfg, "cpu").qk_lanes and not select(cfg, "gpu").qk_lanes
