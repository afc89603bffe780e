"""The optimiser, its learning-rate schedules, and the one place that reads its statistics.

    nnx.Optimizer(model,
        apply_if_finite(                              # skip (and count) non-finite microbatches
            MultiSteps(                               # accumulate k microbatch gradients
                chain(record_grad_norm(),             # pre-clip norm of the accumulated gradient
                      clip_by_global_norm(max_norm),
                      inject_hyperparams(adamw)(learning_rate=schedule, ...)),      # "adamw"
                   or inject_hyperparams(muon_adamw)(learning_rate=schedule,        # "muon"
                          embed_learning_rate=..., head_learning_rate=..., scalar_learning_rate=...,
                          momentum=warm-up schedule, ...)),
                every_k_schedule=k),
            max_consecutive_errors=inf),
        wrt=nnx.Param)

`muon_adamw` is one optax.partition (muon.py routes); each part's rate has the schedule's shape.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxgpt.config import TrainConfig
from jaxgpt.model.gpt import matrix_mask
from jaxgpt.training import muon

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
# optimizer "muon" only: the other parts' rates and Muon's momentum (inject_hyperparams' names).
_MUON_STAT_NAMES = ("embed_learning_rate", "head_learning_rate", "scalar_learning_rate", "momentum")
# Each part's peak learning rate in the stats (and meta.json "learning_rates") by part name.
RATE_STATS = {
    "muon": "learning_rate",
    "embed": "embed_learning_rate",
    "head": "head_learning_rate",
    "scalar": "scalar_learning_rate",
}


def peak_rates(train: TrainConfig) -> dict[str, float]:
    """Each part's peak learning rate: {"adamw": lr}, or Muon's four parts."""
    if train.optimizer == "adamw":
        return {"adamw": train.learning_rate}
    m = train.muon
    return {
        "muon": train.learning_rate,
        "embed": m.embed_learning_rate,
        "head": m.head_learning_rate,
        "scalar": m.scalar_learning_rate,
    }


def part_rates(stats: dict[str, Any]) -> dict[str, float]:
    """The learning rate each part's last update used, by part name ({"adamw": lr} for adamw)."""
    if "embed_learning_rate" not in stats:
        return {"adamw": float(stats["learning_rate"])}
    return {part: float(stats[name]) for part, name in RATE_STATS.items()}


def make_schedule(train: TrainConfig, total_steps: int, peak: float | None = None) -> optax.Schedule:
    """Linear warm-up from peak * lr_init_factor to peak (default: train.json learning_rate), then
    "cosine": cosine decay to peak * lr_end_factor at the last step; "wsd": constant at the peak,
    then a linear cool-down over the last cooldown_percent of the steps to peak * lr_end_factor."""
    peak = train.learning_rate if peak is None else peak
    warmup = int(total_steps * train.warmup_percent / 100)
    if train.schedule == "wsd":
        return _wsd(
            peak * train.lr_init_factor,
            peak,
            peak * train.lr_end_factor,
            warmup,
            int(total_steps * train.cooldown_percent / 100),
            total_steps,
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=peak * train.lr_init_factor,
        peak_value=peak,
        warmup_steps=warmup,
        # optax's decay_steps counts the warm-up too (the blog post's "!!"); keep one decay step so a
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
    boundaries = [sum(n for n, _ in pieces[: i + 1]) for i in range(len(pieces) - 1)]
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


def make_transform(
    train: TrainConfig, total_steps: int, routing: nnx.State | None = None
) -> optax.GradientTransformation:
    """The whole optimiser; `routing` (muon.routes(model)) is needed for optimizer "muon"."""
    if train.optimizer == "muon":
        assert routing is not None, "optimizer 'muon' routes parameters by the model's axis names"
        update = _muon_adamw(train, total_steps, routing)
    else:
        update = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
            learning_rate=make_schedule(train, total_steps),
            b1=train.adam_b1,
            b2=train.adam_b2,
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
            mask=matrix_mask,  # matrices only: biases and LayerNorm vectors are not decayed, as in GPT-2
        )
    inner = optax.chain(record_grad_norm(), optax.clip_by_global_norm(train.clipping_max_norm), update)
    return optax.apply_if_finite(
        optax.MultiSteps(inner, every_k_schedule=train.gradient_accumulation_steps),
        max_consecutive_errors=math.inf,  # never give up: skip every bad microbatch, as PyTorch AMP
    )


