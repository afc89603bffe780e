"""The KV cache a decoder hands the model's forward pass (gpt.py `cached_features`).

Shape legend (gpt.py's): B rows, L layers, K key/value heads, H query heads, D head size, S =
context_length slots.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxgpt.config import ModelConfig


@struct.dataclass
class KVCache:
    """Every layer's keys and values for B rows of up to S = context_length tokens (decoding).

    Layer `layer`'s attention reads and writes its slice (the model sets `layer`); keys are stored
    transposed, (D, S) per head. pos None: a prefill, tokens at positions 0..T-1, every slot rewritten.
    pos (B,): a decode step, row b's token written to slot pos[b], attending to slots 0..pos[b] within
    the first `span` (static: every advancing row has pos < span).
    """

    k: jax.Array  # (L, B, K, D, S) float32: the key/value heads only
    v: jax.Array  # (L, B, K, S, D)
    pos: jax.Array | None = None  # (B,) int32
    layer: jax.Array | int = 0
    span: int = struct.field(pytree_node=False, default=0)

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch_size: int, dtype: str = "float32") -> KVCache:
        """An empty cache; `dtype`: ops.cache_dtype (the attention products round keys and values to
        the compute dtype whatever the cache holds, so a compute-dtype cache computes the same)."""
        L = cfg.n_layers if cfg.architecture == "gpt2" else 0
        H, D, S = cfg.kv_heads, cfg.head_dim, cfg.context_length
        return cls(jnp.zeros((L, batch_size, H, D, S), dtype), jnp.zeros((L, batch_size, H, S, D), dtype))

    def positions(self, T: int) -> jax.Array:
        """The positions of the (B, T) tokens being fed: (T,) for a prefill, (B, 1) for a step."""
        return jnp.arange(T) if self.pos is None else self.pos[:, None]

    def prefill(self, k: jax.Array, v: jax.Array) -> KVCache:
        """Write (B, T, H, D) keys and values to slots 0..T-1 of this layer."""
        at = (self.layer, 0, 0, 0, 0)
        return self.replace(
            k=jax.lax.dynamic_update_slice(self.k, k.transpose(0, 2, 3, 1)[None].astype(self.k.dtype), at),
            v=jax.lax.dynamic_update_slice(self.v, v.transpose(0, 2, 1, 3)[None].astype(self.v.dtype), at),
        )

    def attend(
        self, q: jax.Array, k: jax.Array, v: jax.Array, ops: Any, window: int | jax.Array | None = None
    ) -> tuple[jax.Array, KVCache]:
        """A decode step's attention: (B, H, D) query and (B, K, D) key and value of each row's new
        token -> (B, H*D) float32 and the cache with the key and value in slot pos[b] (`write`). Both
        products are one row per (b, h) against the cache (ops.vecmat), the H / K query heads of a
        key/value head against its one cache; a window hides slots pos - window and before."""
        B, H, D = q.shape
        K = k.shape[1]
        keys, values, cache = self.write(k, v, ops.cache_write)  # (B, K, D, span), (B, K, span, D)
        q = q.reshape(B, K, H // K, D)  # query head h = k * (H / K) + g
        # (B, K, G, D) x (B, K, 1, D, span) -> (B, K, G, span) float32
        att = ops.vecmat(q, keys[:, :, None]) / math.sqrt(D)
        slots, pos = jnp.arange(self.span), self.pos[:, None, None, None]  # (span,), (B, 1, 1, 1)
        visible = slots <= pos if window is None else (slots <= pos) & (slots > pos - window)
        att = jax.nn.softmax(jnp.where(visible, att, -jnp.inf), axis=-1)
        y = ops.vecmat(att, values[:, :, None])  # (B, K, G, span) x (B, K, 1, span, D) -> (B, K, G, D)
        return y.reshape(B, H * D), cache

    def write(self, k: jax.Array, v: jax.Array, how: str) -> tuple[jax.Array, jax.Array, KVCache]:
        """Row b's new (B, K, D) key and value into slot pos[b] of this layer: the layer's first `span`
        slots after it, keys (B, K, D, span) and values (B, K, span, D), and the cache holding them.

        "scatter": one element per row, in place (the CPU's, the GPU's). "select" (the TPU's): the span's
        slots read, slot pos[b] of row b replaced, and the span written back whole. A TPU lays a
        scatter's operand out anew: XLA copies the whole cache to another layout and back around every
        decode program; the select, over slots the step reads anyway, needs no copy (docs/log.md, "The
        KV cache's write on the TPU")."""
        layer, span, pos = self.layer, self.span, self.pos
        if how == "scatter":
            rows = jnp.arange(k.shape[0])
            cache = self.replace(
                k=self.k.at[layer, rows, :, :, pos].set(k.astype(self.k.dtype)),
                v=self.v.at[layer, rows, :, pos].set(v.astype(self.v.dtype)),
            )
            return cache.k[layer, :, :, :, :span], cache.v[layer, :, :, :span], cache
        assert how == "select", how
        hit = jnp.arange(span) == pos[:, None]  # (B, span): a row whose slot is past the span writes nothing
        keys = jnp.where(hit[:, None, None], k[..., None].astype(self.k.dtype), self.k[layer, :, :, :, :span])
        values = jnp.where(hit[:, None, :, None], v[:, :, None].astype(self.v.dtype), self.v[layer, :, :, :span])
        at = (layer, 0, 0, 0, 0)
        cache = self.replace(
            k=jax.lax.dynamic_update_slice(self.k, keys[None], at),
            v=jax.lax.dynamic_update_slice(self.v, values[None], at),
        )
        return keys, values, cache
