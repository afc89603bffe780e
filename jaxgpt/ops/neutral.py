"""The model's matmuls and attention as every backend runs them (GPU, TPU): the neutral `Ops`.

The model (jaxgpt/model/) calls these and nothing else that depends on the hardware:

    ops.linear(x, w)               x (..., K) @ w (K, M) -> (..., M) float32   (transposed=True: w is (M, K))
    ops.dense / ops.dot_general    a dense layer (kernel layout: `kernels_out_in`); the latter nnx.Linear's
    ops.attention(q, k, v, window=w)   causal: q (B, T, H, D), k and v (B, T, Hkv, D), Hkv dividing H
                                   -> (B, T, H*D) float32; each query sees itself and w - 1 earlier tokens
    ops.vecmat(a, b)               a decode step's attention: (..., K) x (..., K, N) -> (..., N) float32
                                   (b's batch axes may be 1 where a's are not: grouped-query heads)

With compute_dtype "bfloat16" every matmul multiplies bfloat16 operands into float32, in both
passes. Attention is cuDNN's where it runs the shapes, else `causal_attention`. CPU forms:
cpu.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax.nnx.nn import dtypes as flax_dtypes
from jax.ad_checkpoint import checkpoint_name

Product = Callable[[str, jax.Array, jax.Array], jax.Array]  # (spec, x, y) -> float32 einsum


def plain_product(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """A backward product as XLA sees fit: one dot_general, float32 accumulation and result."""
    return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, dtype: Any, product: Product = plain_product) -> jax.Array:
    """A two-operand einsum (every index of an operand also in the other or in the output, as in
    any batched matmul) of `dtype` operands into float32, in the backward pass too.

    Both backward products take the cotangent in `dtype` as well (plain autodiff would make them
    float32 or mixed dots), and the forward saves only the `dtype` operands for the backward pass.
    `product` computes the two backward einsums (the CPU's: jaxgpt.cpu.kernels.bf16_product).
    """
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(
    spec: str, a: jax.Array, b: jax.Array, dtype: Any, product: Product
) -> tuple[jax.Array, tuple[Any, ...]]:
    a16, b16 = a.astype(dtype), b.astype(dtype)
    # The primal dtypes ride along as empty arrays (residuals must be JAX values).
    return jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32), (
        a16,
        b16,
        jnp.zeros(0, a.dtype),
        jnp.zeros(0, b.dtype),
    )


def _mixed_einsum_bwd(
    spec: str, dtype: Any, product: Product, res: tuple[Any, ...], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    a16, b16, a_dtype, b_dtype = res
    (sa, sb), so = spec.replace(" ", "").split("->")[0].split(","), spec.split("->")[1].strip()
    g16 = g.astype(dtype)
    da = product(f"{so},{sb}->{sa}", g16, b16)
    db = product(f"{sa},{so}->{sb}", a16, g16)
    return da.astype(a_dtype.dtype), db.astype(b_dtype.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def causal_mask(T: int, window: int | jax.Array | None = None, segments: jax.Array | None = None) -> jax.Array:
    """(T, T) bool: query t sees key s where s <= t and, with a window, t - s < window; with (B, T)
    segments, (B, T, T): and only where both are of the same segment (packed conversations)."""
    t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    mask = s <= t if window is None else (s <= t) & (t - s < window)
    if segments is None:
        return mask
    return mask & (segments[:, :, None] == segments[:, None, :])  # (B, T, T)


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    einsum: Callable[..., jax.Array],
    dropout: Callable[[jax.Array], jax.Array] | None = None,
    window: int | jax.Array | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal softmax attention over all heads at once. q (B, T, H, D), k and v (B, T, Hkv, D) -> (B, T, H*D).

    The two products go through `einsum` (the compute dtype's); scores and softmax are float32;
    `dropout` (if any) applies to the attention weights. Grouped-query keys and values are repeated to
    the H query heads: query head h reads key/value head h // (H / Hkv), as
    jax.nn.dot_product_attention groups them.
    """
    B, T, H, D = q.shape
    if k.shape[2] != H:
        k, v = (jnp.repeat(t, H // k.shape[2], axis=2) for t in (k, v))  # (B, T, H, D)
    att = einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)  # (B, H, T, T) float32
    mask = causal_mask(T, window, segments)  # (T, T), or (B, T, T) with segments
    att = jax.nn.softmax(jnp.where(mask if segments is None else mask[:, None], att, -jnp.inf), axis=-1)
    if dropout is not None:
        att = dropout(att)
    return einsum("bhts,bshd->bthd", att, v).reshape(B, T, H * D)  # (B, T, C)


@dataclass(frozen=True)
class Ops:
    """How one model's matmuls and attention run; built by `select`, never by the model.

    Frozen and hashable: it is a static attribute of the model, part of its nnx graphdef.
    """

    backend: str  # the JAX platform it was chosen for: "cpu", "gpu", "tpu", ...
    compute_dtype: str  # the matmul operands' dtype: model.json compute_dtype, "auto" resolved
    attention_kernel: str  # "cudnn", "xla" or "per_head" (model.json attention, resolved)
    product: Product = plain_product  # the backward products of a bfloat16 matmul
    # How dense weights arrive. None: float32 parameters, cast to compute_dtype at every product
    # (training, evaluation, prefill). Else a decoder's copies (`for_decoding`), made once by
    # `decode_kernel`: stored in this dtype, and laid out (out, in) where `kernels_out_in`.
    weight_dtype: str | None = None
    kernels_out_in: bool = False
    native_matvec: bool = False  # dense layers of a few rows through a native kernel (CpuOps)
    # The attention windows the model's layers have (model.json window_pattern): what a scanned
    # model's traced per-layer window can be, for a kernel that needs it static (cuDNN's).
    windows: tuple[int, ...] = ()
    # The KV cache's dtype; None: the compute dtype, which every attention product rounds keys and values
    # to anyway (a bfloat16 cache computes the same as a float32 one, in half the memory).
    cache_dtype: str | None = None
    # How a decode step writes each row's new key and value into the cache (kv_cache.KVCache.write):
    # "scatter" writes one element per row in place; "select" rewrites the slots the step reads
    # (TpuOps: a TPU copies the whole cache around a scatter).
    cache_write: str = "scatter"
    # Where QK-norm and rotary work: False on (B, T, H, D) heads; True on (B, T, H*D), the heads side by
    # side (layers.norm_lanes, Rotary.lanes): 64-wide heads fill half a TPU lane tile (select: on there).
    qk_lanes: bool = False
    # Value embeddings' rows gathered once for all layers (connections.value_rows) rather than by each
    # layer: a scanned model's backward pass then scatters into the tables once, after its loop, not
    # every layer inside it (TpuOps: on; slower on a CPU at the shakespeare-char 2026 size).
    value_rows_once: bool = False
    # What dense layers hand on (model.json dense_dtype, resolved): their product, bias and what follows
    # them until a norm or the residual stream in this dtype (`dot_general`, `promote_dense`).
    dense_dtype: str = "float32"

    def kv_dtype(self) -> str:
        return self.cache_dtype or self.compute_dtype

    def einsum(self, spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
        """A two-operand einsum in the compute dtype, float32 accumulation and result."""
        if self.compute_dtype == "float32":
            return jnp.einsum(spec, a, b)
        return mixed_einsum(spec, a, b, jnp.dtype(self.compute_dtype), self.product)

    def vecmat(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """Vector-matrix products, a (..., K) and b (..., K, N) -> (..., N) float32, in the compute
        dtype: a decode step's attention, one query row per head against the cache. b's batch axes
        broadcast against a's (the query heads of one key/value head share its cache)."""
        if a.shape[:-1] != b.shape[:-2]:
            dtype = jnp.dtype(self.compute_dtype)
            y = jnp.matmul(a[..., None, :].astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)
            return y[..., 0, :]
        idx = "abcdefgh"[: a.ndim - 1]
        return self.einsum(f"{idx}k,{idx}kn->{idx}n", a, b)

    def decode_compiler_options(self) -> dict[str, Any]:
        """XLA options for a decode step's program."""
        return {}

    def linear(self, x: jax.Array, w: jax.Array, *, transposed: bool = False) -> jax.Array:
        """x (..., K) @ w (K, M), or w (M, K) transposed -> (..., M) float32.

        Weights already in the compute dtype (a decoder's copies) are not cast again: XLA drops
        the pair of converts of nnx.Linear's promotion to float32 and back."""
        idx = "nopqrs"[: x.ndim - 1]
        y = self.einsum(f"{idx}k,{'mk' if transposed else 'km'}->{idx}m", x, w)
        return checkpoint_name(y, "dense")  # kept by model.json remat "dots" (gpt.REMAT_POLICIES)

    def dense(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """A dense layer: x (..., K) and its kernel, (K, M) or, where `kernels_out_in`, (M, K)."""
        return self.linear(x, w, transposed=self.kernels_out_in)

    def dot_general(
        self,
        x: jax.Array,
        w: jax.Array,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        """nnx.Linear's dot_general: x (..., K) contracted with its kernel (see `dense`)."""
        del precision, preferred_element_type, out_sharding  # the compute dtype decides
        assert w.ndim == 2 and dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
        return self.dense(x, w).astype(self.dense_dtype)

    def promote_dense(self, arrays: tuple[Any, Any, Any], dtype: Any = None) -> tuple[Any, Any, Any]:
        """nnx.Linear's promote_dtype: flax's with float32 dense outputs; else the input and kernel as
        they are (the product casts them, and the kernel's gradient stays float32) and the bias in the
        dense dtype, so that the layer's output is in it."""
        if self.dense_dtype == "float32":
            return flax_dtypes.promote_dtype(arrays, dtype=dtype)
        x, w, b = arrays
        return x, w, None if b is None else b.astype(self.dense_dtype)

    def for_decoding(self, rows: int) -> Ops:
        """These operations for a decoder's copy of the model whose steps feed `rows` tokens,
        its dense kernels converted once by `decode_kernel`, so that no step casts a weight:
        kept in the compute dtype, laid out as the model's (CpuOps chooses otherwise)."""
        return dataclasses.replace(self, weight_dtype=self.compute_dtype, kernels_out_in=False)

    def decode_kernel(self, w: jax.Array) -> jax.Array:
        """A dense kernel (K, M) float32 as these decoding operations take it (`for_decoding`): a
        new array, or `w` itself where nothing changes (float32 kernels for several rows)."""
        assert self.weight_dtype is not None, "decode_kernel is for the operations of for_decoding"
        if w.dtype == self.weight_dtype == self.compute_dtype and not self.kernels_out_in:
            return w
        return _decode_kernel(w, self.compute_dtype, self.weight_dtype, self.kernels_out_in)

    def names_residuals(self, T: int, dropout: Callable[[jax.Array], jax.Array] | None) -> bool:
        """Whether attention over T tokens names what its backward pass reads "attention" itself (a
        kernel's output and log-sum-exp); otherwise the model names the attention's output."""
        return False

    def attention(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        dropout: Callable[[jax.Array], jax.Array] | None = None,
        window: int | jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        """Causal attention, q (B, T, H, D), k and v (B, T, Hkv, D) float32 -> (B, T, H*D) float32.

        `window`: tokens each query sees, itself included; an int, a traced per-layer value (a scanned
        model), or None (every earlier token). `segments` (B, T): keys of another segment are hidden too
        (packed conversations). With `dropout` or `segments` attention is spelled out (causal_attention),
        never cuDNN's fused kernel.
        """
        if self.attention_kernel == "cudnn" and dropout is None and segments is None:
            if window is None or isinstance(window, int):
                return _cudnn_attention(q, k, v, self.compute_dtype, window)
            # cuDNN takes a static window: one branch per window the model has, the layer's taken.
            branches = [functools.partial(_cudnn_attention, dtype=self.compute_dtype, window=w) for w in self.windows]
            return jax.lax.switch(jnp.argmax(jnp.asarray(self.windows) == window), branches, q, k, v)
        return causal_attention(q, k, v, self.einsum, dropout, window, segments)


def _cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, dtype: str, window: int | None) -> jax.Array:
    """cuDNN's flash attention (B, T, H, D) -> (B, T, H*D) float32, grouped-query heads as they come,
    a window as jax's (left, right) local_window_size (a window covering T is full attention)."""
    B, T, H, D = q.shape
    dtype = jnp.dtype(dtype)  # cuDNN has no float32 kernel
    local = None if window is None or window >= T else (window - 1, 0)
    y = jax.nn.dot_product_attention(
        q.astype(dtype),
        k.astype(dtype),
        v.astype(dtype),
        is_causal=True,
        local_window_size=local,
        implementation="cudnn",
    )  # (B, T, H, D)
    return y.astype(jnp.float32).reshape(B, T, H * D)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _decode_kernel(w: jax.Array, compute_dtype: str, weight_dtype: str, out_in: bool) -> jax.Array:
    """Ops.decode_kernel's conversion: one small program per kernel shape, compiled once per process."""
    w = w.astype(compute_dtype).astype(weight_dtype)  # the compute dtype's values
    return w.T if out_in else w
