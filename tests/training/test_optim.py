"""The optimiser: schedule values, MultiSteps == one big batch, statistics, clipping, NaN skipping,
and the weight-decay mask.

One module-scoped run (`runs`) compiles `train_step` twice (k=3 and k=1) and feeds several tests;
the rest call `nnx.Optimizer.update` (through one small jitted wrapper) on tiny models.
"""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SLOW
from flax import nnx

from jaxgpt.config import ModelConfig, TrainConfig
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.model.gpt import abstract_model, build_model
from jaxgpt.model.loss import loss_fn
from jaxgpt.training.optimizer import clip_flag, make_optimizer, make_schedule, make_transform, optimizer_stats
from jaxgpt.training.train_step import StepRunner, step_key, train_step

V, T = 50, 8
MODEL = ModelConfig(
    architecture="gpt2", vocab_size=V, context_length=T, emb_dim=16, n_heads=2, n_layers=1, qkv_bias=True
)
K, B, TOTAL = 3, 2, 10


def train_cfg(**kw) -> TrainConfig:
    base = dict(
        microbatch_size=B,
        gradient_accumulation_steps=K,
        train_steps=TOTAL,
        learning_rate=1e-2,
        warmup_percent=20.0,
        lr_init_factor=0.1,
        lr_end_factor=0.1,
        weight_decay=0.1,
        clipping_max_norm=1.0,
    )
    base.update(kw)
    return TrainConfig(**base)


def params_np(model: nnx.Module) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.array(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def global_norm(tree) -> float:
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in jax.tree.leaves(tree)))


GRAPHDEF = nnx.graphdef(abstract_model(MODEL))


@jax.jit
def _loss_and_grads(state: nnx.State, x: jax.Array, y: jax.Array) -> tuple[jax.Array, nnx.State]:
    return jax.value_and_grad(lambda s: loss_fn(nnx.merge(GRAPHDEF, s), x, y))(state)


def grads_of(model: nnx.Module, x: jax.Array, y: jax.Array) -> nnx.State:
    """d loss_fn / d params, compiled once per batch shape (eager grads cost seconds each)."""
    return _loss_and_grads(nnx.state(model), x, y)[1]


@nnx.jit
def jit_update(model: nnx.Module, opt: nnx.Optimizer, grads: nnx.State) -> None:
    # One compile per optimiser; eager updates recompile MultiSteps' lax.cond on every call.
    opt.update(model, grads)


def batch(seed: int, k: int = K, b: int = B) -> tuple[jnp.ndarray, jnp.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, V, size=(k, b, T + 1))
    return jnp.asarray(w[..., :-1], jnp.int32), jnp.asarray(w[..., 1:], jnp.int32)


# ----------------------------------------------------------------------------- schedule


def test_schedule_warmup_cosine_values() -> None:
    tr = TrainConfig(
        microbatch_size=1,
        train_steps=100,
        learning_rate=1e-3,
        warmup_percent=10,
        lr_init_factor=0.01,
        lr_end_factor=0.1,
    )
    s = make_schedule(tr, 100)
    peak, init, end, w = 1e-3, 1e-5, 1e-4, 10

    def want(t: int) -> float:
        if t < w:
            return init + (peak - init) * t / w
        frac = min(t - w, 100 - w) / (100 - w)
        return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * frac))

    checks = {0: init, 5: (init + peak) / 2, 10: peak, 55: (peak + end) / 2, 100: end, 500: end}
    # optax evaluates in float32 as (init - peak) * (1 - t/w) + peak: ~1e-10 absolute rounding.
    for t, value in checks.items():
        assert float(s(t)) == pytest.approx(value, rel=1e-5, abs=1e-9), t
    for t in [1, 3, 9, 11, 30, 70, 99]:
        assert float(s(t)) == pytest.approx(want(t), rel=1e-5, abs=1e-9), t
    values = np.array([float(s(t)) for t in range(101)])
    assert np.all(np.diff(values[:11]) > 0) and np.all(np.diff(values[10:]) < 0)


