"""What a block receives besides the residual stream: model.json's value embeddings, embedding
skips and U-net skips, chosen once where the model is built (`Connections`). Shapes as in gpt.py.

- `value_embeds` (ResFormer's value residual): layers L-1, L-3, ... each have a (V, K*D) token
  table; v += 3 * sigmoid(x[..., :G] @ W) * ve, W a learned (G, K) gate, G = _GATE_CHANNELS.
- `embed_skips`: before block i, x <- resid[i] * x + x0[i] * x0, x0 the normalised token
  embedding; resid from 1.15 down to 1.05, x0 from 0.20 down to 0.05 (nanochat's).
- `unet_skips` (modded-nanogpt): block L-1-j's input gets block j's output (j < L // 2) times a
  learned weight starting at 1.

The layer number `i` is a Python int, or traced inside scan_layers' `lax.scan`. An option that is
off holds no parameter and does no work; with all off, the model is GPT-2's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgpt.config import ModelConfig

_VALUE_STD = 0.02  # the value tables start like the token table, N(0, 0.02)
_GATE_CHANNELS = 12  # nanochat's: the gate reads this many channels of the block's input
_GATE_INIT = 0.02  # gate weights start uniform in [0, 0.02): gates a little above 3 * sigmoid(0) = 1.5


def value_embed_layers(n_layers: int) -> tuple[int, ...]:
    """The layers with a value table: every other one, counted back from the last (nanochat's has_ve)."""
    return tuple(i for i in range(n_layers) if i % 2 == (n_layers - 1) % 2)


def unet_pairs(n_layers: int) -> int:
    """How many U-net skips: blocks 0..n-1 feed blocks L-1..L-n (n = L // 2; an odd middle block has none)."""
    return n_layers // 2


def _param(value: jax.Array, *axes: str) -> nnx.Param:
    return nnx.Param(value, out_sharding=axes)


class Connections(nnx.Module):
    """model.json's per-layer connections (module docstring). Parameters, each with a leading axis
    named "layers" (one entry per layer, per value table or per skip), so a scan_layers model and an
    unrolled one hold the same arrays; the optimiser routes them by their other axes (muon.py):
    the value tables like the token table, the scalars and gates with the norms."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        L, K, D = cfg.n_layers, cfg.kv_heads, cfg.head_dim
        self.first_skipped = L - unet_pairs(L)  # the first block that takes a U-net skip
        if cfg.embed_skips:
            depth = np.arange(L) / max(L - 1, 1)  # 0 at the first layer, 1 at the last
            self.resid_lambdas = _param(jnp.asarray(1.15 - 0.10 * depth, jnp.float32), "layers")
            self.x0_lambdas = _param(jnp.asarray(0.20 - 0.15 * depth, jnp.float32), "layers")
        if cfg.unet_skips:
            self.skip_weights = _param(jnp.ones(unet_pairs(L), jnp.float32), "layers")
        self.gate_channels = min(_GATE_CHANNELS, cfg.emb_dim)
        layers = value_embed_layers(L) if cfg.value_embeds else ()
        # Per layer: the index of its value table, or -1 (a static tuple: part of the graph).
        self.table_of = tuple(layers.index(i) if i in layers else -1 for i in range(L))
        if layers:
            tables = nnx.initializers.normal(_VALUE_STD)(rngs.params(), (len(layers), cfg.vocab_size, K * D))
            gates = nnx.initializers.uniform(_GATE_INIT)(rngs.params(), (len(layers), self.gate_channels, K))
            self.value_tables = _param(tables, "layers", "vocab", "embed")  # (n, V, K*D)
            self.value_gates = _param(gates, "layers", "gate", "gate")  # (n, G, K)

    def block_input(self, i: int | jax.Array, x: jax.Array, x0: jax.Array, skip: jax.Array | None) -> jax.Array:
        """Block i's input (B, T, C) from the residual stream x, the embedding x0 and, for a block of the
        second half, the U-net skip (the mirrored first-half block's output; None elsewhere)."""
        if skip is not None:
            x = x + self.skip_weights[i - self.first_skipped] * skip
        if hasattr(self, "resid_lambdas"):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
        return x

    def value_rows(self, idx: jax.Array) -> jax.Array | None:
        """Every value table's rows for the (B, T) tokens, (n, B, T, K*D), or None without tables:
        gathered once for all the layers (`Ops.value_rows_once`). Inside a scanned model's loop,
        each layer's own gather has its backward pass scatter into the whole (n, V, K*D) tables, a
        layer at a time, with a table or not (slow on a TPU: docs/log.md); with the rows gathered
        once, the loop hands back their gradients and one scatter after it takes them in."""
        if not hasattr(self, "value_tables"):
            return None
        return self.value_tables.get_value()[:, idx]

    def values(
        self, i: int | jax.Array, idx: jax.Array, rows: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array] | None:
        """Block i's value embedding of the (B, T) tokens: ((B, T, K*D) values, (G, K) gate weights), or
        None where block i has none. Traced `i` (a scanned model): every layer gets a pair, zeros for a
        layer without a table, which adds exactly nothing to its values. `rows`: `value_rows(idx)`,
        or None to gather block i's here."""
        if not hasattr(self, "value_tables"):
            return None
        gates = self.value_gates.get_value()
        if rows is None:
            tables = self.value_tables.get_value()
            pick = lambda j: tables[j, idx]  # noqa: E731 - one gather: no table is sliced out
        else:
            pick = lambda j: rows[j]  # noqa: E731
        if isinstance(i, int):
            j = self.table_of[i]
            return None if j < 0 else (pick(j), gates[j])
        j = jnp.asarray(self.table_of)[i]
        has = (j >= 0).astype(jnp.float32)
        j = jnp.maximum(j, 0)
        return pick(j) * has, gates[j] * has


def mix_values(v: jax.Array, x: jax.Array, values: tuple[jax.Array, jax.Array] | None) -> jax.Array:
    """The attention's values (B, T, K, D) with the layer's value embedding mixed in, gated per head by
    3 * sigmoid of the first G channels of the block's input x (B, T, C), float32. The gate is an
    elementwise product and a sum over G = 12 channels, not a dot: no matmul leaves the compute dtype."""
    if values is None:
        return v
    ve, w = values  # (B, T, K*D), (G, K)
    G = w.shape[0]
    gate = 3.0 * jax.nn.sigmoid(jnp.sum(x[..., :G, None] * w, axis=-2))  # (B, T, G, 1) * (G, K) -> (B, T, K)
    return v + gate[..., None] * ve.reshape(v.shape)  # (B, T, K, D)
