"""optimizer "muon"'s update (muon.py, optimizer.py) against numpy: the first step part by part
(Muon with Newton-Schulz for the matrices, q/k/v and stacked layers orthogonalised apart, AdamW and
Adam for the rest), Polar Express's per-iteration coefficients and NorMuon's per-neuron scale
(written from the papers and nanochat's optim.py); the logged rates and momentum; a non-finite
microbatch skipped; the state each setting keeps.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, cases
from flax import nnx
from muon_helpers import (
    GQA,
    MODEL,
    MUON,
    TOTAL,
    abstract_optimizer,
    expected_part,
    flat_names,
    join,
    matrices,
    params_np,
    random_grads,
    routed,
    train_cfg,
)

from jaxgpt.config import ConfigError, MuonConfig, TrainConfig
from jaxgpt.model.gpt import build_model
from jaxgpt.training import muon
from jaxgpt.training.optimizer import make_schedule, make_transform, optimizer_stats, part_rates

NS = (3.4445, -4.775, 2.0315)  # Newton-Schulz coefficients (optax's and Keller Jordan's default)

# ----------------------------------------------------------------------------- Newton-Schulz, AdamW, Adam


@nnx.jit
def jit_update(model: nnx.Module, opt: nnx.Optimizer, grads: nnx.State) -> None:
    opt.update(model, grads)


def quintic_numpy(g: np.ndarray, coefficients: list[tuple[float, float, float]]) -> np.ndarray:
    """Muon's orthogonalisation of one (in, out) matrix, in float64: Frobenius-normalise, then one
    quintic a X + (b S + c S^2) X per (a, b, c) on the wide orientation."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-8)
    for a, b, c in coefficients:
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def ns_numpy(g: np.ndarray) -> np.ndarray:
    """Five Newton-Schulz steps, each with the same coefficients."""
    return quintic_numpy(g, [NS] * 5)


def first_step_numpy(train: TrainConfig, params: dict, grads: dict) -> dict[str, np.ndarray]:
    """The parameters after the first optimiser step, part by part (each at its step-0 rate)."""
    m, eps, wd = train.muon, train.adam_eps, train.weight_decay
    lr = {
        part: float(make_schedule(train, TOTAL, peak)(0))
        for part, peak in {
            "muon": train.learning_rate,
            "embed": m.embed_learning_rate,
            "head": m.head_learning_rate,
            "scalar": m.scalar_learning_rate,
        }.items()
    }
    out = {}
    for name, p in params.items():
        g, part = grads[name].astype(np.float64), expected_part(name)
        if part == "muon":  # the momentum's scale drops out of the orthogonalisation at step 1
            mats = [ns_numpy(x) * math.sqrt(max(1.0, x.shape[1] / x.shape[0])) for x in matrices(name, g)]
            update = join(name, g, mats) + m.weight_decay * p
        else:  # Adam's first step: the bias-corrected moments are g and g^2
            update = g / (np.abs(g) + eps) + (wd * p if part != "scalar" else 0.0)
        out[name] = p - lr[part] * update
    return out


@pytest.fixture(scope="module")
def stepped() -> dict:
    """A muon optimiser (k=2) through: a non-finite microbatch, then two windows of two random
    gradients each, recording parameters and statistics along the way."""
    train = train_cfg()
    model = build_model(MODEL, seed=0)
    opt = nnx.Optimizer(model, make_transform(train, TOTAL, muon.routes(model)), wrt=nnx.Param)
    out = {"train": train, "model": model, "init": params_np(model), "stats": [optimizer_stats(opt)]}
    nan = jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), random_grads(model, 0))
    jit_update(model, opt, nan)
    out["after_nan"], out["nan_stats"] = params_np(model), optimizer_stats(opt)
    out["grads"] = [random_grads(model, s) for s in (1, 2, 3, 4)]
    for i, g in enumerate(out["grads"]):
        jit_update(model, opt, g)
        if i % 2:
            out["stats"].append(optimizer_stats(opt))
            out.setdefault("params", []).append(params_np(model))
    return out


def test_first_step_matches_numpy_part_by_part(stepped: dict) -> None:
    """Muon (momentum, q/k/v apart, width scale, its own decay) for the matrices, AdamW for the
    embeddings and the head, Adam for norms and biases, each at its own rate; the window of two
    microbatches is their mean, as MultiSteps promises."""
    g1, g2 = (flat_names(g) for g in stepped["grads"][:2])
    mean = {n: (np.asarray(g1[n].get_value()) + np.asarray(g2[n].get_value())) / 2 for n in g1}
    want = first_step_numpy(stepped["train"], stepped["init"], mean)
    got = stepped["params"][0]
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=0, atol=2e-6, err_msg=name)
    moved = {
        part: max(np.abs(got[n] - stepped["init"][n]).max() for n in got if expected_part(n) == part)
        for part in muon.PARTS
    }
    assert all(v > 1e-4 for v in moved.values()), moved


