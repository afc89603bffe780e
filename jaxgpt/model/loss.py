"""The training loss: mean next-token cross-entropy of the model's head, whole or `loss_chunk` rows at a time.

Shapes: inputs, targets (B, T) int32; features (B, T, C); logits (B, T, V) float32; weights (B, T)
float32 and segments (B, T) int32 for rows of packed conversations (jaxgpt/conversations/rows.py).
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
        return head_loss(model.ops, model.cfg, head_weight(model), model.features(inputs, rngs), targets, None)
    return -token_logprobs(model, inputs, targets, rngs).mean()


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
        return head_loss(model.ops, model.cfg, head_weight(model), x, targets, weights)
    return -(token_logprobs(model, inputs, targets, rngs, segments) * weights).sum()


def policy_loss_sums(
    model: nnx.Module,
    inputs: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    advantages: jax.Array,
    old_logprobs: jax.Array | None = None,
    clip: float | None = None,
    ref_logprobs: jax.Array | None = None,
    rngs: nnx.Rngs | None = None,
) -> dict[str, jax.Array]:
    """RL's loss terms, each summed over the sampled tokens (weights 1), from one forward pass. "policy":
    minus the sum of logprob x advantage (REINFORCE with the group's baseline); with old_logprobs (the
    weights that drew the samples) PPO's clipped surrogate, minus the sum of min(r A, clip(r, 1 - clip,
    1 + clip) A), r = exp(logprob - old). "kl", with ref_logprobs: the sum of kl_k3. All (B, T)."""
    logp = token_logprobs(model, inputs, targets, rngs)
    if old_logprobs is None:
        objective = logp * advantages
    else:
        ratio = jnp.exp(logp - old_logprobs)
        objective = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * advantages)
    sums = {"policy": -(objective * weights).sum()}
    if ref_logprobs is not None:
        sums["kl"] = (kl_k3(logp, ref_logprobs) * weights).sum()
    return sums


def kl_k3(logp: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Per sampled token, Schulman's k3 estimate of KL(policy || reference): exp(d) - d - 1 with
    d = ref - logp. Unbiased for tokens drawn from the policy, never negative (unlike k1 = -d), and of
    low variance where the two are close; its gradient is (1 - exp(d)) times logp's (GRPO's KL term)."""
    d = ref_logprobs - logp
    return jnp.exp(d) - d - 1.0


