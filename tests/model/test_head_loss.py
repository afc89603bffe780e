"""The chunked head loss (`model.json` loss_chunk: loss.head_loss), whose gradient is made in the forward
pass beside each chunk's loss: the whole-logits loss's value and autodiff gradients, for the mean and
for weighted sums (fine-tuning's answer masks, validation's padding) under any cotangent, tied and
untied soft-capped heads, a padded last chunk; and the differentiated program multiplies by the head
three times, where recomputing the logits in the backward pass took four."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_reference import MODERN, TOL, V, equations, gpt_cfg, randomise_all, tokens

from jaxgpt.model.gpt import build_model, head_weight
from jaxgpt.model.loss import chunked_losses, head_loss, loss_fn, loss_sum

HEADS = {
    "tied": {"tie_embeddings": True},
    "untied-softcap": {**MODERN, "logit_softcap": 3.0},  # softcap small enough to bend the logits
}


def twins(kw: dict, chunk: int) -> tuple:
    """The same randomised weights, whole logits and chunked."""
    whole = build_model(gpt_cfg(**kw), seed=0)
    randomise_all(whole, seed=4)
    chunked = build_model(dataclasses.replace(whole.cfg, loss_chunk=chunk), seed=0)
    nnx.update(chunked, nnx.state(whole, nnx.Param))
    return whole, chunked


def value_and_grads(model, loss) -> tuple[float, dict]:
    value, grads = nnx.value_and_grad(loss)(model)
    flat = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(grads)}
    return float(value), flat


def assert_same(a: tuple[float, dict], b: tuple[float, dict]) -> None:
    (la, ga), (lb, gb) = a, b
    assert abs(la - lb) <= TOL * max(1.0, abs(lb)), (la, lb)
    assert sorted(ga) == sorted(gb)
    scale = max(np.abs(g).max() for g in gb.values())
    worst = {k: float(np.abs(ga[k] - gb[k]).max()) for k in gb}
    assert max(worst.values()) <= TOL * scale, (max(worst, key=worst.get), max(worst.values()), scale)
    assert scale > 1e-3 and all(np.abs(g).max() > 0 for g in gb.values())  # real gradients everywhere


@pytest.mark.parametrize("chunk", [5, 32])  # 32 tokens: six chunks and a padded one; exactly one chunk
@pytest.mark.parametrize("kw", list(HEADS.values()), ids=list(HEADS))
def test_the_mean_and_its_gradients_are_the_whole_logits_ones(kw: dict, chunk: int) -> None:
    whole, chunked = twins(kw, chunk)
    idx, targets = tokens(1), tokens(2)
    assert_same(
        value_and_grads(chunked, lambda m: loss_fn(m, idx, targets)),
        value_and_grads(whole, lambda m: loss_fn(m, idx, targets)),
    )


@pytest.mark.parametrize("kw", list(HEADS.values()), ids=list(HEADS))
def test_a_weighted_sum_under_any_cotangent_is_the_whole_logits_one(kw: dict) -> None:
    """Weights with zeros (the padding of a split's last batch, the prompt of an answer) and uneven
    ones, the sum scaled as the train step scales it, then squared: the cotangent reaching head_loss is
    neither 1 nor the same in two programs."""
    whole, chunked = twins(kw, 5)
    idx, targets = tokens(1), tokens(2)
    weights = jnp.asarray(np.random.default_rng(3).choice([0.0, 0.5, 1.0, 2.0], size=idx.shape), jnp.float32)

    def loss(m):
        return loss_fn(m, idx, targets, weights=weights, scale=0.37) ** 2

    assert_same(value_and_grads(chunked, loss), value_and_grads(whole, loss))
    # not differentiated (validation, evaluate.py): the value as before, bit for bit
    x = chunked.features(idx)
    ce = chunked_losses(chunked.ops, chunked.cfg, head_weight(chunked), x.reshape(-1, x.shape[-1]), targets.reshape(-1))
    before = -(-ce.reshape(idx.shape) * weights).sum()
    assert float(loss_sum(chunked, idx, targets, weights)) == float(before)


def recomputed_mean(model, w, x, targets) -> jax.Array:
    """The mean loss as chunked_losses' checkpointed scan makes it: logits again in the backward pass."""
    return chunked_losses(model.ops, model.cfg, w, x.reshape(-1, x.shape[-1]), targets.reshape(-1)).mean()


def head_products(f, *args) -> int:
    """How many matrix products a program makes with the head: the dot_generals with a V-wide operand."""
    jaxpr = jax.make_jaxpr(f)(*args).jaxpr
    return sum(
        1
        for eqn, _ in equations(jaxpr)
        if eqn.primitive.name == "dot_general" and any(V in v.aval.shape for v in (*eqn.invars, *eqn.outvars))
    )


@pytest.mark.parametrize("kw", list(HEADS.values()), ids=list(HEADS))
def test_the_gradient_multiplies_by_the_head_three_times_not_four(kw: dict) -> None:
    """The logits once and their two backward products (features and weights); chunked_losses'
    checkpointed scan computes the logits again in the backward pass."""
    _, model = twins(kw, 5)
    w, x, targets = head_weight(model), model.features(tokens(1)), tokens(2)

    def made_forward(w, x):
        return head_loss(model.ops, model.cfg, w, x, targets, None)

    grad = lambda f: jax.grad(f, argnums=(0, 1))  # noqa: E731
    assert head_products(grad(made_forward), w, x) == 3
    assert head_products(grad(lambda w, x: recomputed_mean(model, w, x, targets)), w, x) == 4
    assert head_products(made_forward, w, x) == 1  # not differentiated: the forward alone


def test_its_gradient_never_holds_the_whole_logits() -> None:
    """XLA's memory analysis of the differentiated loss (1,024 tokens, a 4,096 vocabulary, chunks of 256):
    no more than the checkpointed scan's, and less than one float32 copy of the (N, V) logits."""
    cfg = gpt_cfg(tie_embeddings=False, logit_softcap=3.0, vocab_size=4096, loss_chunk=256)
    model = build_model(cfg, seed=0)
    w, x = head_weight(model), jnp.ones((4, 256, cfg.emb_dim), jnp.float32)
    targets = jnp.asarray(np.random.default_rng(0).integers(0, 4096, (4, 256)), jnp.int32)

    def temp(f) -> int:
        lowered = jax.jit(jax.grad(f, argnums=(0, 1))).lower(w, x)
        return lowered.compile().memory_analysis().temp_size_in_bytes

    made = temp(lambda w, x: head_loss(model.ops, cfg, w, x, targets, None))
    recomputed = temp(lambda w, x: recomputed_mean(model, w, x, targets))
    assert made <= recomputed and made < targets.size * 4096 * 4, (made, recomputed)