def test_muon_updates_are_orthogonal_per_matrix(stepped: dict) -> None:
    train, init, got = stepped["train"], stepped["init"], stepped["params"][0]
    lr = float(make_schedule(train, TOTAL)(0))
    for name in (n for n in got if expected_part(n) == "muon"):
        # update = -lr * (scale * O + wd * p): recover O, the orthogonalised momentum
        o = (init[name] - got[name]) / lr - train.muon.weight_decay * init[name]
        for mat in matrices(name, o):
            sv = np.linalg.svd(mat / math.sqrt(max(1.0, mat.shape[1] / mat.shape[0])), compute_uv=False)
            assert 0.5 < sv.min() and sv.max() < 1.5, (name, sv)  # Newton-Schulz: ~U V^T, sv in ~[0.7, 1.2]
        if name.endswith("qkv.kernel"):  # three orthogonal blocks side by side: the whole is not
            whole = np.linalg.svd(o, compute_uv=False)
            assert whole.mean() > 1.4, whole  # ~sqrt(3)


@SLOW  # a second optimiser compiled for the stacked layout
def test_scan_layers_are_orthogonalised_layer_by_layer() -> None:
    """Stacked (L, ...) leaves: each layer's matrices on their own, not the stack as one matrix."""
    cfg = replace(MODEL, n_layers=3, scan_layers=True)
    train = train_cfg(gradient_accumulation_steps=1)
    model = build_model(cfg, seed=0)
    opt = nnx.Optimizer(model, make_transform(train, TOTAL, muon.routes(model)), wrt=nnx.Param)
    init, g = params_np(model), random_grads(model, 7)
    jit_update(model, opt, g)
    want = first_step_numpy(train, init, {n: np.asarray(v.get_value()) for n, v in flat_names(g).items()})
    for name, value in params_np(model).items():
        np.testing.assert_allclose(value, want[name], rtol=0, atol=2e-6, err_msg=name)
    assert params_np(model)["blocks.attn.qkv.kernel"].shape == (3, 16, 48)


def test_logged_rates_follow_the_schedules(stepped: dict) -> None:
    """optimizer_stats: "learning_rate" is the matrices' rate, each other part's under its own name,
    and the momentum warms up: each as the update at that step used it."""
    m = MUON
    peak = {
        "muon": 0.02,
        "embed": m.embed_learning_rate,
        "head": m.head_learning_rate,
        "scalar": m.scalar_learning_rate,
    }

    def lr(part: str, t: int) -> float:  # 2 warm-up steps from 0.1 x peak, then cosine to 0.1 x peak
        if t < 2:
            return peak[part] * (0.1 + 0.9 * t / 2)
        return peak[part] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 2) / (TOTAL - 2))))

    for t, stats in enumerate(stepped["stats"]):  # after 0, 1, 2 applied steps: the rate of step t
        rates = part_rates({k: np.asarray(v) for k, v in stats.items()})
        for part in muon.PARTS:
            assert rates[part] == pytest.approx(lr(part, max(t - 1, 0)), rel=1e-5), (part, t)
        assert float(stats["momentum"]) == pytest.approx(0.85 + 0.1 * max(t - 1, 0) / 4, rel=1e-6)
        assert float(stats["learning_rate"]) == rates["muon"]
    assert int(stepped["stats"][-1]["gradient_step"]) == 2
    assert set(stepped["stats"][0]) == {
        "learning_rate",
        "grad_norm",
        "gradient_step",
        "mini_step",
        "notfinite_count",
        "total_notfinite",
        "embed_learning_rate",
        "head_learning_rate",
        "scalar_learning_rate",
        "momentum",
    }


def test_a_non_finite_microbatch_is_skipped(stepped: dict) -> None:
    for name, value in stepped["init"].items():
        np.testing.assert_array_equal(stepped["after_nan"][name], value, err_msg=name)
    s = stepped["nan_stats"]
    assert (int(s["notfinite_count"]), int(s["total_notfinite"]), int(s["mini_step"]), int(s["gradient_step"])) == (
        1,
        1,
        0,
        0,
    )
    last = stepped["stats"][-1]
    assert (int(last["notfinite_count"]), int(last["total_notfinite"])) == (0, 1)
    assert all(np.all(np.isfinite(v)) for v in stepped["params"][-1].values())