def token_logprobs(
    model: nnx.Module,
    inputs: jax.Array,
    targets: jax.Array,
    rngs: nnx.Rngs | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """(B, T) float32 log-probability of each target under the model: minus its cross-entropy. With
    model.json's loss_chunk the head runs `loss_chunk` positions at a time (chunked_losses)."""
    if model.cfg.loss_chunk is not None:
        x = model.features(inputs, rngs, segments)  # (B, T, C)
        ce = chunked_losses(model.ops, model.cfg, head_weight(model), x.reshape(-1, x.shape[-1]), targets.reshape(-1))
        return -ce.reshape(targets.shape)
    logits = model(inputs, rngs, segments)  # (B, T, V)
    return -optax.losses.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def chunked_losses(ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array, targets: jax.Array) -> jax.Array:
    """The head's cross-entropy (N,) over (N, C) features, `cfg.loss_chunk` rows at a time.

    The (N, V) logits are never whole: a scan runs the head and the loss chunk by chunk, and
    jax.checkpoint makes the backward pass recompute each chunk's logits instead of keeping
    them (for GPT-2's 50k vocabulary and 16 x 1024 tokens per microbatch, 3.3 GB of float32
    logits plus as much again for their gradient, against chunk x V x 4 bytes). The last chunk is
    padded. What RL's per-token log-probabilities take; the mean and weighted losses take head_loss,
    whose gradient needs no second pass over the logits.
    """
    N = x.shape[0]
    x, targets = in_chunks(cfg.loss_chunk, x, targets)

    @functools.partial(jax.checkpoint, prevent_cse=False)  # in a scan: no CSE barrier needed
    def chunk_losses(w: jax.Array, xc: jax.Array, yc: jax.Array) -> jax.Array:
        logits = head_logits(ops, cfg, w, xc)  # (chunk, V) float32
        return optax.losses.softmax_cross_entropy_with_integer_labels(logits, yc)  # (chunk,)

    def body(carry: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, jax.Array]:
        return carry, chunk_losses(w, *xs)

    _, losses = jax.lax.scan(body, None, (x, targets))
    return losses.reshape(-1)[:N]


def in_chunks(size: int, *arrays: jax.Array) -> tuple[jax.Array, ...]:
    """Arrays of the same N leading rows as (n, chunk, ...): chunks of `size` rows (all N if fewer), the
    last one padded with zeros."""
    N = arrays[0].shape[0]
    chunk = min(size, N)
    n = -(-N // chunk)
    pad = [(0, n * chunk - N)]
    return tuple(jnp.pad(a, pad + [(0, 0)] * (a.ndim - 1)).reshape(n, chunk, *a.shape[1:]) for a in arrays)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def head_loss(
    ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array, targets: jax.Array, weights: jax.Array | None
) -> jax.Array:
    """The head's cross-entropy over (B, T, C) features x: its mean (weights None) or its sum times the
    (B, T) weights, `cfg.loss_chunk` rows at a time (chunked_losses), the same value.

    Differentiated, each chunk's gradient is made in the forward pass, beside its loss (head_loss_fwd):
    the loss is a scalar of known per-row coefficients, so the gradients with respect to w and x are
    the backward pass's cotangent times those made forward, and the head's logits are computed once,
    not again in the backward pass (chunked_losses' jax.checkpoint recomputes them: a fourth product
    of the head's, 2 x N x C x V FLOPs, with the softmax's work)."""
    ce = chunked_losses(ops, cfg, w, x.reshape(-1, x.shape[-1]), targets.reshape(-1)).reshape(targets.shape)
    return ce.mean() if weights is None else (ce * weights).sum()


def head_loss_fwd(
    ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array, targets: jax.Array, weights: jax.Array | None
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """head_loss and its gradients with respect to w and x for a cotangent of 1, chunk by chunk."""
    N, C = targets.size, x.shape[-1]
    coeffs = jnp.full((N,), 1.0 / N, jnp.float32) if weights is None else weights.reshape(-1).astype(jnp.float32)
    xs, ys, cs = in_chunks(cfg.loss_chunk, x.reshape(N, C), targets.reshape(N), coeffs)  # padded rows weigh 0

    def body(dw: jax.Array, chunk_in: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, tuple]:
        xc, yc, cc = chunk_in
        logits, vjp = jax.vjp(lambda w, xc: head_logits(ops, cfg, w, xc), w, xc)  # (chunk, V) float32
        # The loss and d ce / d logits = softmax - one-hot (each row times its coefficient) from one exp of
        # the shifted logits: jax.nn.softmax beside optax's loss kept one more (chunk, V) float32 buffer
        # live, 0.7 GiB more for the 2026 step at 8 x 2048 (XLA's memory analysis on a CPU).
        shifted = logits - logits.max(axis=-1, keepdims=True)
        e = jnp.exp(shifted)
        s = e.sum(axis=-1, keepdims=True)
        ce = jnp.log(s[:, 0]) - jnp.take_along_axis(shifted, yc[:, None], axis=-1)[:, 0]  # (chunk,)
        hot = jnp.arange(logits.shape[-1]) == yc[:, None]
        dlogits = e * (cc[:, None] / s) - jnp.where(hot, cc[:, None], 0.0)
        dw_c, dx_c = vjp(dlogits.astype(logits.dtype))
        return dw + dw_c.astype(dw.dtype), (ce, dx_c)

    dw, (ce, dx) = jax.lax.scan(body, jnp.zeros_like(w), (xs, ys, cs))
    ce = ce.reshape(-1)[:N].reshape(targets.shape)
    loss = ce.mean() if weights is None else (ce * weights).sum()
    return loss, (dw, dx.reshape(-1, C)[:N].reshape(x.shape).astype(x.dtype))


def head_loss_bwd(
    ops: Ops, cfg: ModelConfig, made: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array, None, None]:
    dw, dx = made
    return (g * dw).astype(dw.dtype), (g * dx).astype(dx.dtype), None, None


head_loss.defvjp(head_loss_fwd, head_loss_bwd)