def test_schedule_full_warmup_is_valid() -> None:
    tr = TrainConfig(
        microbatch_size=1,
        train_steps=50,
        learning_rate=2e-3,
        warmup_percent=100,
        lr_init_factor=0.0 + 1e-3,
        lr_end_factor=0.5,
    )
    s = make_schedule(tr, 50)
    values = np.array([float(s(t)) for t in range(0, 60)])
    assert np.all(np.isfinite(values)) and np.all(values > 0)
    assert values[0] == pytest.approx(2e-6, rel=1e-3)
    assert values[25] == pytest.approx((2e-6 + 2e-3) / 2, rel=1e-5)
    assert values[50] == pytest.approx(2e-3, rel=1e-5)  # warm-up spans every step
    assert np.all(np.diff(values[:51]) > 0)
    assert values[59] == pytest.approx(1e-3, rel=1e-5)  # past the end: the end value, no NaN


def test_schedule_no_warmup() -> None:
    tr = TrainConfig(microbatch_size=1, train_steps=40, learning_rate=1e-3, warmup_percent=0, lr_end_factor=0.0)
    s = make_schedule(tr, 40)
    assert float(s(0)) == pytest.approx(1e-3, rel=1e-6)  # straight to the peak
    assert float(s(20)) == pytest.approx(5e-4, rel=1e-5)
    assert float(s(10)) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)), rel=1e-5)
    assert abs(float(s(40))) < 1e-9


def test_schedule_warmup_rounds_down() -> None:
    # 5% of 30 steps = 1.5 -> 1 warm-up step: step 1 is already the peak.
    tr = TrainConfig(microbatch_size=1, train_steps=30, learning_rate=1e-3, warmup_percent=5)
    s = make_schedule(tr, 30)
    assert float(s(0)) == pytest.approx(1e-8, abs=1e-9)  # float32 rounding, see above
    assert float(s(1)) == pytest.approx(1e-3, rel=1e-6)


def test_schedule_wsd_values() -> None:
    """Warmup-stable-decay: cosine's own warm-up, the peak until the last cooldown_percent of the
    steps, then a straight line to peak x lr_end_factor at the last step."""
    tr = TrainConfig(
        microbatch_size=1,
        train_steps=100,
        learning_rate=1e-3,
        warmup_percent=10,
        lr_init_factor=0.01,
        lr_end_factor=0.1,
        schedule="wsd",
        cooldown_percent=20,
    )
    s, cosine = make_schedule(tr, 100), make_schedule(replace(tr, schedule="cosine", cooldown_percent=None), 100)
    peak, init, end = 1e-3, 1e-5, 1e-4
    for t in range(11):  # the same warm-up, to the bit
        assert float(s(t)) == float(cosine(t)), t
    assert float(s(5)) == pytest.approx((init + peak) / 2, rel=1e-5)
    assert all(float(s(t)) == pytest.approx(peak, rel=1e-7) for t in range(10, 81))  # stable to step 80
    checks = {81: peak + (end - peak) / 20, 90: (peak + end) / 2, 99: end + (peak - end) / 20, 100: end, 500: end}
    for t, value in checks.items():
        assert float(s(t)) == pytest.approx(value, rel=1e-5), t
    values = np.array([float(s(t)) for t in range(101)])
    assert np.all(np.diff(values[:11]) > 0) and np.all(np.diff(values[80:]) < 0)
    # Each part's peak (optimizer muon) scales the whole curve.
    assert float(make_schedule(tr, 100, peak=0.02)(90)) == pytest.approx(20 * (peak + end) / 2, rel=1e-5)


def test_schedule_wsd_edges() -> None:
    base = dict(microbatch_size=1, train_steps=50, learning_rate=2e-3, lr_end_factor=0.0, schedule="wsd")
    flat = make_schedule(TrainConfig(**base, warmup_percent=0, cooldown_percent=0), 50)
    assert [float(flat(t)) for t in (0, 1, 25, 49, 50, 99)] == [pytest.approx(2e-3, rel=1e-7)] * 6  # constant
    decay = make_schedule(TrainConfig(**base, warmup_percent=0, cooldown_percent=100), 50)
    assert float(decay(0)) == pytest.approx(2e-3) and float(decay(25)) == pytest.approx(1e-3, rel=1e-5)
    assert abs(float(decay(50))) < 1e-9
    both = make_schedule(TrainConfig(**base, warmup_percent=40, cooldown_percent=60), 50)  # no stable phase
    assert float(both(20)) == pytest.approx(2e-3, rel=1e-6) and float(both(35)) == pytest.approx(1e-3, rel=1e-5)
    # 20% of 7 steps = 1.4 -> one cool-down step, as the warm-up rounds down
    short = make_schedule(TrainConfig(**{**base, "train_steps": 7}, warmup_percent=0, cooldown_percent=20), 7)
    assert float(short(5)) == pytest.approx(2e-3, rel=1e-6) and abs(float(short(7))) < 1e-9
    assert float(short(6)) == pytest.approx(2e-3, rel=1e-6)


