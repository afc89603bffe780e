"""The optimiser, its learning-rate schedule, and the one place that reads its statistics.

    nnx.Optimizer(model,
        apply_if_finite(                              # skip (and count) non-finite microbatches
            MultiSteps(                               # accumulate k microbatch gradients
                chain(record_grad_norm(),             # pre-clip norm of the accumulated gradient
                      clip_by_global_norm(max_norm),
                      inject_hyperparams(adamw)(learning_rate=warmup-cosine, ...)),
                every_k_schedule=k),
            max_consecutive_errors=inf),
        wrt=nnx.Param)

The norm recorder sits inside MultiSteps, so it sees the averaged gradient of a whole optimiser step,
exactly what the clip sees: the number the seed's author wanted and gave up on.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from config import TrainConfig
from model import matrix_mask

# Names under which optax keeps the statistics; `optimizer_stats` looks each up by name, so
# no caller depends on how the wrappers happen to nest.
_STAT_NAMES = {
    "learning_rate": "learning_rate",  # inject_hyperparams: the rate used by the last update
    "grad_norm": "grad_norm",  # record_grad_norm: pre-clip global L2 norm of the accumulated grads
    "gradient_step": "gradient_step",  # MultiSteps: optimiser steps applied so far
    "mini_step": "mini_step",  # MultiSteps: microbatches in the open accumulation window
    "notfinite_count": "notfinite_count",  # apply_if_finite: consecutive skipped microbatches
    "total_notfinite": "total_notfinite",  # apply_if_finite: skipped microbatches, ever
}


def make_schedule(train: TrainConfig, total_steps: int, peak: float | None = None) -> optax.Schedule:
    """Linear warm-up from peak * lr_init_factor to peak (default: train.json learning_rate), then
    "cosine": cosine decay to peak * lr_end_factor at the last step; "wsd": constant at the peak,
    then a linear cool-down over the last cooldown_percent of the steps to peak * lr_end_factor."""
    peak = train.learning_rate if peak is None else peak
    warmup = int(total_steps * train.warmup_percent / 100)
    if train.schedule == "wsd":
        return _wsd(peak * train.lr_init_factor, peak, peak * train.lr_end_factor, warmup,
                    int(total_steps * train.cooldown_percent / 100), total_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=peak * train.lr_init_factor,
        peak_value=peak,
        warmup_steps=warmup,
        # optax's decay_steps counts the warm-up too (the seed's "!!"); keep one decay step so a
        # 100% warm-up still gives a valid schedule.
        decay_steps=max(total_steps, warmup + 1),
        end_value=peak * train.lr_end_factor,
    )


def _wsd(init: float, peak: float, end: float, warmup: int, cooldown: int, total: int) -> optax.Schedule:
    """Warmup-stable-decay: the pieces of non-zero length, joined at their step boundaries (config.py
    keeps warmup + cooldown <= total)."""
    pieces = [(warmup, optax.linear_schedule(init, peak, warmup))] if warmup else []
    pieces.append((total - warmup - cooldown, optax.constant_schedule(peak)))
    if cooldown:
        pieces.append((cooldown, optax.linear_schedule(peak, end, cooldown)))  # end from step `total` on
    boundaries = [sum(n for n, _ in pieces[:i + 1]) for i in range(len(pieces) - 1)]
    return optax.join_schedules([f for _, f in pieces], boundaries)


class GradNormState(NamedTuple):
    grad_norm: jax.Array  # NaN until the first optimiser step


def record_grad_norm() -> optax.GradientTransformation:
    """Store the global L2 norm of the updates passing through (here: the accumulated gradient).

    Like optax.snapshot, except that it starts at NaN: snapshot's init measures the
    *parameters*, which would read as a (huge, clipped) gradient norm until the first step.
    """
    def init(params: Any) -> GradNormState:
        del params
        return GradNormState(jnp.asarray(jnp.nan, jnp.float32))

    def update(updates: Any, state: GradNormState, params: Any = None) -> tuple[Any, GradNormState]:
        del state, params
        return updates, GradNormState(optax.tree.norm(updates).astype(jnp.float32))

    return optax.GradientTransformation(init, update)


def make_transform(train: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=make_schedule(train, total_steps),
        b1=train.adam_b1,
        b2=train.adam_b2,
        eps=train.adam_eps,
        weight_decay=train.weight_decay,
        mask=matrix_mask,  # matrices only: biases and LayerNorm vectors are not decayed, as in GPT-2
    )
    inner = optax.chain(
        record_grad_norm(),
        optax.clip_by_global_norm(train.clipping_max_norm),
        adamw,
    )
    return optax.apply_if_finite(
        optax.MultiSteps(inner, every_k_schedule=train.gradient_accumulation_steps),
        max_consecutive_errors=math.inf,  # never give up: skip every bad microbatch, as PyTorch AMP
    )


def make_optimizer(model: nnx.Module, train: TrainConfig, total_steps: int) -> nnx.Optimizer:
    return nnx.Optimizer(model, make_transform(train, total_steps), wrt=nnx.Param)


def optimizer_stats(optimizer: nnx.Optimizer) -> dict[str, jax.Array]:
    """Learning rate, pre-clip grad norm, step counters and skip counts, looked up by name.

    Works inside jit (returns traced scalars) and outside (concrete arrays).
    """
    state = nnx.as_pure(optimizer.opt_state)
    stats = {
        key: optax.tree.get(state, name, filtering=lambda _path, v: isinstance(v, jax.Array))
        for key, name in _STAT_NAMES.items()
    }
    return stats


def close_skipped_window(optimizer: nnx.Optimizer) -> jax.Array:
    """Keep one optimiser step per k microbatches when apply_if_finite skipped some of them.

    A skipped microbatch does not advance MultiSteps, so after k microbatches its window would
    still be open and would swallow the next step's first microbatch: every later step would
    straddle two batches. Instead, an open window at the end of a step is dropped: a step with
    a non-finite microbatch gradient is skipped whole (as PyTorch's GradScaler skips a step),
    and the counters say so. Returns whether an open window was dropped (the step's statistics
    say whether it applied an update: step.py compares MultiSteps' gradient_step).
    """
    state = nnx.as_pure(optimizer.opt_state)
    dropped = optax.tree.get(state, "mini_step") != 0
    acc = optax.tree.get(state, "acc_grads")
    state = optax.tree.set(
        state,
        mini_step=jnp.where(dropped, 0, optax.tree.get(state, "mini_step")),
        acc_grads=jax.tree.map(lambda a: jnp.where(dropped, jnp.zeros_like(a), a), acc),
    )
    nnx.update(optimizer.opt_state, nnx.state(state))
    return dropped


def clip_flag(grad_norm: float | None, max_norm: float) -> bool:
    """Whether clip_by_global_norm scaled the step down (it clips when norm > max_norm)."""
    return grad_norm is not None and grad_norm > max_norm
