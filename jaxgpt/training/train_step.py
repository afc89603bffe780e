"""The train step: one optimiser step over k microbatches, compiled once; and its dropout key.

    runner = StepRunner(model, optimizer)           # the one step program (the trainer's, RL's, the tests')
    losses, stats = runner(Batch(inputs, targets), step_key(seed, step))
    runner.sync()                                   # before reading model or optimizer
    losses, stats = train_step(model, optimizer, Batch(inputs, targets), key)   # the same, once
    StepRunner(model, optimizer, PolicyLoss(clip=0.2, kl=0.05, sft=1.0))      # RL's terms' coefficients

A step is a pure function of (model, optimiser, batch, key). The loss is jaxgpt/model/loss.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgpt.config import ModelConfig, TrainConfig
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.model.loss import loss_fn, loss_sum, policy_loss_sums
from jaxgpt.training.optimizer import close_skipped_window, optimizer_stats


@dataclass(frozen=True)
class PolicyLoss:
    """RL's coefficients, fixed for a run (part of the compiled program): the step's loss is the policy
    term, + kl x the mean k3 KL over the sampled tokens (with batch.ref_logprobs), + sft x the mean
    cross-entropy of the fine-tuning rows (with batch.mix)."""

    clip: float | None = None  # PPO's clipped ratio, with batch.old_logprobs
    kl: float = 0.0
    sft: float = 1.0


def _train_step(
    model: nnx.Module,
    optimizer: nnx.Optimizer,
    batch: Batch,
    step_key: jax.Array,
    policy: PolicyLoss | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One optimiser step in one compiled call: k microbatches through the MultiSteps optimiser.

    batch: (k, B, T) fields (data/batch.py); step_key: the step's dropout key; policy: RL's terms. The
    loss (_objective): mean cross-entropy; with weights, the mean over the step's weighted targets; with
    advantages (RL), minus the mean over sampled tokens of logprob x advantage, and PolicyLoss's terms.
    Returns the (k,) microbatch losses (with weights each its own mean, and stats["loss"] the step's)
    and the optimiser statistics after the step (RL: "kl", the mean k3 over the sampled tokens, and
    "sft_loss", the fine-tuning rows' mean cross-entropy, where there).
    """
    k = batch.inputs.shape[0]
    dropout = model.cfg.drop_rate > 0.0  # static: no RNG work at all for dropout-free models
    keys = jax.random.split(step_key, k)
    graphdef, state = nnx.split((model, optimizer))
    # Weighted: microbatch i's objective is its weighted sum times k / (the step's weight), so
    # MultiSteps' mean of the k gradients is the gradient of the step's mean over weighted targets.
    scales = {
        "policy": None if batch.weights is None else k / jnp.maximum(batch.weights.sum(), 1.0),
        "sft": None if batch.mix is None else k / jnp.maximum(batch.mix.weights.sum(), 1.0),
    }

    def microstep(state: nnx.State, xs: tuple[Batch, jax.Array]) -> tuple[nnx.State, tuple[jax.Array, dict]]:
        model, optimizer = nnx.merge(graphdef, state)
        micro, key = xs
        rngs = nnx.Rngs(dropout=key) if dropout else None
        (loss, sums), grads = nnx.value_and_grad(_objective, has_aux=True)(model, micro, rngs, scales, policy)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), (loss, sums)

    applied_before = optimizer_stats(optimizer)["gradient_step"]
    state, (losses, sums) = jax.lax.scan(microstep, state, (batch, keys))
    nnx.update((model, optimizer), state)
    close_skipped_window(optimizer)
    stats = optimizer_stats(optimizer)
    scale = scales["policy"]
    if scale is not None:  # the step's mean over its weighted targets; each microbatch's own mean to show
        stats["loss"] = losses.sum() / k
        losses = losses / scale / jnp.maximum(batch.weights.sum(axis=(1, 2)), 1.0)
    if "kl" in sums:
        stats["kl"] = sums["kl"].sum() / jnp.maximum(batch.weights.sum(), 1.0)
    if "sft" in sums:
        stats["sft_loss"] = sums["sft"].sum() / jnp.maximum(batch.mix.weights.sum(), 1.0)
    # Dropped: no optimiser step applied, whether some of the k microbatches were skipped (an
    # open window closed) or all of them (a window that never opened).
    return losses, stats | {"skipped_step": stats["gradient_step"] == applied_before}