def _muon_adamw(train: TrainConfig, total_steps: int, routing: nnx.State) -> optax.GradientTransformation:
    """One inject_hyperparams over the partition, so every rate (and the momentum) is a named,
    logged hyperparameter: "learning_rate" is the Muon matrices' alone (what optim/lr shows)."""
    m = train.muon
    labels = muon.labels(routing)

    def muon_adamw(
        learning_rate: Any,
        embed_learning_rate: Any,
        head_learning_rate: Any,
        scalar_learning_rate: Any,
        momentum: Any,
        muon_weight_decay: Any,
        b1: Any,
        b2: Any,
        eps: Any,
        weight_decay: Any,
    ) -> optax.GradientTransformation:
        def adamw(lr: Any) -> optax.GradientTransformation:  # embeddings and head: all matrices
            return optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)

        return optax.partition(
            {
                "muon": muon.scale_by_muon_viewed(
                    routing,
                    momentum=momentum,
                    nesterov=m.nesterov,
                    ns_steps=m.ns_steps,
                    weight_decay=muon_weight_decay,
                    learning_rate=learning_rate,
                    coefficients=m.coefficients,
                    normuon_beta2=m.normuon_beta2 if m.normuon else None,
                ),
                "embed": adamw(embed_learning_rate),
                "head": adamw(head_learning_rate),
                "scalar": optax.adam(scalar_learning_rate, b1=b1, b2=b2, eps=eps),  # norms, biases: never decayed
            },
            labels,
        )

    rates = peak_rates(train)
    return optax.inject_hyperparams(muon_adamw)(
        **{RATE_STATS[part]: make_schedule(train, total_steps, peak) for part, peak in rates.items()},
        momentum=optax.linear_schedule(m.momentum_init, m.momentum, m.momentum_warmup_steps)
        if m.momentum_warmup_steps
        else m.momentum,
        muon_weight_decay=m.weight_decay,
        b1=train.adam_b1,
        b2=train.adam_b2,
        eps=train.adam_eps,
        weight_decay=train.weight_decay,
    )


def make_optimizer(model: nnx.Module, train: TrainConfig, total_steps: int) -> nnx.Optimizer:
    routing = muon.routes(model) if train.optimizer == "muon" else None
    return nnx.Optimizer(model, make_transform(train, total_steps, routing), wrt=nnx.Param)


def optimizer_stats(optimizer: nnx.Optimizer) -> dict[str, jax.Array]:
    """Learning rate, pre-clip grad norm, step counters and skip counts, looked up by name; with
    Muon also the other parts' learning rates and the momentum (_MUON_STAT_NAMES).

    Works inside jit (returns traced scalars) and outside (concrete arrays).
    """
    state = nnx.as_pure(optimizer.opt_state)
    arrays = lambda _path, v: isinstance(v, jax.Array)  # noqa: E731 - not the schedules' states of the same name
    stats = {key: optax.tree.get(state, name, filtering=arrays) for key, name in _STAT_NAMES.items()}
    for name in _MUON_STAT_NAMES:
        value = optax.tree.get(state, name, filtering=arrays)
        if value is not None:
            stats[name] = value
    return stats


def close_skipped_window(optimizer: nnx.Optimizer) -> jax.Array:
    """Keep one optimiser step per k microbatches when apply_if_finite skipped some of them.

    A skipped microbatch does not advance MultiSteps, so its window would still be open after k
    microbatches and swallow the next step's first one. Instead an open window at a step's end is
    dropped: the step is skipped whole (as PyTorch's GradScaler does), and the counters say so.
    Returns whether an open window was dropped.
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
