"""The compiled steps: loss, one optimiser step over k microbatches, validation loss.

A train step is a pure function of (model, optimiser, batch, key): the loop around it only
fetches data, steps, logs, evaluates and saves.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from config import ModelConfig
from model import head_logits, head_weight
from ops import Ops
from optim import close_skipped_window, optimizer_stats


def loss_fn(model: nnx.Module, inputs: jax.Array, targets: jax.Array,
            rngs: nnx.Rngs | None = None) -> jax.Array:
    """Mean cross-entropy over every position. inputs, targets: (B, T) int32."""
    if model.cfg.loss_chunk is not None:
        x = model.features(inputs, rngs)  # (B, T, C)
        return chunked_loss(model.ops, model.cfg, head_weight(model), x.reshape(-1, x.shape[-1]), targets.reshape(-1))
    logits = model(inputs, rngs)  # (B, T, V)
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets)  # (B, T)
    return losses.mean()


def loss_sum(model: nnx.Module, inputs: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
    """Sum of the cross-entropy over every position, each times its weight (validation: 0 for the
    padding of a split's last batch). inputs, targets: (B, T) int32; weights: (B, T) float32."""
    if model.cfg.loss_chunk is not None:
        x = model.features(inputs)  # (B, T, C)
        return chunked_loss(model.ops, model.cfg, head_weight(model), x.reshape(-1, x.shape[-1]),
                            targets.reshape(-1), weights.reshape(-1)) * weights.size
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(model(inputs).astype(jnp.float32), targets)
    return (losses * weights).sum()


def chunked_loss(ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array, targets: jax.Array,
                 token_weights: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy of the head over (N, C) features, `cfg.loss_chunk` rows at a time
    (each row times its weight in `token_weights`, if given: (N,); the mean still divides by N).

    The (N, V) logits are never whole: a scan runs the head and the loss chunk by chunk, and
    jax.checkpoint makes the backward pass recompute each chunk's logits instead of keeping
    them (for GPT-2's 50k vocabulary and 16 x 1024 tokens per microbatch, 3.3 GB of float32
    logits plus as much again for their gradient, against chunk x V x 4 bytes). The last chunk is
    padded with zero-weight rows.
    """
    N, C = x.shape
    chunk = min(cfg.loss_chunk, N)
    n = -(-N // chunk)
    pad = n * chunk - N
    weights = jnp.ones(N, jnp.float32) if token_weights is None else token_weights.astype(jnp.float32)
    weights = jnp.pad(weights, (0, pad)).reshape(n, chunk)
    x = jnp.pad(x, ((0, pad), (0, 0))).reshape(n, chunk, C)
    targets = jnp.pad(targets, (0, pad)).reshape(n, chunk)

    @functools.partial(jax.checkpoint, prevent_cse=False)  # in a scan: no CSE barrier needed
    def chunk_sum(w: jax.Array, xc: jax.Array, yc: jax.Array, wc: jax.Array) -> jax.Array:
        logits = head_logits(ops, cfg, w, xc)  # (chunk, V) float32
        return (optax.losses.softmax_cross_entropy_with_integer_labels(logits, yc) * wc).sum()

    def body(total: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
        return total + chunk_sum(w, *xs), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (x, targets, weights))
    return total / N


def _train_step(model: nnx.Module, optimizer: nnx.Optimizer, inputs: jax.Array,
                targets: jax.Array, step_key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One optimiser step in one compiled call: k microbatches through the MultiSteps optimiser.

    inputs, targets: (k, B, T) int32; step_key: the dropout key of this step.
    Returns the k microbatch losses (k,) and the optimiser statistics after the step.

    The microbatches run in a `lax.scan`, so compile time and memory stay flat in k (a Python
    loop would unroll k forward/backward passes into one program: the seed's OOM). Each
    microbatch still goes through `optimizer.update`, so MultiSteps and apply_if_finite keep
    their semantics: gradients are averaged over the window, and a non-finite microbatch is
    skipped and counted; a step that lost a microbatch that way is dropped whole, so every call
    stays exactly one optimiser step (optim.close_skipped_window).
    """
    k = inputs.shape[0]
    dropout = model.cfg.drop_rate > 0.0  # static: no RNG work at all for dropout-free models
    keys = jax.random.split(step_key, k)
    graphdef, state = nnx.split((model, optimizer))

    def microstep(state: nnx.State, xs: tuple[jax.Array, ...]) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        x, y, key = xs
        rngs = nnx.Rngs(dropout=key) if dropout else None
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y, rngs)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    applied_before = optimizer_stats(optimizer)["gradient_step"]
    state, losses = jax.lax.scan(microstep, state, (inputs, targets, keys))
    nnx.update((model, optimizer), state)
    close_skipped_window(optimizer)
    stats = optimizer_stats(optimizer)
    # Dropped: no optimiser step applied, whether some of the k microbatches were skipped (an
    # open window closed) or all of them (a window that never opened).
    return losses, stats | {"skipped_step": stats["gradient_step"] == applied_before}


train_step = nnx.jit(_train_step, donate_argnums=(0, 1))
train_step.__doc__ = _train_step.__doc__


class StepRunner:
    """train_step on the model and optimiser held as flat arrays between calls: what the trainer
    and the benchmark run.

    nnx.jit walks the model and optimiser graphs (hundreds of Variables) in and out on every
    call: Python time that on a small CPU competes with the step itself for the cores, and which
    a loop that reads each step's loss cannot hide (docs/performance.md "Performance" has the figures). Here
    the graph is split once and jax.jit takes the flat list of arrays; the arrays are donated and come back with the shardings they went in with. Between calls the model and
    optimiser objects hold stale (donated) arrays: `sync()` writes the current ones back before
    anything reads them (validation, checkpoints).
    """

    def __init__(self, model: nnx.Module, optimizer: nnx.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        graphdef, state = nnx.split((model, optimizer))
        self.leaves, self.treedef = jax.tree.flatten(state)
        treedef = self.treedef

        def pure(leaves: list[jax.Array], inputs: jax.Array, targets: jax.Array,
                 key: jax.Array) -> tuple[list[jax.Array], jax.Array, dict[str, jax.Array]]:
            model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
            losses, stats = _train_step(model, optimizer, inputs, targets, key)
            new_leaves, new_treedef = jax.tree.flatten(nnx.state((model, optimizer)))
            assert new_treedef == treedef, "the train step changed the model/optimiser structure"
            return new_leaves, losses, stats

        self._step = jax.jit(pure, donate_argnums=0,
                             out_shardings=([leaf.sharding for leaf in self.leaves], None, None))

    def __call__(self, inputs: jax.Array, targets: jax.Array,
                 step_key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """One optimiser step, dispatched asynchronously: see train_step."""
        self.leaves, losses, stats = self._step(self.leaves, inputs, targets, step_key)
        return losses, stats

    def lower(self, inputs: jax.Array, targets: jax.Array, step_key: jax.Array) -> Any:
        return self._step.lower(self.leaves, inputs, targets, step_key)

    def export(self, inputs: Any, targets: Any, step_key: jax.Array, platforms: Sequence[str]) -> jax.export.Exported:
        """This step as the program `platforms` would run (jax.export: StableHLO, donation kept).

        Lowering needs no such device: a CPU machine can export for "cuda" and audit the program
        a GPU would run. inputs, targets: arrays or jax.ShapeDtypeStruct of shape (k, B, T).
        """
        return jax.export.export(self._step, platforms=platforms)(self.leaves, inputs, targets, step_key)

    def sync(self) -> None:
        """Point the model and optimiser at the current arrays."""
        nnx.update((self.model, self.optimizer), jax.tree.unflatten(self.treedef, self.leaves))


@nnx.jit
def eval_sums(model: nnx.Module, inputs: jax.Array, targets: jax.Array,
              weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of the weighted losses, sum of the weights) of one (B, T) microbatch, dropout off:
    summed over batches, their ratio is the exact mean over every scored token (data.WholeSplit)."""
    return loss_sum(model, inputs, targets, weights), weights.sum()


@nnx.jit
def ending_losses(model: nnx.Module, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """HellaSwag's per-row figures (hellaswag.py): (N, T) int32 rows and (N, T) float32 0/1 masks
    of the tokens to score -> (N,) summed next-token losses of the masked tokens and (N,) their
    counts. Position t predicts token t + 1, so the mask is read from position 1 on (llm.c's
    shift_mask). The head runs one row at a time: (T, V) logits, never (N, T, V)."""
    feats = model.features(tokens)[:, :-1]  # (N, T-1, C)
    targets, weights = tokens[:, 1:], mask[:, 1:]  # (N, T-1)
    w = head_weight(model)

    def row(xs: tuple[jax.Array, ...]) -> jax.Array:
        x, y, m = xs
        logits = head_logits(model.ops, model.cfg, w, x)  # (T-1, V) float32
        return (optax.losses.softmax_cross_entropy_with_integer_labels(logits, y) * m).sum()

    return jax.lax.map(row, (feats, targets, weights)), weights.sum(-1)


def step_key(seed: int, step: int) -> jax.Array:
    """The dropout key of optimiser step `step`: a pure function of (seed, step), so a resumed
    run draws exactly the dropout masks the uninterrupted run would have."""
    return jax.random.fold_in(jax.random.key(seed), step)
