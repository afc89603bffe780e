"""GPT-2 and the A-to-A sanity-check model in Flax NNX.

Shape legend: B = batch, T = sequence length, C = emb_dim, H = n_heads, D = C // H (head size),
V = vocab_size, L = n_layers.

Both models take int32 token ids (B, T) and return float32 logits (B, T, V). Inside, the residual
stream is kept flat as (B*T, C): XLA:CPU runs the backward pass of a dense layer on 2-D inputs
about twice as fast as on 3-D ones (measured: 6.5 vs 12.2 ms for a 128 -> 512 layer on 16 x 128
tokens), and the result is the same. Only attention needs the (B, T, H, D) view. Dropout is active
exactly when the caller passes `rngs` (training); without it the model is deterministic, so
evaluation and generation need no mode switch. Nothing here names a device: placement and
sharding are the caller's business.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from config import ModelConfig

_STD = 0.02  # GPT-2's init: N(0, 0.02) for every matrix ...
_LN_EPS = 1e-5


# Every parameter carries logical axis names; sharding.py maps them onto the device mesh
# ("heads", "mlp", "vocab" -> tensor parallel; "embed" -> FSDP when asked), so this file
# never names a device or a mesh axis.
def _normal(std: float, *axes: str) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.normal(stddev=std), axes)


def _zeros(*axes: str) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.zeros_init(), axes)


def _layer_norm(C: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(C, epsilon=_LN_EPS, rngs=rngs,
                         scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ("norm",)),
                         bias_init=_zeros("norm"))


def _dropout(x: jax.Array, layer: nnx.Dropout, rngs: nnx.Rngs | None) -> jax.Array:
    return layer(x, deterministic=rngs is None, rngs=rngs)


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        C = cfg.emb_dim
        self.n_heads = cfg.n_heads
        self.drop_rate = cfg.drop_rate
        # ... except the projections that write into the residual stream, scaled by
        # 1/sqrt(2L) so the residual's variance does not grow with depth (GPT-2 paper, 2.3).
        resid_std = _STD / math.sqrt(2 * cfg.n_layers)
        self.qkv = nnx.Linear(C, 3 * C, use_bias=cfg.qkv_bias, kernel_init=_normal(_STD, "embed", "heads"),
                              bias_init=_zeros("heads"), rngs=rngs)
        self.proj = nnx.Linear(C, C, kernel_init=_normal(resid_std, "heads", "embed"),
                               bias_init=_zeros("embed"), rngs=rngs)
        self.attn_drop = nnx.Dropout(cfg.drop_rate)
        self.resid_drop = nnx.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, B: int, T: int, rngs: nnx.Rngs | None = None) -> jax.Array:
        C = x.shape[-1]  # x: (B*T, C)
        H, D = self.n_heads, C // self.n_heads
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)  # 3 x (B*T, C)
        q, k, v = (t.reshape(B, T, H, D) for t in (q, k, v))  # (B, T, H, D)
        if rngs is None or self.drop_rate == 0.0:
            # The fused kernel (cuDNN flash attention on GPU) when nothing needs the weights.
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, H, D)
        else:
            # Attention-weight dropout needs the weights themselves, so spell it out.
            att = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)  # (B, H, T, T)
            causal = jnp.tril(jnp.ones((T, T), dtype=bool))
            att = jnp.where(causal, att, jnp.finfo(att.dtype).min)
            att = _dropout(jax.nn.softmax(att, axis=-1), self.attn_drop, rngs)
            y = jnp.einsum("bhts,bshd->bthd", att, v)  # (B, T, H, D)
        return _dropout(self.proj(y.reshape(B * T, C)), self.resid_drop, rngs)  # (B*T, C)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        C = cfg.emb_dim
        self.fc = nnx.Linear(C, 4 * C, kernel_init=_normal(_STD, "embed", "mlp"), bias_init=_zeros("mlp"), rngs=rngs)
        self.out = nnx.Linear(4 * C, C, kernel_init=_normal(_STD / math.sqrt(2 * cfg.n_layers), "mlp", "embed"),
                              bias_init=_zeros("embed"), rngs=rngs)
        self.drop = nnx.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        h = jax.nn.gelu(self.fc(x), approximate=True)  # (B*T, 4C), GPT-2's tanh GELU
        return _dropout(self.out(h), self.drop, rngs)  # (B*T, C)


class Block(nnx.Module):
    """One pre-LayerNorm transformer block."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.ln1 = _layer_norm(cfg.emb_dim, rngs)
        self.attn = CausalSelfAttention(cfg, rngs=rngs)
        self.ln2 = _layer_norm(cfg.emb_dim, rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: jax.Array, B: int, T: int, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = x + self.attn(self.ln1(x), B, T, rngs)  # (B*T, C)
        return x + self.mlp(self.ln2(x), rngs)  # (B*T, C)


class GPT(nnx.Module):
    """GPT-2: learned token + position embeddings, L blocks, final LayerNorm, output head."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tok_emb = nnx.Embed(cfg.vocab_size, cfg.emb_dim, embedding_init=_normal(_STD, "vocab", "embed"),
                                 rngs=rngs)
        self.pos_emb = nnx.Embed(cfg.context_length, cfg.emb_dim, embedding_init=_normal(_STD, "ctx", "embed"),
                                 rngs=rngs)
        self.drop = nnx.Dropout(cfg.drop_rate)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.ln_f = _layer_norm(cfg.emb_dim, rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(cfg.emb_dim, cfg.vocab_size, use_bias=False,
                                   kernel_init=_normal(_STD, "embed", "vocab"), rngs=rngs)

    def __call__(self, idx: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        B, T = idx.shape
        x = self.tok_emb(idx) + self.pos_emb(jnp.arange(T))  # (B, T, C) + (T, C)
        x = _dropout(x.reshape(B * T, -1), self.drop, rngs)  # (B*T, C)
        for block in self.blocks:
            x = block(x, B, T, rngs)  # (B*T, C)
        x = self.ln_f(x)
        logits = self.tok_emb.attend(x) if self.cfg.tie_embeddings else self.head(x)  # (B*T, V)
        return logits.reshape(B, T, -1)  # (B, T, V)


class AToA(nnx.Module):
    """The seed's A-to-A model: embedding straight into the output head, no transformer."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tok_emb = nnx.Embed(cfg.vocab_size, cfg.emb_dim, embedding_init=_normal(_STD, "vocab", "embed"),
                                 rngs=rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(cfg.emb_dim, cfg.vocab_size, use_bias=False,
                                   kernel_init=_normal(_STD, "embed", "vocab"), rngs=rngs)

    def __call__(self, idx: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        B, T = idx.shape
        x = self.tok_emb(idx.reshape(B * T))  # (B*T, C)
        logits = self.tok_emb.attend(x) if self.cfg.tie_embeddings else self.head(x)  # (B*T, V)
        return logits.reshape(B, T, -1)  # (B, T, V)


def build_model(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
    """A freshly initialised model; the parameters are a pure function of the seed.

    Arrays are created unsharded (on the default device, or wherever an enclosing jit puts
    them); sharding.create_sharded places them on a mesh.
    """
    rngs = nnx.Rngs(params=seed)
    with nnx.use_eager_sharding(False):
        return GPT(cfg, rngs=rngs) if cfg.architecture == "gpt2" else AToA(cfg, rngs=rngs)


def abstract_model(cfg: ModelConfig) -> nnx.Module:
    """The model's structure with shape-only leaves: for loading weights without a wasted init."""
    return nnx.eval_shape(lambda: build_model(cfg))


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
