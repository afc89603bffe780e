"""optimizer "muon" (muon.py, optim.py): the routing table, Muon's update against a numpy reference,
q/k/v and stacked layers orthogonalised apart, the logged rates, skipping and accumulation, the
state's sharding.

Each optimiser is the real one (make_transform) on a tiny GPT-2, updated with synthetic gradients
through one small jitted wrapper (a loss gradient would cost a compile of its own).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxgpt.config import ConfigError, ModelConfig, MuonConfig, TrainConfig, check_combination
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import abstract_model, build_model
from jaxgpt.training import muon
from jaxgpt.training.optimizer import make_schedule, make_transform, optimizer_stats, part_rates

MODEL = ModelConfig(architecture="gpt2", vocab_size=50, context_length=8, emb_dim=16, n_heads=2,
                    n_layers=2, qkv_bias=True)
TOTAL = 10
# Every part its own rate, so that an update applied with another part's rate shows.
MUON = MuonConfig(momentum_warmup_steps=4, weight_decay=0.05, embed_learning_rate=0.03,
                  head_learning_rate=0.005, scalar_learning_rate=0.007)
NS = (3.4445, -4.775, 2.0315)  # Newton-Schulz coefficients (optax's and Keller Jordan's default)


def train_cfg(**kw) -> TrainConfig:
    base = dict(microbatch_size=2, gradient_accumulation_steps=2, train_steps=TOTAL, optimizer="muon",
                learning_rate=0.02, warmup_percent=20.0, lr_init_factor=0.1, lr_end_factor=0.1,
                weight_decay=0.1, clipping_max_norm=1e9, muon=MUON)
    return TrainConfig(**(base | kw))


def expected_part(name: str) -> str:
    """The routing the issue asks for, written from the parameter names (muon.py uses the axes)."""
    if name in ("tok_emb.embedding", "pos_emb.embedding"):
        return "embed"
    if name == "head.kernel":
        return "head"
    if re.fullmatch(r"blocks(\.\d+)?\.(attn\.(qkv|proj)|mlp\.(fc|out))\.kernel", name):
        return "muon"
    assert name.endswith((".bias", ".scale")), name
    return "scalar"


def flat_names(state) -> dict[str, object]:
    return {".".join(map(str, p)): v for p, v in nnx.to_flat_state(state)}


# ----------------------------------------------------------------------------- routing


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_routing_table(tied: bool, bias: bool, scan: bool) -> None:
    model = abstract_model(replace(MODEL, qkv_bias=bias, bias=bias, tie_embeddings=tied, scan_layers=scan))
    routing = flat_names(muon.routes(model))
    params = flat_names(nnx.state(model, nnx.Param))
    assert routing.keys() == params.keys()
    for name, r in routing.items():
        assert r.part == expected_part(name), name
        assert r.fused == (3 if name.endswith("attn.qkv.kernel") else 1), name
    parts = {p: sorted(n for n, r in routing.items() if r.part == p) for p in muon.PARTS}
    L = 1 if scan else 2  # stacked: one leaf holds every layer
    assert len(parts["muon"]) == 4 * L and len(parts["embed"]) == 2
    assert parts["head"] == ([] if tied else ["head.kernel"])
    per_layer = 8 if bias else 2  # 2 LayerNorms x (scale, bias) + 4 Linear biases, or the scales alone
    assert len(parts["scalar"]) == per_layer * L + (2 if bias else 1)
    # The printed / recorded table: every tensor and parameter counted once, layers as *.
    table = muon.routing_table(model, muon.routes(model))
    assert sum(e["tensors"] for e in table.values()) == len(params)
    assert sum(e["params"] for e in table.values()) == sum(math.prod(v.get_value().shape) for v in params.values())
    assert ("head" in table) == (not tied)
    assert "blocks.*.attn.qkv.kernel (as 3 matrices)" in table["muon"]["names"] or scan
    text = muon.format_table(table, {p: 0.1 for p in muon.PARTS})
    assert len(text.splitlines()) == 1 + len(table) and "qkv.kernel (as 3 matrices)" in text


def test_a_parameter_with_unknown_axes_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"blocks\.0\.x\.kernel.*\('embed', 'rotary'\)"):
        muon.route("blocks.0.x.kernel", ("embed", "rotary"), 2)
    assert muon.route("ln.scale", ("norm",), 1).part == "scalar"
    assert muon.route("blocks.ln.scale", ("layers", "norm"), 2).part == "scalar"  # stacked 1-D: still a norm


def test_muon_without_a_matrix_is_a_config_error() -> None:
    a_to_a = ModelConfig(architecture="a-to-a", vocab_size=50, context_length=8, emb_dim=16)
    with pytest.raises(ConfigError) as err:
        check_combination(a_to_a, train_cfg())
    assert "\n" not in str(err.value) and "optimizer='muon'" in str(err.value) and "a-to-a" in str(err.value)
    check_combination(a_to_a, train_cfg(optimizer="adamw", learning_rate=None, weight_decay=None, muon=None))


# ----------------------------------------------------------------------------- sharding


def abstract_optimizer(train: TrainConfig) -> nnx.Optimizer:
    """For nnx.eval_shape: what make_optimizer builds (muon routing included)."""
    model = build_model(MODEL)
    routing = muon.routes(model) if train.optimizer == "muon" else None
    return nnx.Optimizer(model, make_transform(train, TOTAL, routing), wrt=nnx.Param)


@pytest.mark.parametrize("fsdp", [False, True], ids=["tp", "fsdp"])
def test_qkv_shards_as_before_and_so_does_its_momentum(fsdp: bool) -> None:
    """The "qkv" name maps where "heads" did (today's placement, unchanged); Muon's momentum of the
    (C, 3, C) view carries the view's names, so FSDP and tensor parallelism shard it too."""
    rules = dict(sharding.logical_rules(fsdp))
    mesh = jax.make_mesh((1, 1), (sharding.DATA, sharding.MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = abstract_model(MODEL)
    specs = flat_names(sharding.state_shardings(nnx.state(model, nnx.Param), mesh, fsdp))
    names = {n: v.get_metadata()["out_sharding"] for n, v in flat_names(nnx.state(model, nnx.Param)).items()}
    assert names["blocks.0.attn.qkv.kernel"] == ("embed", "qkv") and names["blocks.0.attn.qkv.bias"] == ("qkv",)
    for name, axes in names.items():
        before = tuple("heads" if a == "qkv" else a for a in axes)  # what model.py named them before
        assert specs[name].get_value().spec == P(*(rules[a] for a in before)), name

    opt = nnx.eval_shape(lambda: abstract_optimizer(train_cfg()))
    state = flat_names(nnx.state(opt))
    shard = flat_names(sharding.state_shardings(nnx.state(opt), mesh, fsdp))
    (mu,) = [n for n in state if n.endswith("muon.inner_state.0.mu.blocks.0.attn.qkv.kernel")]
    assert state[mu].get_value().shape == (16, 3, 16)
    assert shard[mu].get_value().spec == P(rules["embed"], None, sharding.MODEL)
    fc = mu.replace("attn.qkv", "mlp.fc")
    assert state[fc].get_value().shape == (16, 64) and shard[fc].get_value().spec == P(rules["embed"], sharding.MODEL)


# ----------------------------------------------------------------------------- the update


@nnx.jit
def jit_update(model: nnx.Module, opt: nnx.Optimizer, grads: nnx.State) -> None:
    opt.update(model, grads)


def params_np(model: nnx.Module) -> dict[str, np.ndarray]:
    return {n: np.array(v.get_value()) for n, v in flat_names(nnx.state(model, nnx.Param)).items()}


def random_grads(model: nnx.Module, seed: int) -> nnx.State:
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), nnx.state(model, nnx.Param))


def ns_numpy(g: np.ndarray) -> np.ndarray:
    """Muon's orthogonalisation of one (in, out) matrix, in float64: Frobenius-normalise, then five
    quintic Newton-Schulz steps on the wide orientation."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-8)
    a, b, c = NS
    for _ in range(5):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def matrices(name: str, x: np.ndarray) -> list[np.ndarray]:
    """The (in, out) matrices Muon sees in a leaf: one per layer if stacked, q, k, v apart."""
    layers = list(x) if x.ndim == 3 else [x]
    if name.endswith("qkv.kernel"):
        return [m for layer in layers for m in np.split(layer, 3, axis=-1)]
    return layers


def join(name: str, like: np.ndarray, mats: list[np.ndarray]) -> np.ndarray:
    """The inverse of `matrices`."""
    if name.endswith("qkv.kernel"):
        mats = [np.concatenate(mats[i:i + 3], axis=-1) for i in range(0, len(mats), 3)]
    return np.stack(mats) if like.ndim == 3 else mats[0]


def first_step_numpy(train: TrainConfig, params: dict, grads: dict) -> dict[str, np.ndarray]:
    """The parameters after the first optimiser step, part by part (each at its step-0 rate)."""
    m, eps, wd = train.muon, train.adam_eps, train.weight_decay
    lr = {part: float(make_schedule(train, TOTAL, peak)(0)) for part, peak in
          {"muon": train.learning_rate, "embed": m.embed_learning_rate, "head": m.head_learning_rate,
           "scalar": m.scalar_learning_rate}.items()}
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
    moved = {part: max(np.abs(got[n] - stepped["init"][n]).max() for n in got if expected_part(n) == part)
             for part in muon.PARTS}
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
    peak = {"muon": 0.02, "embed": m.embed_learning_rate, "head": m.head_learning_rate,
            "scalar": m.scalar_learning_rate}

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
    assert set(stepped["stats"][0]) == {"learning_rate", "grad_norm", "gradient_step", "mini_step", "notfinite_count",
                                        "total_notfinite", "embed_learning_rate", "head_learning_rate",
                                        "scalar_learning_rate", "momentum"}


def test_a_non_finite_microbatch_is_skipped(stepped: dict) -> None:
    for name, value in stepped["init"].items():
        np.testing.assert_array_equal(stepped["after_nan"][name], value, err_msg=name)
    s = stepped["nan_stats"]
    assert (int(s["notfinite_count"]), int(s["total_notfinite"]), int(s["mini_step"]), int(s["gradient_step"])) == (1, 1, 0, 0)
    last = stepped["stats"][-1]
    assert (int(last["notfinite_count"]), int(last["total_notfinite"])) == (0, 1)
    assert all(np.all(np.isfinite(v)) for v in stepped["params"][-1].values())


def test_adamw_stats_are_unchanged() -> None:
    opt = nnx.eval_shape(lambda: abstract_optimizer(TrainConfig(microbatch_size=2, train_steps=TOTAL)))
    stats = optimizer_stats(opt)
    assert set(stats) == {"learning_rate", "grad_norm", "gradient_step", "mini_step", "notfinite_count",
                          "total_notfinite"}
    assert part_rates({"learning_rate": np.float32(6e-4)}) == {"adamw": pytest.approx(6e-4)}