# ----------------------------------------------------------------------------- MultiSteps == big batch


@pytest.fixture(scope="module")
def runs() -> dict:
    """Two optimiser steps three ways, from the same initial parameters:
    acc: train_step over (K, B, T) through make_optimizer(k=K);
    ref: a plain clip + adamw chain on the concatenated (K*B, T) batch, eagerly;
    one: train_step over (1, K*B, T) through make_optimizer(k=1)."""
    tr = train_cfg()
    batches = [batch(1), batch(2)]
    init = params_np(build_model(MODEL, seed=0))
    out: dict = {"train": tr, "batches": batches, "init": init, "acc_stats": [], "acc_losses": [], "acc_opt_step": []}

    acc = build_model(MODEL, seed=0)
    acc_opt = make_optimizer(acc, tr, TOTAL)
    for i, (x, y) in enumerate(batches):
        losses, stats = train_step(acc, acc_opt, Batch(x, y), step_key(0, i))
        out["acc_losses"].append(np.asarray(losses))
        out["acc_stats"].append({k: np.asarray(v) for k, v in stats.items()})
        out["acc_opt_step"].append(int(acc_opt.step[...]))
    out["acc"] = params_np(acc)
    out["acc_final_stats"] = {k: np.asarray(v) for k, v in optimizer_stats(acc_opt).items()}
    # Then a step whose first microbatch is non-finite (token id V is out of range: jnp.take
    # fills the embedding with NaN), then a clean step. Same shapes: no recompile.
    x, y = batch(3)
    out["nan_batch"] = (x.at[0, 0, 2].set(V), y)
    out["after_nan"] = []
    out["before_nan"] = params_np(acc)
    for i, (bx, by) in enumerate([out["nan_batch"], batch(4)]):
        losses, stats = train_step(acc, acc_opt, Batch(bx, by), step_key(0, 2 + i))
        out["after_nan"].append((np.asarray(losses), {k: np.asarray(v) for k, v in stats.items()}, params_np(acc)))

    ref = build_model(MODEL, seed=0)
    tx = optax.chain(
        optax.clip_by_global_norm(tr.clipping_max_norm),
        optax.adamw(
            make_schedule(tr, TOTAL),
            b1=tr.adam_b1,
            b2=tr.adam_b2,
            eps=tr.adam_eps,
            weight_decay=tr.weight_decay,
            mask=lambda p: jax.tree.map(lambda a: a.ndim >= 2, p),
        ),
    )
    ref_opt = nnx.Optimizer(ref, tx, wrt=nnx.Param)
    out["ref_grad_norms"] = []
    for x, y in batches:
        grads = grads_of(ref, x.reshape(K * B, T), y.reshape(K * B, T))
        out["ref_grad_norms"].append(global_norm(grads))
        jit_update(ref, ref_opt, grads)
    out["ref"] = params_np(ref)

    one = build_model(MODEL, seed=0)
    one_opt = make_optimizer(one, replace(tr, microbatch_size=K * B, gradient_accumulation_steps=1), TOTAL)
    for i, (x, y) in enumerate(batches):
        train_step(one, one_opt, Batch(x.reshape(1, K * B, T), y.reshape(1, K * B, T)), step_key(0, i))
    out["one"] = params_np(one)
    out["one_model"], out["one_opt"] = one, one_opt
    return out


