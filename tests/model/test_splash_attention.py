"""The TPU's attention (jaxgpt/ops/tpu.py: Pallas splash attention), run by Pallas's interpreter on the CPU
and as the kernel itself on a TPU, against the neutral causal attention: causal, sliding windows (static
and traced), grouped-query heads, packed segments, gradients, under remat; and which kernel select() picks for a TPU."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import F32_SLACK, SLOW
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals
from model_reference import MODERN, gpt_cfg, randomise, tokens

from jaxgpt.config import ConfigError
from jaxgpt.model.gpt import REMAT_POLICIES, build_model
from jaxgpt.model.loss import loss_fn
from jaxgpt.ops.neutral import Ops
from jaxgpt.ops.select import attention_kernel
from jaxgpt.ops.tpu import TpuOps

B, T, D = 2, 128, 8  # the kernel's blocks are 128 rows or more, interpreted too
W = 40  # a short window
SPLASH = TpuOps("tpu", "float32", "splash", windows=(W, T), interpret=jax.default_backend() != "tpu")
NEUTRAL = Ops("cpu", "float32", "xla")


def qkv(heads: int, kv_heads: int, seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, heads, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, T, kv_heads, D)).astype(np.float32) for _ in range(2))
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


@pytest.mark.parametrize(
    "heads, kv_heads, window, packed",
    [(4, 4, None, False), (4, 2, None, False), (4, 4, W, False), (4, 2, W, True), (2, 2, None, True)],
)
def test_splash_computes_the_neutral_attention_and_its_gradients(heads, kv_heads, window, packed) -> None:
    q, k, v = qkv(heads, kv_heads)
    # Packed rows: three conversations then padding (0), as conversations/rows.py lays them out.
    row = np.repeat([1, 2, 3, 0], [50, 30, 36, T - 116])
    segments = jnp.asarray(np.stack([row, np.roll(row, 3)])) if packed else None

    def loss(ops: Ops) -> object:
        return lambda q, k, v: (ops.attention(q, k, v, window=window, segments=segments) ** 2).sum()

    np.testing.assert_allclose(
        SPLASH.attention(q, k, v, window=window, segments=segments),
        NEUTRAL.attention(q, k, v, window=window, segments=segments),
        atol=2e-5 * F32_SLACK,
    )
    got = jax.jit(jax.grad(loss(SPLASH), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(NEUTRAL), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-4 * F32_SLACK)


def test_a_traced_window_picks_its_kernel_and_remat_retraces_cleanly() -> None:
    """A scanned layer's window is traced: one kernel per window the model has. The kernels are cached
    across traces, so each must hold concrete masks (a kernel built inside a trace leaked a tracer
    into the next one: the TPU check's remat "dots" rows failed so)."""
    q, k, v = qkv(2, 2)
    policy = REMAT_POLICIES["dots"]
    for window in (W, T):
        f = jax.checkpoint(lambda q, k, v, w: SPLASH.attention(q, k, v, window=w).sum(), policy=policy)
        grad = jax.jit(jax.grad(f))
        for scale in (1.0, 2.0):  # a second trace reuses the cached kernel
            got = grad(q * scale, k, v, jnp.int32(window))
            want = jax.grad(lambda q: NEUTRAL.attention(q, k, v, window=window).sum())(q * scale)
            np.testing.assert_allclose(got, want, atol=2e-4 * F32_SLACK)


def test_remat_attention_keeps_the_kernels_residuals(capsys: pytest.CaptureFixture[str]) -> None:
    """Under remat "attention" (and "dots") the backward pass reads the kernel's own output and
    log-sum-exp, saved in the forward pass, rather than running the forward kernel again; under
    "full" only the inputs are kept."""
    q, k, v = qkv(2, 2)
    kept = {}
    for name in ("full", "attention", "dots"):
        f = jax.checkpoint(lambda q, k, v: (SPLASH.attention(q, k, v) ** 2).sum(), policy=REMAT_POLICIES[name])
        print_saved_residuals(f, q, k, v)
        kept[name] = sorted(
            line.split()[0] for line in capsys.readouterr().out.splitlines() if "_splash_attention" in line
        )
    # the (B, H, T, D) output and the (B, H, T) log-sum-exp, float32 here
    both = sorted([f"f32[{B},2,{T},{D}]", f"f32[{B},2,{T}]"])
    assert kept == {"full": [], "attention": both, "dots": both}


@pytest.mark.parametrize("recipe", ["gpt2", "2026"])
def test_a_scanned_model_under_remat_attention_keeps_the_kernels_residuals_once(
    recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a scanned model's layers keep for the backward pass under remat "attention": each block's input,
    and the kernel's output and log-sum-exp (through the 2026 recipe's switch over windows too), but not
    the attention's float32 (B, T, C) output beside them (the kernel's saved output gives it back)."""
    extra = {} if recipe == "gpt2" else {**MODERN, "window_pattern": "SL", "short_window": W, "n_kv_heads": 1}
    cfg = gpt_cfg(context_length=T, scan_layers=True, remat="attention", **extra)
    model = build_model(cfg, seed=3, ops=dataclasses.replace(SPLASH, windows=(W, T)))
    graphdef, state = nnx.split(model)
    x = tokens(5, B, T)
    print_saved_residuals(lambda s: loss_fn(nnx.merge(graphdef, s), x, jnp.roll(x, -1, axis=1)), state)
    kept = sorted(line.split()[0] for line in capsys.readouterr().out.splitlines() if "output of scan" in line)
    L, H, C = cfg.n_layers, cfg.n_heads, cfg.emb_dim
    want = [f"f32[{L},{B},{H},{T},{C // H}]", f"f32[{L},{B},{H},{T}]", f"f32[{L},{B},{T},{C}]"]
    assert kept == sorted(want + ([] if recipe == "gpt2" else [f"i32[{L}]"])), kept


@pytest.mark.parametrize(
    "recipe, remat", [("gpt2", False), ("gpt2", "attention"), pytest.param("2026", False, marks=SLOW)]
)
def test_a_model_on_splash_trains_as_on_the_neutral_attention(recipe: str, remat: bool | str) -> None:
    """The whole model's loss and gradients with the TPU's operations (interpreted) equal the neutral ones';
    the 2026 recipe scanned with windows, grouped heads and its connections; remat "attention" keeping the
    kernel's residuals."""
    extra = {} if recipe == "gpt2" else {**MODERN, "window_pattern": "SL", "short_window": W, "n_kv_heads": 1}
    extra["remat"] = remat
    cfg = gpt_cfg(context_length=T, scan_layers=True, **extra)
    models = [build_model(cfg, seed=3, ops=dataclasses.replace(o, windows=(W, T))) for o in (SPLASH, NEUTRAL)]
    for m in models:
        randomise(m, seed=4)
    x = tokens(5, B, T)
    y = jnp.roll(x, -1, axis=1)
    (la, ga), (lb, gb) = (jax.value_and_grad(lambda m: loss_fn(m, x, y))(m) for m in models)
    np.testing.assert_allclose(la, lb, rtol=1e-5 * F32_SLACK)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, atol=1e-4 * F32_SLACK)


def test_select_picks_splash_on_one_tpu_chip() -> None:
    assert attention_kernel(gpt_cfg(context_length=256), "tpu") == "splash"
    assert attention_kernel(gpt_cfg(context_length=100), "tpu") == "xla"  # no 128-row blocks
    assert attention_kernel(gpt_cfg(context_length=256, attention="splash"), "tpu") == "splash"
    with pytest.raises(ConfigError, match=r"^model.json: attention='splash' is the TPU's Pallas kernel"):
        attention_kernel(gpt_cfg(context_length=256, attention="splash"), "cpu")