def _objective(
    model: nnx.Module, b: Batch, rngs: nnx.Rngs | None, scales: dict[str, jax.Array | None], policy: PolicyLoss | None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One microbatch's loss (B, T fields) and its terms' sums: RL's policy loss (with its KL and
    fine-tuning terms), a weighted sum, or the plain mean."""
    if b.advantages is not None:
        policy = policy or PolicyLoss()
        sums = policy_loss_sums(
            model, b.inputs, b.targets, b.weights, b.advantages, b.old_logprobs, policy.clip, b.ref_logprobs, rngs
        )
        loss = (sums["policy"] + policy.kl * sums.get("kl", 0.0)) * scales["policy"]
        if b.mix is not None:  # the fine-tuning rows: their own forward (their own rows and width)
            m = b.mix
            sums["sft"] = loss_sum(model, m.inputs, m.targets, m.weights, m.segments, rngs)
            loss = loss + policy.sft * sums["sft"] * scales["sft"]
        return loss, sums
    if b.weights is None:
        return loss_fn(model, b.inputs, b.targets, rngs), {}
    return loss_sum(model, b.inputs, b.targets, b.weights, b.segments, rngs) * scales["policy"], {}


class StepRunner:
    """The train step (_train_step) compiled once, on the model and optimiser held as flat arrays
    between calls: the one step program the trainer, the benchmark and the tests run.

    The arrays are donated and come back with their shardings. Between calls the model and optimiser
    objects hold stale arrays: call `sync()` before anything reads them (validation, checkpoints).
    Runners of the same structure and placement share one program. Why not nnx.jit:
    docs/performance.md "The CPU code, lever by lever".
    """

    def __init__(self, model: nnx.Module, optimizer: nnx.Optimizer, policy: PolicyLoss | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        graphdef, state = nnx.split((model, optimizer))
        self.leaves, self.treedef = jax.tree.flatten(state)
        self._step = _program(graphdef, self.treedef, tuple(leaf.sharding for leaf in self.leaves), policy)

    def __call__(self, batch: Batch, step_key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """One optimiser step, dispatched asynchronously: see _train_step."""
        self.leaves, losses, stats = self._step(self.leaves, batch, step_key)
        return losses, stats

    def lower(self, batch: Batch, step_key: jax.Array) -> Any:
        return self._step.lower(self.leaves, batch, step_key)

    def export(self, batch: Batch, step_key: jax.Array, platforms: Sequence[str]) -> jax.export.Exported:
        """This step as the program `platforms` would run (jax.export: StableHLO, donation kept).

        Lowering needs no such device: a CPU machine can export for "cuda" and audit the program
        a GPU would run. batch: arrays or jax.ShapeDtypeStruct of shape (k, B, T).
        """
        return jax.export.export(self._step, platforms=platforms)(self.leaves, batch, step_key)

    def sync(self) -> None:
        """Point the model and optimiser at the current arrays."""
        nnx.update((self.model, self.optimizer), jax.tree.unflatten(self.treedef, self.leaves))


@functools.lru_cache(maxsize=16)
def _program(graphdef: Any, treedef: Any, shardings: tuple[Any, ...], policy: PolicyLoss | None) -> Any:
    """_train_step over the flat arrays of a model and optimiser of this structure, jitted."""

    def pure(
        leaves: list[jax.Array], batch: Batch, key: jax.Array
    ) -> tuple[list[jax.Array], jax.Array, dict[str, jax.Array]]:
        model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        losses, stats = _train_step(model, optimizer, batch, key, policy)
        new_leaves, new_treedef = jax.tree.flatten(nnx.state((model, optimizer)))
        assert new_treedef == treedef, "the train step changed the model/optimiser structure"
        return new_leaves, losses, stats

    return jax.jit(pure, donate_argnums=0, out_shardings=(list(shardings), None, None))


def lower_step(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    steps: int,
    mesh: Any,
    batch: Batch,
    policy: PolicyLoss | None = None,
) -> Any:
    """The StepRunner program for a model and optimiser of these configs on `mesh`, lowered from
    shapes alone (no array is made); `.compile()` it for what the memory plan asks XLA to fit.
    batch: (k, B, T) fields as jax.ShapeDtypeStruct with their shardings."""
    from jaxgpt.distributed import sharding
    from jaxgpt.model.gpt import build_model
    from jaxgpt.training.optimizer import make_optimizer

    def build() -> tuple[nnx.Module, nnx.Optimizer]:
        model = build_model(model_cfg, seed=train_cfg.seed)
        return model, make_optimizer(model, train_cfg, steps)

    graphdef, state = nnx.split(nnx.eval_shape(build))
    leaves, treedef = jax.tree.flatten(state)
    shardings = tuple(jax.tree.leaves(sharding.state_shardings(state, mesh, train_cfg.mesh.fsdp)))
    args = [
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s, weak_type=x.weak_type) for x, s in zip(leaves, shardings)
    ]
    key = jax.eval_shape(lambda: step_key(0, 0))
    return _program(graphdef, treedef, shardings, policy).lower(args, batch, key)


def train_step(
    model: nnx.Module, optimizer: nnx.Optimizer, batch: Batch, step_key: jax.Array, policy: PolicyLoss | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One optimiser step of the StepRunner program on these objects, which then hold its result."""
    runner = StepRunner(model, optimizer, policy)
    out = runner(batch, step_key)
    runner.sync()
    return out


def step_key(seed: int, step: int) -> jax.Array:
    """The dropout key of optimiser step `step`: a pure function of (seed, step), so a resumed
    run draws exactly the dropout masks the uninterrupted run would have."""
    return jax.random.fold_in(jax.random.key(seed), step)