def test_adamw_stats_are_unchanged() -> None:
    opt = nnx.eval_shape(lambda: abstract_optimizer(TrainConfig(microbatch_size=2, train_steps=TOTAL)))
    stats = optimizer_stats(opt)
    assert set(stats) == {
        "learning_rate",
        "grad_norm",
        "gradient_step",
        "mini_step",
        "notfinite_count",
        "total_notfinite",
    }
    assert part_rates({"learning_rate": np.float32(6e-4)}) == {"adamw": pytest.approx(6e-4)}


# ----------------------------------------------------------------------------- Polar Express and NorMuon

# The paper's five iterations (Amsel et al. 2025, Polar Express; safety factor 2e-2, cushion 2), as
# nanochat's optim.py lists them.
POLAR = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def polar_numpy(g: np.ndarray, steps: int = 5) -> np.ndarray:
    """Polar Express: iteration i with its own coefficients."""
    return quintic_numpy(g, POLAR[:steps])


def normuon_numpy(o: np.ndarray, v: np.ndarray, beta2: float) -> tuple[np.ndarray, np.ndarray]:
    """NorMuon on one orthogonalised (in, out) matrix: the mean square along the shorter side (one
    figure per row of the longer), its running mean v, o / sqrt(v), scaled back to |o|."""
    axis = 0 if o.shape[1] >= o.shape[0] else 1
    v = beta2 * v + (1 - beta2) * (o * o).mean(axis=axis, keepdims=True)
    scaled = o / np.sqrt(np.maximum(v, 1e-10))
    return scaled * np.linalg.norm(o) / np.linalg.norm(scaled), v


@pytest.mark.parametrize(
    "cfg", cases({"qkv": MODEL, "gqa": GQA, "gqa-scan": replace(GQA, scan_layers=True)}, fast={"gqa-scan"})
)
@pytest.mark.parametrize(
    "normuon", [pytest.param(False, id="polar", marks=SLOW), pytest.param(True, id="polar-normuon")]
)
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
        for x in matrices(name, g[name]):
            o = polar_numpy(x)
            if normuon:
                o, _ = normuon_numpy(o, 0.0, 0.8)
            mats.append(o * math.sqrt(max(1.0, x.shape[1] / x.shape[0])))
        want = init[name] - lr * (join(name, g[name], mats) + m.weight_decay * init[name])
        np.testing.assert_allclose(got[name], want, rtol=0, atol=3e-6, err_msg=name)
        checked += 1
    assert checked == (4 if cfg.n_kv_heads in (None, cfg.n_heads) else 5) * (1 if cfg.scan_layers else cfg.n_layers)


@SLOW  # (the fast tier checks NorMuon's update through the first step's polar-normuon case)
def test_normuon_keeps_a_running_mean_per_neuron() -> None:
    """scale_by_neuron_rms alone over two updates: the second divides by the running mean of both
    steps' mean squares (beta2 0.8), per row of the longer side, q, k and v each their own."""
    model = build_model(MODEL, seed=0)
    routing = muon.routes(model)
    muon_only = jax.tree.map(lambda r: r.part == "muon", routing)
    params = nnx.state(model, nnx.Param)

    def view(t: Any) -> Any:  # a pytree either way
        return muon._over(muon._view, routing, t)

    def unview(t: Any) -> Any:
        return muon._over(muon._unview, routing, t)

    tx = optax_masked(muon.scale_by_neuron_rms(routing, 0.8), muon_only)
    state = tx.init(view(params))
    us = [random_grads(model, s) for s in (5, 6)]
    outs = []
    for u in us:
        out, state = tx.update(view(u), state)
        outs.append(
            {n: np.asarray(v.get_value() if hasattr(v, "get_value") else v) for n, v in flat_names(unview(out)).items()}
        )
    for name, route in flat_names(routing).items():
        if route.part != "muon":
            continue
        u1, u2 = (matrices(name, np.asarray(flat_names(u)[name].get_value(), np.float64)) for u in us)
        for i, (a, b) in enumerate(zip(u1, u2)):
            o1, v = normuon_numpy(a, 0.0, 0.8)
            o2, v = normuon_numpy(b, v, 0.8)
            np.testing.assert_allclose(matrices(name, outs[0][name])[i], o1, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(matrices(name, outs[1][name])[i], o2, atol=1e-5, err_msg=name)
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

    plain, polar, normed = (
        state(MUON),
        state(replace(MUON, coefficients="polar_express")),
        state(replace(MUON, normuon=True)),
    )

    def coeffs(s: dict) -> list:
        return [v for k, v in s.items() if k.endswith("ns_coeffs")]

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
