"""Muon as the 2026 recipe runs it (muon.py): Polar Express's per-iteration coefficients and NorMuon's
per-neuron scale, against numpy written from the papers (and nanochat's optim.py); grouped-query
attention's kv kernel orthogonalised as two matrices; the state a checkpoint keeps for each setting.
"""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, cases
from flax import nnx
from test_muon import MODEL, MUON, TOTAL, flat_names, params_np, random_grads, train_cfg

from jaxgpt.config import ConfigError, MuonConfig
from jaxgpt.model.gpt import build_model
from jaxgpt.training import muon
from jaxgpt.training.optimizer import make_schedule, make_transform

# The paper's five iterations (Amsel et al. 2025, Polar Express; safety factor 2e-2, cushion 2), as
# nanochat's optim.py lists them.
POLAR = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
         (4.042929935166739, -2.808917465908714, 0.5000178451051316),
         (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
         (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
         (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]
GQA = replace(MODEL, n_heads=4, n_kv_heads=2, emb_dim=16, qkv_bias=False)


def polar_numpy(g: np.ndarray, steps: int = 5) -> np.ndarray:
    """Polar Express on one (in, out) matrix, float64: Frobenius-normalise, then iteration i's quintic
    a X + (b S + c S^2) X on the wide orientation."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-8)
    for a, b, c in POLAR[:steps]:
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def normuon_numpy(o: np.ndarray, v: np.ndarray, beta2: float) -> tuple[np.ndarray, np.ndarray]:
    """NorMuon on one orthogonalised (in, out) matrix: the mean square along the shorter side (one
    figure per row of the longer), its running mean v, o / sqrt(v), scaled back to |o|."""
    axis = 0 if o.shape[1] >= o.shape[0] else 1
    v = beta2 * v + (1 - beta2) * (o * o).mean(axis=axis, keepdims=True)
    scaled = o / np.sqrt(np.maximum(v, 1e-10))
    return scaled * np.linalg.norm(o) / np.linalg.norm(scaled), v


def split(name: str, x: np.ndarray, width: int) -> list[np.ndarray]:
    """The (in, out) matrices Muon sees in a leaf: one per layer if stacked, fused ones apart."""
    layers = list(x) if x.ndim == 3 else [x]
    fused = 3 if name.endswith("qkv.kernel") else 2 if name.endswith(".kv.kernel") else 1
    return [m for layer in layers for m in np.split(layer, fused, axis=-1)]


def join(name: str, like: np.ndarray, mats: list[np.ndarray]) -> np.ndarray:
    fused = 3 if name.endswith("qkv.kernel") else 2 if name.endswith(".kv.kernel") else 1
    per_layer = [np.concatenate(mats[i:i + fused], axis=-1) for i in range(0, len(mats), fused)]
    return np.stack(per_layer) if like.ndim == 3 else per_layer[0]


def routed(model: nnx.Module) -> dict[str, muon.Route]:
    return flat_names(muon.routes(model))


@pytest.mark.parametrize("cfg", cases({"qkv": MODEL, "gqa": GQA, "gqa-scan": replace(GQA, scan_layers=True)},
                                       fast={"gqa-scan"}))
@pytest.mark.parametrize("normuon", [pytest.param(False, id="polar", marks=SLOW),
                                     pytest.param(True, id="polar-normuon")])
def test_first_step_of_polar_express_and_normuon_matches_numpy(cfg, normuon: bool) -> None:
    """One optimiser step (k = 1) of the whole chain: the matrices' update is Polar Express's (then
    NorMuon's, whose running mean starts at 0: v = (1 - beta2) ms), width-scaled, decayed, at the
    step-0 rate; q, k, v (or the kv kernel's k and v) and the layers each on their own."""
    m = replace(MUON, coefficients="polar_express", normuon=normuon, normuon_beta2=0.8)
    train = train_cfg(gradient_accumulation_steps=1, muon=m)
    model = build_model(cfg, seed=0)
    opt = nnx.Optimizer(model, make_transform(train, TOTAL, muon.routes(model)), wrt=nnx.Param)
    init, grads = params_np(model), random_grads(model, 3)
    nnx.jit(lambda model, opt, g: opt.update(model, g))(model, opt, grads)
    got, g = params_np(model), {n: np.asarray(v.get_value(), np.float64) for n, v in flat_names(grads).items()}
    lr = float(make_schedule(train, TOTAL)(0))
    checked = 0
    for name, route in routed(model).items():
        if route.part != "muon":
            continue
        mats = []
        for x in split(name, g[name], cfg.emb_dim):
            o = polar_numpy(x)
            if normuon:
                o, _ = normuon_numpy(o, 0.0, 0.8)
            mats.append(o * math.sqrt(max(1.0, x.shape[1] / x.shape[0])))
        want = init[name] - lr * (join(name, g[name], mats) + m.weight_decay * init[name])
        np.testing.assert_allclose(got[name], want, rtol=0, atol=3e-6, err_msg=name)
        checked += 1
    assert checked == (4 if cfg.n_kv_heads in (None, cfg.n_heads) else 5) * (1 if cfg.scan_layers else cfg.n_layers)


def test_normuon_keeps_a_running_mean_per_neuron() -> None:
    """scale_by_neuron_rms alone over two updates: the second divides by the running mean of both
    steps' mean squares (beta2 0.8), per row of the longer side, q, k and v each their own."""
    model = build_model(MODEL, seed=0)
    routing = muon.routes(model)
    muon_only = jax.tree.map(lambda r: r.part == "muon", routing)
    params = nnx.state(model, nnx.Param)
    view = lambda t: muon._over(muon._view, routing, t)  # noqa: E731 - the layout scale_by_muon hands over
    unview = lambda t: muon._over(muon._unview, routing, t)  # noqa: E731
    tx = optax_masked(muon.scale_by_neuron_rms(routing, 0.8), muon_only)
    state = tx.init(view(params))
    us = [random_grads(model, s) for s in (5, 6)]
    outs = []
    for u in us:
        out, state = tx.update(view(u), state)
        outs.append({n: np.asarray(v.get_value() if hasattr(v, "get_value") else v)
                     for n, v in flat_names(unview(out)).items()})
    for name, route in flat_names(routing).items():
        if route.part != "muon":
            continue
        u1, u2 = (split(name, np.asarray(flat_names(u)[name].get_value(), np.float64), 16) for u in us)
        for i, (a, b) in enumerate(zip(u1, u2)):
            o1, v = normuon_numpy(a, 0.0, 0.8)
            o2, v = normuon_numpy(b, v, 0.8)
            np.testing.assert_allclose(split(name, outs[0][name], 16)[i], o1, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(split(name, outs[1][name], 16)[i], o2, atol=1e-5, err_msg=name)
            assert np.linalg.norm(o2) == pytest.approx(np.linalg.norm(b), rel=1e-6)


def optax_masked(tx, mask):
    """tx on the muon leaves only, as optax.partition hands them over (MaskedNode elsewhere)."""
    import optax

    return optax.masked(tx, mask)


def test_the_state_has_each_settings_layout() -> None:
    """Standard coefficients keep the one (3,) row a checkpoint of an earlier run holds; Polar
    Express keeps its 5 x 3; NorMuon adds a (.., 1, out) or (.., in, 1) second moment per matrix leaf."""
    def state(m: MuonConfig) -> dict[str, tuple[int, ...]]:
        model = build_model(MODEL, seed=0)
        opt = nnx.Optimizer(model, make_transform(train_cfg(muon=m), TOTAL, muon.routes(model)), wrt=nnx.Param)
        leaves = jax.tree_util.tree_flatten_with_path(nnx.as_pure(opt.opt_state))[0]
        return {jax.tree_util.keystr(p, simple=True, separator="."): tuple(jnp.shape(v)) for p, v in leaves}

    plain, polar, normed = state(MUON), state(replace(MUON, coefficients="polar_express")), \
        state(replace(MUON, normuon=True))
    coeffs = lambda s: [v for k, v in s.items() if k.endswith("ns_coeffs")]  # noqa: E731
    assert coeffs(plain) == [(3,)] and coeffs(polar) == [(5, 3)] and coeffs(normed) == [(3,)]
    moments = {k: v for k, v in normed.items() if "second_moment" in k}
    assert set(polar) == set(plain) and len(moments) == 4 * MODEL.n_layers
    assert moments[next(k for k in moments if k.endswith("blocks.0.attn.qkv.kernel"))] == (1, 3, 16)  # (C, 3, C) view
    assert moments[next(k for k in moments if k.endswith("blocks.0.mlp.fc.kernel"))] == (1, 64)  # 16 -> 64: per out
    assert moments[next(k for k in moments if k.endswith("blocks.0.mlp.out.kernel"))] == (64, 1)  # 64 -> 16: per in


def test_polar_express_has_five_iterations() -> None:
    with pytest.raises(ConfigError, match=r"ns_steps=6 with coefficients='polar_express'") as e:
        MuonConfig(coefficients="polar_express", ns_steps=6)
    assert "\n" not in str(e.value)
    assert [tuple(r) for r in muon.POLAR_EXPRESS] == POLAR
    MuonConfig(coefficients="polar_express", ns_steps=3)  # fewer: the first three


def test_gqa_kv_kernel_is_orthogonalised_as_two_matrices() -> None:
    model = build_model(GQA, seed=0)
    table = muon.routing_table(model, muon.routes(model))
    assert "blocks.*.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"]
    assert "blocks.*.attn.q.kernel" in table["muon"]["names"]
    assert jnp.shape(muon._view(routed(model)["blocks.0.attn.kv.kernel"],
                                params_np(model)["blocks.0.attn.kv.kernel"])) == (16, 2, 8)