@SLOW  # two compiled steps compared over several steps
def test_step_runner_is_train_step_bit_for_bit(runs: dict) -> None:
    """StepRunner (what the trainer runs) against nnx.jit's train_step (what `runs` ran): the
    same losses, statistics and parameters after every step, the NaN-skipping steps included."""
    model = build_model(MODEL, seed=0)
    runner = StepRunner(model, make_optimizer(model, runs["train"], TOTAL))
    batches = runs["batches"] + [runs["nan_batch"], batch(4)]
    expected = list(zip(runs["acc_losses"], runs["acc_stats"], [None, runs["before_nan"]])) + runs["after_nan"]
    for i, ((x, y), (want_losses, want_stats, want_params)) in enumerate(zip(batches, expected)):
        losses, stats = jax.device_get(runner(Batch(x, y), step_key(0, i)))
        np.testing.assert_array_equal(losses, want_losses)
        assert set(stats) == set(want_stats)
        for key in stats:
            np.testing.assert_array_equal(stats[key], want_stats[key], err_msg=key)
        if want_params is not None:
            runner.sync()  # the model object reads the runner's current arrays only after a sync
            assert max_diff(params_np(model), want_params) == 0.0
    assert int(stats["total_notfinite"]) == 1  # the NaN batch went through the skip path


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_multisteps_equals_plain_chain_on_concatenated_batch(runs: dict) -> None:
    assert max_diff(runs["acc"], runs["init"]) > 1e-3  # the parameters really moved
    assert max_diff(runs["acc"], runs["ref"]) <= 1e-5


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_multisteps_equals_single_microbatch_step(runs: dict) -> None:
    assert max_diff(runs["acc"], runs["one"]) <= 1e-5


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_train_step_losses_are_microbatch_losses(runs: dict) -> None:
    x, y = runs["batches"][0]
    model = build_model(MODEL, seed=0)
    want = [float(_loss_and_grads(nnx.state(model), x[i], y[i])[0]) for i in range(K)]
    np.testing.assert_allclose(runs["acc_losses"][0], want, rtol=1e-5)
    assert runs["acc_losses"][0].shape == (K,)


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_grad_norm_is_pre_clip_norm_of_averaged_gradient(runs: dict) -> None:
    model = build_model(MODEL, seed=0)
    x, y = runs["batches"][0]
    micro = [grads_of(model, x[i], y[i]) for i in range(K)]
    avg = jax.tree.map(lambda *g: sum(g) / K, *micro)
    want = global_norm(avg)
    assert want > runs["train"].clipping_max_norm  # the first step clips: the norm is pre-clip
    assert float(runs["acc_stats"][0]["grad_norm"]) == pytest.approx(want, rel=1e-5)
    # The mean of per-microbatch norms is a different number: make sure we are not reporting it.
    assert abs(np.mean([global_norm(g) for g in micro]) - want) > 1e-3 * want
    # Second step: the averaged gradient equals the full-batch gradient of the reference run.
    assert float(runs["acc_stats"][1]["grad_norm"]) == pytest.approx(runs["ref_grad_norms"][1], rel=1e-4)


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_stats_learning_rate_and_counters(runs: dict) -> None:
    s = make_schedule(runs["train"], TOTAL)
    for i, stats in enumerate(runs["acc_stats"]):
        assert float(stats["learning_rate"]) == pytest.approx(float(s(i)), rel=1e-6)  # used by update i
        assert int(stats["gradient_step"]) == i + 1  # optimiser steps ...
        assert int(stats["mini_step"]) == 0  # ... the window closed
        assert int(stats["notfinite_count"]) == 0 and int(stats["total_notfinite"]) == 0
    assert float(s(0)) != pytest.approx(float(s(1)))  # the check above can tell the steps apart
    assert runs["acc_opt_step"] == [K, 2 * K]  # nnx's own counter counts microbatches instead
    # optimizer_stats outside jit reads the same numbers train_step returned inside it.
    for key, value in runs["acc_final_stats"].items():
        np.testing.assert_array_equal(runs["acc_stats"][-1][key], value)
    assert not any(bool(st["skipped_step"]) for st in runs["acc_stats"])


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_nan_microbatch_through_train_step_is_skipped(runs: dict) -> None:
    """An out-of-range token id makes the embedding lookup NaN (jnp.take fills), so the loss and
    every gradient are NaN: the step is skipped, counted, and the parameters are untouched."""
    model, opt = runs["one_model"], runs["one_opt"]
    before = params_np(model)
    x, y = runs["batches"][0]
    x = x.reshape(1, K * B, T).at[0, 0, 3].set(V)  # same shapes: reuses the compiled step
    losses, stats = train_step(model, opt, Batch(x, y.reshape(1, K * B, T)), step_key(0, 2))
    assert np.isnan(np.asarray(losses)).all()
    after = params_np(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert int(stats["notfinite_count"]) == 1 and int(stats["total_notfinite"]) == 1
    assert int(stats["gradient_step"]) == 2  # unchanged


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_nan_microbatch_inside_accumulation_is_skipped_and_counted(runs: dict) -> None:
    losses, stats, params = runs["after_nan"][0]
    assert np.isnan(losses[0]) and np.all(np.isfinite(losses[1:]))
    assert int(stats["notfinite_count"]) == 0  # the later finite microbatches reset it ...
    assert int(stats["total_notfinite"]) == 1  # ... the total remembers
    assert all(np.all(np.isfinite(v)) for v in params.values())
    assert int(runs["after_nan"][1][1]["total_notfinite"]) == 1


@SLOW  # the `runs` fixture compiles three optimisers' steps
def test_train_step_keeps_windows_aligned_after_a_skipped_microbatch(runs: dict) -> None:
    (_, nan_stats, _), (_, next_stats, _) = runs["after_nan"]
    # Each train_step call is documented as one optimiser step: whatever happens to a bad
    # microbatch, the next call must start a fresh window of its own k microbatches.
    (_, nan_stats, nan_params), (_, next_stats, next_params) = runs["after_nan"]
    assert int(nan_stats["mini_step"]) == 0
    assert int(next_stats["mini_step"]) == 0
    # The step that lost a microbatch is dropped whole: no update, no optimiser step counted ...
    assert bool(nan_stats["skipped_step"]) and not bool(next_stats["skipped_step"])
    assert int(nan_stats["gradient_step"]) == 2 and int(next_stats["gradient_step"]) == 3
    for key, value in runs["before_nan"].items():
        np.testing.assert_array_equal(nan_params[key], value, err_msg=key)
    # ... and the next call is a normal step of its own k microbatches.
    assert any(not np.array_equal(next_params[k], v) for k, v in nan_params.items())


# ----------------------------------------------------------------------------- eager optimiser checks


# One transform shared by the three tests below: optimisers built on the same tx object share a
# graphdef, so `jit_update` compiles once for all of them (each compile costs seconds).
EAGER = dict(
    gradient_accumulation_steps=2, warmup_percent=0, learning_rate=0.01, weight_decay=0.5, clipping_max_norm=1e-8
)


@pytest.fixture(scope="module")
def shared() -> tuple[TrainConfig, optax.GradientTransformation]:
    tr = train_cfg(**EAGER)
    return tr, make_transform(tr, TOTAL)


def fresh(shared, seed: int = 0) -> tuple[nnx.Module, nnx.Optimizer]:
    model = build_model(MODEL, seed=seed)
    return model, nnx.Optimizer(model, shared[1], wrt=nnx.Param)  # == make_optimizer(model, tr)


def test_clipping_clips_the_step(shared) -> None:
    tr = shared[0]
    lr, eps, wd, max_norm = tr.learning_rate, tr.adam_eps, tr.weight_decay, tr.clipping_max_norm
    x, y = batch(5, k=1)
    model, opt = fresh(shared)
    before = params_np(model)
    grads = grads_of(model, x[0], y[0])
    norm = global_norm(grads)
    assert norm > 1e6 * max_norm
    for _ in range(tr.gradient_accumulation_steps):  # the window averages k copies of g: g
        jit_update(model, opt, grads)
    stats = optimizer_stats(opt)
    assert int(stats["gradient_step"]) == 1
    assert float(stats["grad_norm"]) == pytest.approx(norm, rel=1e-5)  # the pre-clip norm
    assert clip_flag(float(stats["grad_norm"]), max_norm)
    # Adam's first step is -lr * (g_c / (|g_c| + eps) + wd * p), with g_c = g * max_norm / |g|
    # the clipped gradient and wd only on 2-D params. The clipped elements (<= 1e-8) are at most
    # eps, so the Adam part is at most 1/2, where an unclipped first step takes ~sign(g) = 1.
    after = params_np(model)
    g = {".".join(map(str, p)): np.asarray(v.get_value(), np.float64) for p, v in nnx.to_flat_state(grads)}
    adam_part = unclipped = 0.0
    for key, p in before.items():
        gc = g[key] * max_norm / norm
        decay = wd * p if p.ndim >= 2 else 0.0
        want = -lr * (gc / (np.abs(gc) + eps) + decay)
        # atol: float32 rounding of parameters near 1 (LayerNorm scales) is ~6e-8.
        np.testing.assert_allclose(after[key] - p, want, atol=1.5e-7, rtol=1e-3, err_msg=key)
        adam_part = max(adam_part, float(np.abs((after[key] - p) / -lr - decay).max()))
        unclipped = max(unclipped, float(np.abs(g[key] / (np.abs(g[key]) + eps)).max()))
    assert 0.05 < adam_part <= 0.5 + 1e-3 and unclipped > 0.99


def test_grad_norm_before_any_step_is_not_a_parameter_norm(shared) -> None:
    model, opt = fresh(shared)
    param_norm = global_norm(nnx.state(model, nnx.Param))
    grad_norm = float(optimizer_stats(opt)["grad_norm"])
    assert grad_norm != pytest.approx(param_norm, rel=1e-5)
    assert grad_norm == 0.0 or math.isnan(grad_norm)


def test_clip_flag() -> None:
    assert clip_flag(1.5, 1.0) and not clip_flag(1.0, 1.0) and not clip_flag(0.5, 1.0)
    assert not clip_flag(None, 1.0)


def test_nan_gradient_leaves_params_bit_identical_and_is_counted(shared) -> None:
    model, opt = fresh(shared)
    before = params_np(model)
    x, y = batch(6, k=1)
    grads = grads_of(model, x[0], y[0])
    nan = jax.tree.map(lambda a: jnp.full_like(a, jnp.nan), grads)
    one_inf = jax.tree.map(lambda a: a, grads)  # one bad leaf poisons the whole microbatch
    one_inf["ln_f"]["scale"] = nnx.Param(jnp.full_like(grads["ln_f"]["scale"][...], jnp.inf))

    for i, g in enumerate([nan, one_inf]):
        jit_update(model, opt, g)
        after = params_np(model)
        assert all(np.array_equal(before[k], after[k]) for k in before)
        stats = optimizer_stats(opt)
        assert int(stats["notfinite_count"]) == i + 1 and int(stats["total_notfinite"]) == i + 1
        assert int(stats["mini_step"]) == 0 and int(stats["gradient_step"]) == 0  # nothing accumulated

    # Finite microbatches afterwards: the consecutive count resets, the total stays, and a
    # window of two finite microbatches completes one optimiser step.
    jit_update(model, opt, grads)
    stats = optimizer_stats(opt)
    assert int(stats["notfinite_count"]) == 0 and int(stats["total_notfinite"]) == 2
    assert int(stats["mini_step"]) == 1 and int(stats["gradient_step"]) == 0
    assert all(np.array_equal(before[k], v) for k, v in params_np(model).items())  # mid-window
    jit_update(model, opt, grads)
    stats = optimizer_stats(opt)
    assert int(stats["gradient_step"]) == 1 and int(stats["total_notfinite"]) == 2
    assert float(stats["grad_norm"]) == pytest.approx(global_norm(grads), rel=1e-5)  # no NaN mixed in
    after = params_np(model)
    assert all(np.all(np.isfinite(v)) for v in after.values()) and max_diff(after, before) > 1e-4


def test_weight_decay_mask(shared) -> None:
    tr = shared[0]
    lr, wd = tr.learning_rate, tr.weight_decay
    model, opt = fresh(shared, seed=1)
    # Non-trivial 1-D params, so "unchanged" cannot be "zero stays zero".
    for _path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if var.get_value().ndim == 1:
            var.set_value(jnp.full_like(var.get_value(), 0.7))
    before = params_np(model)
    assert sum(v.ndim == 1 and bool(np.all(v == 0.7)) for v in before.values()) == 10
    zeros = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    for _ in range(tr.gradient_accumulation_steps):
        jit_update(model, opt, zeros)
    assert int(optimizer_stats(opt)["gradient_step"]) == 1
    after = params_np(model)
    n1 = n2 = 0
    for key, old in before.items():
        if old.ndim >= 2:
            np.testing.assert_allclose(after[key], old * (1 - lr * wd), rtol=1e-6, err_msg=key)
            assert np.abs(after[key]).sum() < np.abs(old).sum()
            n2 += 1
        else:
            np.testing.assert_array_equal(after[key], old, err_msg=key)
            n1 += 1
    # 2-D: tok, pos, qkv, proj, fc, out, head; 1-D: 4 Linear biases + 3 LayerNorms x (scale, bias)
    assert (n2, n1) == (7, 4 + 6)
