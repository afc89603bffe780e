"""The building blocks gpt.py assembles, each chosen once from model.json where a module is built.

Shape legend as in gpt.py: B = batch, T = sequence length, C = emb_dim, H = n_heads, D = C // H.

A block calls `self.ln1`, `self.attn.qk_norm`, `self.attn.rotary`, `self.mlp.act`, made for it
here; an option that is off is `Identity` (no parameters, no work).

- `make_norm`: GPT-2's LayerNorm or RMSNorm (Zhang & Sennrich 2019), with a learned scale or
  parameter-free (`norm_scale: false`).
- `Rotary`: rotary position embeddings (RoFormer) on queries and keys, in the "rotate half" layout
  of GPT-NeoX, Llama and Flax's gemma example (`apply_rope`); `Rotary.lanes` and `norm_lanes`: the
  same rotation and QK-norm on (B, T, H*D), heads side by side (`Ops.qk_lanes`).
- `ACTIVATIONS`: GPT-2's tanh GELU, or ReLU squared (Primer).
- `softcap`: a tanh cap on the logits (Gemma 2), float32.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgpt.config import ModelConfig

_LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon
_RMS_EPS = 1e-6  # nnx.RMSNorm's default (Llama's)


def normal(std: float, *axes: str) -> nnx.Initializer:
    """N(0, std), with the parameter's logical axis names (sharding.py maps them onto the mesh)."""
    return nnx.with_partitioning(nnx.initializers.normal(stddev=std), axes)


def zeros(*axes: str) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.zeros_init(), axes)


def ones(*axes: str) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.ones_init(), axes)


class Identity(nnx.Module):
    """An option that is off: returns its first argument, holds no parameters."""

    def __call__(self, x: jax.Array, *_: object) -> jax.Array:
        return x


def make_norm(cfg: ModelConfig, features: int, rngs: nnx.Rngs) -> nnx.Module:
    """model.json's norm over the last axis of `features`: (..., features) -> (..., features) float32.

    "layernorm": GPT-2's (scale and, with `bias`, a bias); "rmsnorm": x / rms(x), no mean, no bias.
    `norm_scale: false` drops the learned scale (a parameter-free norm)."""
    if cfg.norm == "rmsnorm":
        return nnx.RMSNorm(features, epsilon=_RMS_EPS, use_scale=cfg.norm_scale, scale_init=ones("norm"), rngs=rngs)
    return nnx.LayerNorm(
        features,
        epsilon=_LN_EPS,
        use_bias=cfg.bias,
        use_scale=cfg.norm_scale,
        rngs=rngs,
        scale_init=ones("norm"),
        bias_init=zeros("norm"),
    )


def qk_norm(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """QK-norm (Dehghani et al. 2023; OLMo 2, modded-nanogpt, nanochat): queries and keys normalised
    per head over D, the scale (if any) shared by the heads; Identity when model.json qk_norm is off."""
    if not cfg.qk_norm:
        return Identity()
    return make_norm(cfg, cfg.emb_dim // cfg.n_heads, rngs)


class Rotary(nnx.Module):
    """Rotary position embeddings: (B, T, H, D) queries or keys and their positions -> the same, each
    pair of dimensions (i, i + D/2) rotated by the angle position * base^(-2i/D).

    Rotating both q and k makes their dot product depend on the positions only through their
    difference (the test checks it), so a token's key can be cached once, rotated by its own position.
    Float32 throughout; nothing learned.
    """

    def __init__(self, head_dim: int, base: float) -> None:
        self.half, self.base = head_dim // 2, base

    def angles(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """positions (T,) (training, a prefill) or (B, 1) (a decode step) -> cos, sin (..., D/2)."""
        inv_freq = self.base ** (-2.0 * jnp.arange(self.half, dtype=jnp.float32) / (2 * self.half))  # (D/2,)
        angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (T, D/2) or (B, 1, D/2)
        return jnp.cos(angles), jnp.sin(angles)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """x (B, T, H, D); positions (T,) or (B, 1)."""
        cos, sin = (a[..., None, :] for a in self.angles(positions))  # broadcast over H
        x1, x2 = x[..., : self.half], x[..., self.half :]  # (B, T, H, D/2) each
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (B, T, H, D)

    def lanes(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """The same rotation of x (B, T, N*D), heads side by side in the last axis: each head's
        halves swapped by two rolls of the whole axis, the angles and signs tiled over the heads;
        no (B, T, N, D) array."""
        D, N = 2 * self.half, x.shape[-1] // (2 * self.half)
        cos, sin = self.angles(positions)
        cos, sin = jnp.tile(jnp.concatenate([cos, cos], -1), N), jnp.tile(jnp.concatenate([-sin, sin], -1), N)
        first_half = jnp.arange(N * D) % D < self.half
        swapped = jnp.where(first_half, jnp.roll(x, -self.half, -1), jnp.roll(x, self.half, -1))  # (x2, x1) a head
        return x * cos + swapped * sin  # (B, T, N*D)


def norm_lanes(norm: nnx.Module, x: jax.Array, D: int) -> jax.Array:
    """`norm` (qk_norm's: over D) applied to each head of x (B, T, N*D), heads side by side: what
    norm(x.reshape(B, T, N, D)).reshape(x.shape) gives, float32, the statistics of each head summed
    from its D lanes and spread back over them (flax's: E[x^2] and, for LayerNorm, E[x]^2 subtracted)."""
    if isinstance(norm, Identity):
        return x
    x = x.astype(jnp.float32)
    N = x.shape[-1] // D
    mean_of = lambda a: jnp.repeat(a.reshape(*a.shape[:-1], N, D).mean(-1), D, axis=-1)  # noqa: E731 - (..., N*D)
    if isinstance(norm, nnx.RMSNorm):
        mean, var = 0.0, mean_of(x * x)
    else:
        mean = mean_of(x)
        var = jnp.maximum(mean_of(x * x) - mean * mean, 0.0)
    mul = jax.lax.rsqrt(var + norm.epsilon)
    if norm.scale is not None:
        mul = mul * jnp.tile(norm.scale.get_value(), N)
    y = (x - mean) * mul
    bias = getattr(norm, "bias", None)
    return y if bias is None else y + jnp.tile(bias.get_value(), N)


def positions_in_attention(cfg: ModelConfig) -> nnx.Module:
    """What the attention does with positions: Rotary for positions "rotary", else Identity (the
    learned table is added to the embedding, model.GPT)."""
    if cfg.positions != "rotary":
        return Identity()
    return Rotary(cfg.emb_dim // cfg.n_heads, cfg.rope_base)


def _gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)  # GPT-2's tanh approximation


def _relu2(x: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(x))


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"gelu": _gelu, "relu2": _relu2}


def softcap(logits: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(logits / cap) in float32 (model.json logit_softcap), or the logits as they are."""
    if cap is None:
        return logits
    logits = logits.astype(jnp.float32)
    return cap * jnp.tanh(logits / cap)
