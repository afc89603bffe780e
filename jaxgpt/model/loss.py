"""The training loss: mean next-token cross-entropy of the model's head, whole or `loss_chunk` rows at a time.

Shapes: inputs, targets (B, T) int32; features (B, T, C); logits (B, T, V) float32; weights (B, T)
float32 and segments (B, T) int32 for rows of packed conversations (jaxgpt/data/chat_rows.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import head_logits, head_weight
from jaxgpt.ops import Ops


def loss_fn(
    model: nnx.Module,
    inputs: jax.Array,
    targets: jax.Array,
    rngs: nnx.Rngs | None = None,
    weights: jax.Array | None = None,
    segments: jax.Array | None = None,
    scale: jax.Array | float = 1.0,
) -> jax.Array:
    """Mean cross-entropy over every position. inputs, targets: (B, T) int32.

    With (B, T) weights (instruction fine-tuning: 1 on answer tokens), the weighted sum times
    `scale` instead: the train step passes k / (the weights' sum over the whole optimiser step),
    so that the k microbatches' mean gradient is that of the mean over every trained token of the
    step, however they fall into microbatches. segments: see GPT.features."""
    if weights is not None:
        return loss_sum(model, inputs, targets, weights, segments, rngs) * scale
    if model.cfg.loss_chunk is not None:
        x = model.features(inputs, rngs)  # (B, T, C)
        return chunked_loss(model.ops, model.cfg, head_weight(model), x.reshape(-1, x.shape[-1]), targets.reshape(-1))
    logits = model(inputs, rngs)  # (B, T, V)
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)  # (B, T)
    return losses.mean()


def loss_sum(
    model: nnx.Module,
    inputs: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    segments: jax.Array | None = None,
    rngs: nnx.Rngs | None = None,
) -> jax.Array:
    """Sum of the cross-entropy over every position, each times its weight (validation: 0 for the
    padding of a split's last batch; fine-tuning: 1 on the answers only). inputs, targets: (B, T)
    int32; weights: (B, T) float32; segments: see GPT.features."""
    if model.cfg.loss_chunk is not None:
        x = model.features(inputs, rngs, segments)  # (B, T, C)
        return (
            chunked_loss(
                model.ops,
                model.cfg,
                head_weight(model),
                x.reshape(-1, x.shape[-1]),
                targets.reshape(-1),
                weights.reshape(-1),
            )
            * weights.size
        )
    logits = model(inputs, rngs, segments)  # (B, T, V)
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return (losses * weights).sum()


def chunked_loss(
    ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array, targets: jax.Array, token_weights: jax.Array | None = None
) -> jax.Array:
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
