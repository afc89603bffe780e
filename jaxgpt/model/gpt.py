"""GPT-2 (and its modern variants) and the A-to-A sanity-check model in Flax NNX.

Shape legend: B = batch, T = sequence length, C = emb_dim, H = n_heads, D = C // H (head size),
K = n_kv_heads (key/value heads, K divides H), V = vocab_size, L = n_layers.

Both models take int32 token ids (B, T) and return float32 logits (B, T, V). Every matmul and the
attention go through `self.ops` (jaxgpt/ops/); placement and sharding are the caller's. Dropout is
active exactly when the caller passes `rngs`; without it the model is deterministic. Decoding runs
the same forward with a `KVCache` (`cached_features`); training passes none. model.json chooses
the parts once, where each module is built (layers.py, connections.py), and how they run
(`compute_dtype`, `attention`, `remat`, `scan_layers`, `loss_chunk`) without changing what they
compute: docs/configs.md "model.json".
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxgpt.config import ModelConfig
from jaxgpt.model.connections import Connections, mix_values, unet_pairs
from jaxgpt.model.kv_cache import KVCache
from jaxgpt.model.layers import (
    ACTIVATIONS,
    Identity,
    Rotary,
    make_norm,
    norm_lanes,
    positions_in_attention,
    qk_norm,
    softcap,
)
from jaxgpt.model.layers import normal as _normal
from jaxgpt.model.layers import zeros as _zeros
from jaxgpt.ops import Ops
from jaxgpt.ops import select as select_ops

_STD = 0.02  # GPT-2's init: N(0, 0.02) for every matrix ...
# model.json remat -> what jax.checkpoint keeps of a block: "dots" the values ops.linear and the attention
# name (checkpoint_name), the others nothing but the block's input.
REMAT_POLICIES = {
    True: None,
    "full": None,
    "dots": jax.checkpoint_policies.save_only_these_names("dense", "attention"),
    "attention": jax.checkpoint_policies.save_only_these_names("attention"),
}

# Every parameter carries logical axis names (layers.normal/zeros/ones); jaxgpt/distributed/sharding.py maps them onto
# the device mesh ("heads", "qkv", "mlp", "vocab" -> tensor parallel; "embed" -> FSDP when asked), so
# this file never names a device or a mesh axis. The optimiser routes parameters by the same names
# (muon.py).


Packed = tuple[jax.Array, jax.Array]  # rows of several conversations: (B, T) segments and (B, T) positions


def segment_positions(segments: jax.Array) -> jax.Array:
    """(B, T) segment ids -> (B, T) int32 positions counted from each segment's first token."""
    T = segments.shape[-1]
    t = jnp.arange(T, dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    return t - jax.lax.cummax(jnp.where(first, t, 0), axis=1)


def _dropout(x: jax.Array, layer: nnx.Dropout, rngs: nnx.Rngs | None) -> jax.Array:
    return layer(x, deterministic=rngs is None, rngs=rngs)


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops, *, rngs: nnx.Rngs):
        C, K, D = cfg.emb_dim, cfg.kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads = cfg.n_heads, K
        self.drop_rate = cfg.drop_rate
        self.ops = ops
        if K == cfg.n_heads:
            # "qkv": three (C, C) matrices side by side (q | k | v), sharded as "heads"; its own name, so
            # that Muon orthogonalises each of the three, not the (C, 3C) whole (muon.py).
            self.qkv = nnx.Linear(
                C,
                3 * C,
                use_bias=cfg.qkv_bias,
                kernel_init=_normal(_STD, "embed", "qkv"),
                bias_init=_zeros("qkv"),
                dot_general=ops.dot_general,
                promote_dtype=ops.promote_dense,
                rngs=rngs,
            )
        else:  # grouped-query attention: the queries' (C, C), and "kv": K key heads | K value heads (C, 2KD)
            self.q = nnx.Linear(
                C,
                C,
                use_bias=cfg.qkv_bias,
                kernel_init=_normal(_STD, "embed", "heads"),
                bias_init=_zeros("heads"),
                dot_general=ops.dot_general,
                promote_dtype=ops.promote_dense,
                rngs=rngs,
            )
            self.kv = nnx.Linear(
                C,
                2 * K * D,
                use_bias=cfg.qkv_bias,
                kernel_init=_normal(_STD, "embed", "kv"),
                bias_init=_zeros("kv"),
                dot_general=ops.dot_general,
                promote_dtype=ops.promote_dense,
                rngs=rngs,
            )
        self.proj = nnx.Linear(
            C,
            C,
            use_bias=cfg.bias,
            kernel_init=_residual_init(cfg, "heads", "embed"),
            bias_init=_zeros("embed"),
            dot_general=ops.dot_general,
            promote_dtype=ops.promote_dense,
            rngs=rngs,
        )
        self.q_norm, self.k_norm = qk_norm(cfg, rngs), qk_norm(cfg, rngs)  # Identity unless qk_norm
        self.rotary = positions_in_attention(cfg)  # Identity unless positions "rotary"
        self.attn_drop = nnx.Dropout(cfg.drop_rate)
        self.resid_drop = nnx.Dropout(cfg.drop_rate)

    def _project(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(B, T, C) -> queries (B, T, H, D), keys and values (B, T, K, D); queries and keys normalised
        (qk_norm) and rotated (rotary), on the heads or, with ops.qk_lanes, before they are split."""
        B, T, C = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, C // self.n_heads
        if K == H:
            q, k, v = jnp.split(self.qkv(x), 3, axis=-1)  # 3 x (B, T, C)
        else:
            q, (k, v) = self.q(x), jnp.split(self.kv(x), 2, axis=-1)  # (B, T, C), 2 x (B, T, KD)
        if self.ops.qk_lanes:
            rotate = self.rotary.lanes if isinstance(self.rotary, Rotary) else lambda a, _: a
            q, k = (rotate(norm_lanes(n, a, D), positions) for n, a in ((self.q_norm, q), (self.k_norm, k)))
            return q.reshape(B, T, H, D), k.reshape(B, T, K, D), v.reshape(B, T, K, D)
        q, k = q.reshape(B, T, H, D), k.reshape(B, T, K, D)
        q, k = self.rotary(self.q_norm(q), positions), self.rotary(self.k_norm(k), positions)
        return q, k, v.reshape(B, T, K, D)

    def __call__(
        self,
        x: jax.Array,
        rngs: nnx.Rngs | None = None,
        cache: KVCache | None = None,
        values: tuple[jax.Array, jax.Array] | None = None,
        window: int | jax.Array | None = None,
        packed: Packed | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """(B, T, C) -> (B, T, C), and the cache with this layer's keys and values (None in training).
        `values`: the layer's value embedding and gate (connections.py), or None; `window`: tokens
        each query sees, itself included (None: every earlier one); `packed`: the rows' segments and
        positions (rows of several conversations: each attends within its own)."""
        T = x.shape[1]
        if packed is not None:
            positions = packed[1]  # (B, T): each conversation from 0
        else:
            positions = jnp.arange(T) if cache is None else cache.positions(T)  # (T,) or (B, 1)
        q, k, v = self._project(x, positions)  # (B, T, H, D), (B, T, K, D), (B, T, K, D)
        v = mix_values(v, x, values)
        if cache is not None and cache.pos is not None:  # a decode step: T = 1
            y, cache = cache.attend(q[:, 0], k[:, 0], v[:, 0], self.ops, window)
            return self.proj(y[:, None]), cache  # (B, 1, C)
        dropout = None
        if rngs is not None and self.drop_rate > 0.0:
            dropout = lambda att: _dropout(att, self.attn_drop, rngs)  # noqa: E731 - on the attention weights
        y = self.ops.attention(q, k, v, dropout, window, None if packed is None else packed[0])  # (B, T, C)
        if not self.ops.names_residuals(T, dropout):  # a kernel that names its own keeps them: not this copy too
            y = checkpoint_name(y, "attention")  # kept by model.json remat "attention" and "dots"
        if cache is not None:
            cache = cache.prefill(k, v)
        return _dropout(self.proj(y), self.resid_drop, rngs), cache  # (B, T, C)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops, *, rngs: nnx.Rngs):
        C = cfg.emb_dim
        self.fc = nnx.Linear(
            C,
            4 * C,
            use_bias=cfg.bias,
            kernel_init=_normal(_STD, "embed", "mlp"),
            bias_init=_zeros("mlp"),
            dot_general=ops.dot_general,
            promote_dtype=ops.promote_dense,
            rngs=rngs,
        )
        self.out = nnx.Linear(
            4 * C,
            C,
            use_bias=cfg.bias,
            kernel_init=_residual_init(cfg, "mlp", "embed"),
            bias_init=_zeros("embed"),
            dot_general=ops.dot_general,
            promote_dtype=ops.promote_dense,
            rngs=rngs,
        )
        self.act = ACTIVATIONS[cfg.mlp]  # GPT-2's tanh GELU, or ReLU squared
        self.drop = nnx.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        h = self.act(self.fc(x))  # (B, T, 4C)
        return _dropout(self.out(h), self.drop, rngs)  # (B, T, C)


def _residual_init(cfg: ModelConfig, *axes: str) -> nnx.Initializer:
    """The projections that write into the residual stream: N(0, 0.02 / sqrt(2L)), so the residual's
    variance does not grow with depth (GPT-2 paper, 2.3); or zeros (model.json zero_init_proj: each
    block starts as the identity, as in modded-nanogpt and nanochat)."""
    return _zeros(*axes) if cfg.zero_init_proj else _normal(_STD / math.sqrt(2 * cfg.n_layers), *axes)


class Block(nnx.Module):
    """One pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, ops: Ops, *, rngs: nnx.Rngs):
        self.ln1 = make_norm(cfg, cfg.emb_dim, rngs)
        self.attn = CausalSelfAttention(cfg, ops, rngs=rngs)
        self.ln2 = make_norm(cfg, cfg.emb_dim, rngs)
        self.mlp = MLP(cfg, ops, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        rngs: nnx.Rngs | None = None,
        cache: KVCache | None = None,
        values: tuple[jax.Array, jax.Array] | None = None,
        window: int | jax.Array | None = None,
        packed: Packed | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        y, cache = self.attn(self.ln1(x), rngs, cache, values, window, packed)
        x = x + y  # (B, T, C)
        return x + self.mlp(self.ln2(x), rngs), cache  # (B, T, C)


class GPT(nnx.Module):
    """GPT-2: token embedding (+ a learned position table), L blocks, final norm, output head.

    model.json's modern options (layers.py) change what the parts are, not how they are wired:
    rotary positions live in the attention (no table here), `embed_norm` normalises the token
    embedding, the logits may be soft-capped (head_logits)."""

    def __init__(self, cfg: ModelConfig, ops: Ops, *, rngs: nnx.Rngs):
        self.cfg, self.ops = cfg, ops
        self.tok_emb = nnx.Embed(cfg.vocab_size, cfg.emb_dim, embedding_init=_normal(_STD, "vocab", "embed"), rngs=rngs)
        if cfg.positions == "learned":
            self.pos_emb = nnx.Embed(
                cfg.context_length, cfg.emb_dim, embedding_init=_normal(_STD, "ctx", "embed"), rngs=rngs
            )
        self.emb_norm = make_norm(cfg, cfg.emb_dim, rngs) if cfg.embed_norm else Identity()
        self.drop = nnx.Dropout(cfg.drop_rate)
        # Built one by one in both layouts, so a stacked model has exactly the unstacked one's weights.
        blocks = [Block(cfg, ops, rngs=rngs) for _ in range(cfg.n_layers)]
        self.blocks = _stack(blocks) if cfg.scan_layers else nnx.List(blocks)  # stacked: leaves (L, ...)
        self.ln_f = make_norm(cfg, cfg.emb_dim, rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(
                cfg.emb_dim, cfg.vocab_size, use_bias=False, kernel_init=_normal(_STD, "embed", "vocab"), rngs=rngs
            )
        # Built last: a model with connections starts from the weights of the same model without.
        self.connections = Connections(cfg, rngs)

    def __call__(self, idx: jax.Array, rngs: nnx.Rngs | None = None, segments: jax.Array | None = None) -> jax.Array:
        return self.logits(self.features(idx, rngs, segments))  # (B, T, V)

    def features(self, idx: jax.Array, rngs: nnx.Rngs | None = None, segments: jax.Array | None = None) -> jax.Array:
        """Everything before the head: (B, T) token ids -> (B, T, C) float32, after ln_f.

        segments: (B, T) int32 ids of the conversations packed into each row (jaxgpt/conversations/rows.py;
        0: padding), or None (a row is one text): with them, positions restart at each conversation
        and no token attends to another conversation's, so each is computed as if alone."""
        return self._forward(idx, rngs, None, segments)[0]

    def cached_features(self, idx: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """The same forward pass for decoding: (B, T) ids at the cache's positions (a prefill, or
        T = 1 for a decode step) -> (B, T, C) features and the updated cache. No dropout."""
        return self._forward(idx, None, cache)

    def _forward(
        self, idx: jax.Array, rngs: nnx.Rngs | None, cache: KVCache | None, segments: jax.Array | None = None
    ) -> tuple[jax.Array, KVCache | None]:
        packed = None if segments is None else (segments, segment_positions(segments))  # (B, T) each
        x = x0 = self._embed(idx, rngs, cache, packed)  # (B, T, C); x0: what embedding skips blend back in
        graphdef, states = _block_states(self)
        keys = None if rngs is None else jax.random.split(rngs.dropout(), self.cfg.n_layers)  # (L,) dropout keys
        windows = self.cfg.layer_windows() if self.cfg.window_pattern else None
        value_rows = self.connections.value_rows(idx) if self.ops.value_rows_once else None  # (n, B, T, K*D)

        def run(
            state: nnx.State,
            x: jax.Array,
            key: jax.Array | None,
            cache: KVCache | None,
            values: Any,
            window: Any,
            packed: Packed | None,
        ) -> tuple[jax.Array, KVCache | None]:
            return nnx.merge(graphdef, state)(
                x, None if key is None else nnx.Rngs(dropout=key), cache, values, window, packed
            )

        if self.cfg.remat:  # keep each block's input (and with "dots" its products); recompute the rest
            # Inside a scan the loop itself keeps XLA from merging the recomputation back into
            # the forward pass; unrolled, jax.checkpoint's optimization barriers must. An unrolled
            # layer's window is static (a kernel may need it so).
            run = jax.checkpoint(
                run,
                prevent_cse=not self.cfg.scan_layers,
                static_argnums=() if self.cfg.scan_layers else (5,),
                policy=REMAT_POLICIES[self.cfg.remat],
            )

        def layer(
            i: int | jax.Array,
            state: nnx.State,
            x: jax.Array,
            key: jax.Array | None,
            cache: KVCache | None,
            skip: jax.Array | None,
        ) -> tuple[jax.Array, KVCache | None]:
            """Block i (an int, or traced inside a scan) on the residual stream x (B, T, C)."""
            x = self.connections.block_input(i, x, x0, skip)
            window = None if windows is None else windows[i] if isinstance(i, int) else jnp.asarray(windows)[i]
            return run(
                state,
                x,
                key,
                None if cache is None else cache.replace(layer=i),
                self.connections.values(i, idx, value_rows),
                window,
                packed,
            )

        run_blocks = _scanned if self.cfg.scan_layers else _unrolled
        x, cache = run_blocks(
            layer, states, keys, x, cache, unet_pairs(self.cfg.n_layers) if self.cfg.unet_skips else 0
        )
        return self.ln_f(x), cache

    def _embed(self, idx: jax.Array, rngs: nnx.Rngs | None, cache: KVCache | None, packed: Packed | None) -> jax.Array:
        """(B, T) ids -> (B, T, C): the token embedding (normalised if asked), the position table's
        row for each token's position (learned positions), dropout."""
        T = idx.shape[1]
        x = self.emb_norm(self.tok_emb(idx))  # (B, T, C)
        if self.cfg.positions == "learned":
            positions = packed[1] if packed is not None else jnp.arange(T) if cache is None else cache.positions(T)
            x = x + self.pos_emb(positions)  # (T,), (B, 1) or (B, T) positions
        return _dropout(x, self.drop, rngs)

    def logits(self, x: jax.Array) -> jax.Array:
        """The output head: (..., C) -> (..., V) float32 logits."""
        return head_logits(self.ops, self.cfg, head_weight(self), x)


class AToA(nnx.Module):
    """The blog post's A-to-A model (the harness's sanity check): the embedding straight into the head."""

    def __init__(self, cfg: ModelConfig, ops: Ops, *, rngs: nnx.Rngs):
        self.cfg, self.ops = cfg, ops
        self.tok_emb = nnx.Embed(cfg.vocab_size, cfg.emb_dim, embedding_init=_normal(_STD, "vocab", "embed"), rngs=rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(
                cfg.emb_dim, cfg.vocab_size, use_bias=False, kernel_init=_normal(_STD, "embed", "vocab"), rngs=rngs
            )

    def __call__(self, idx: jax.Array, rngs: nnx.Rngs | None = None, segments: jax.Array | None = None) -> jax.Array:
        return self.logits(self.features(idx, rngs))  # (B, T, V)

    def features(self, idx: jax.Array, rngs: nnx.Rngs | None = None, segments: jax.Array | None = None) -> jax.Array:
        return self.tok_emb(idx)  # (B, T, C); no token sees another, so segments change nothing

    def cached_features(self, idx: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        return self.tok_emb(idx), cache  # no layers: nothing to cache

    def logits(self, x: jax.Array) -> jax.Array:
        return head_logits(self.ops, self.cfg, head_weight(self), x)  # (..., V)


def head_weight(model: GPT | AToA) -> jax.Array:
    """The output head's matrix: the token embedding (V, C) when tied, else the head kernel (C, V)."""
    return model.tok_emb.embedding.get_value() if model.cfg.tie_embeddings else model.head.kernel.get_value()


def head_logits(ops: Ops, cfg: ModelConfig, w: jax.Array, x: jax.Array) -> jax.Array:
    """(..., C) features and head_weight -> (..., V) float32 logits, soft-capped if model.json asks:
    a pure function, for the chunked loss and HellaSwag's rows as for the full forward."""
    logits = ops.linear(x, w, transposed=True) if cfg.tie_embeddings else ops.dense(x, w)  # tied: the (V, C) embedding
    return softcap(logits, cfg.logit_softcap)


def _stack(blocks: list[Block]) -> Block:
    """One Block whose parameters are the blocks' stacked along a new leading "layers" axis."""
    graphdef = nnx.graphdef(blocks[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
    block = nnx.merge(graphdef, stacked)
    for _path, var in nnx.to_flat_state(nnx.state(block, nnx.Param)):
        names = var.get_metadata().get("out_sharding")
        if names is not None:
            var.set_metadata(out_sharding=("layers", *names))
    return block


Layer = Any  # GPT._forward's layer(i, state, x, key, cache, skip) -> (x, cache)


def _unrolled(
    layer: Layer, states: list[nnx.State], keys: jax.Array | None, x: jax.Array, cache: KVCache | None, pairs: int
) -> tuple[jax.Array, KVCache | None]:
    """The blocks one after the other; the first `pairs` blocks' outputs feed the last `pairs`
    blocks' inputs, mirrored (U-net skips; 0: none)."""
    L, skips = len(states), []
    for i, state in enumerate(states):
        skip = skips.pop() if i >= L - pairs else None
        x, cache = layer(i, state, x, None if keys is None else keys[i], cache, skip)  # (B, T, C)
        if i < pairs:
            skips.append(x)
    return x, cache


def _scanned(
    layer: Layer, states: nnx.State, keys: jax.Array | None, x: jax.Array, cache: KVCache | None, pairs: int
) -> tuple[jax.Array, KVCache | None]:
    """The stacked blocks by lax.scan, the whole cache in the carry; with U-net skips three scans
    (the first `pairs` blocks keeping their outputs, the middle, the last `pairs` taking them back
    in reverse), so that every block is still compiled once per scan."""
    L = len(jax.tree.leaves(states)[0])
    cache = None if cache is None else cache.replace(layer=jnp.int32(0))

    def scan(
        lo: int, hi: int, x: jax.Array, cache: KVCache | None, skips: jax.Array | None = None, keep: bool = False
    ) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        part = (lambda t: t) if (lo, hi) == (0, L) else (lambda t: jax.tree.map(lambda a: a[lo:hi], t))

        def step(carry: tuple[jax.Array, KVCache | None], xs: tuple[Any, ...]) -> tuple[Any, jax.Array | None]:
            (x, cache), (state, key, i, skip) = carry, xs
            x, cache = layer(i, state, x, key, cache, skip)
            return (x, cache), x if keep else None

        (x, cache), outs = jax.lax.scan(
            step, (x, cache), (part(states), None if keys is None else part(keys), jnp.arange(lo, hi), skips)
        )
        return x, cache, outs

    if not pairs:
        return scan(0, L, x, cache)[:2]
    x, cache, outs = scan(0, pairs, x, cache, keep=True)  # outs (pairs, B, T, C)
    if L > 2 * pairs:
        x, cache, _ = scan(pairs, L - pairs, x, cache)
    return scan(L - pairs, L, x, cache, skips=outs[::-1])[:2]


def _block_states(model: GPT) -> tuple[nnx.GraphDef, Any]:
    """(graphdef of one block, its state stacked (L, ...) or a list of L states)."""
    if model.cfg.scan_layers:
        return nnx.split(model.blocks)
    if not len(model.blocks):
        return None, []
    graphdef = nnx.graphdef(model.blocks[0])
    return graphdef, [nnx.state(b) for b in model.blocks]


def matrix_mask(params: Any) -> Any:
    """True for each weight matrix (what AdamW decays), False for biases and LayerNorm vectors.

    Decided by the per-layer rank: a scan_layers model's stacked bias (L, C) is still a bias.
    """

    def is_matrix(path: tuple[Any, ...], p: Any) -> bool:
        keys = [getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path]
        stacked = (
            len(keys) > 1 and keys[0] == "blocks" and not str(keys[1]).isdigit()
        )  # blocks.attn..., not blocks.0...
        return jnp.ndim(p) - int(stacked) >= 2

    return jax.tree_util.tree_map_with_path(is_matrix, params)


def stack_layer_weights(tensors: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """Per-layer keys ("blocks.3.attn.qkv.kernel") -> a scan_layers model's stacked keys
    ("blocks.attn.qkv.kernel", leading axis L). Checkpoints and exports always use per-layer
    keys, so they do not depend on `scan_layers`. A parameter missing for some layer is left
    per-layer, for the caller's key check to report."""
    out: dict[str, Any] = {}
    per_layer: dict[str, dict[int, Any]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[0] == "blocks" and len(parts) > 2 and parts[1].isdigit():
            per_layer.setdefault(".".join(["blocks", *parts[2:]]), {})[int(parts[1])] = value
        else:
            out[key] = value
    for key, layers in per_layer.items():
        if sorted(layers) == list(range(n_layers)):
            out[key] = np.stack([np.asarray(layers[i]) for i in range(n_layers)])
        else:
            out.update({f"blocks.{i}.{key[7:]}": v for i, v in layers.items()})
    return out


def unstack_layer_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """The inverse of stack_layer_weights."""
    out: dict[str, Any] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[0] == "blocks" and not parts[1].isdigit():
            out.update({f"blocks.{i}.{key[7:]}": value[i] for i in range(value.shape[0])})
        else:
            out[key] = value
    return out


def build_model(cfg: ModelConfig, seed: int = 0, ops: Ops | None = None) -> nnx.Module:
    """A freshly initialised model; the parameters are a pure function of the seed.

    `ops`: how its matmuls and attention run (default: ops.select(cfg), for JAX's default
    backend; the parameters do not depend on it). Arrays are created unsharded (on the default
    device, or wherever an enclosing jit puts them); sharding.create_sharded places them on a mesh.
    """
    ops = ops or select_ops(cfg)
    rngs = nnx.Rngs(params=seed)
    with nnx.use_eager_sharding(False):
        return GPT(cfg, ops, rngs=rngs) if cfg.architecture == "gpt2" else AToA(cfg, ops, rngs=rngs)


def abstract_model(cfg: ModelConfig, ops: Ops | None = None) -> nnx.Module:
    """The model's structure with shape-only leaves: for loading weights without a wasted init."""
    ops = ops or select_ops(cfg)  # outside the trace: selecting may probe the backend
    return nnx.eval_shape(lambda: build_model(cfg, ops=ops))


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
