"""The model's matmuls and attention behind one backend-neutral interface, chosen once.

model.py calls these operations and nothing else that depends on the hardware:

    ops.linear(x, w)               x (..., K) @ w (K, M) -> (..., M) float32   (transposed=True: w is (M, K))
    ops.dense / ops.dot_general    a dense layer (its kernel as `kernels_out_in` says), the latter as nnx.Linear calls it
    ops.attention(q, k, v)         causal softmax attention, (B, T, H, D) each -> (B, T, H*D) float32
    ops.vecmat(a, b)               a decode step's attention products: (..., K) x (..., K, N) -> (..., N) float32

`select(cfg, backend)` decides, once per model config and backend, how they run:

- compute_dtype "auto" resolves here, once, on the backend the model is built for
  (`resolve_compute_dtype`): bfloat16 on GPU / TPU and on a CPU with native bfloat16 dot
  products (cpu_kernels.auto_compute_dtype: the AVX512_BF16 or AMX-BF16 flags), float32 on
  other CPUs. `Ops.compute_dtype` is the resolved one; the trainer records it in meta.json.
- every backend: with compute_dtype "bfloat16" each matmul multiplies bfloat16 operands into a
  float32 result (float32 accumulation), in the forward pass and in both backward products, as
  torch.autocast does; parameters, activations, LayerNorm, softmax and the loss stay float32.
- GPU / TPU (the standard recipe): plain dot_generals, laid out by XLA as it likes (cuBLAS /
  the MXU take transposed operands for free); attention is cuDNN's flash attention through
  `jax.nn.dot_product_attention` where cuDNN can run the model's shapes in bfloat16, otherwise
  XLA's batched-head attention (`causal_attention` below), with a one-line note saying why.
- CPU: the XLA:CPU forms of `cpu_kernels.py` (backward products laid out for its bfloat16 dot,
  dense layers on (N, K) rows, attention one head at a time, decode attention as a fused sum).
  They run on the CPU only.

`Ops.for_decoding(rows)` gives the operations of a decoder's copy of the model (generate.py):
its dense kernels converted once (`decode_kernel`) into the form its steps multiply as they are.
On the CPU a bfloat16 decoder's dense layers run cpu_matvec's native kernel where it can be built
(XLA:CPU has no bfloat16 matrix-vector product) on up to cpu_matvec.MAX_ROWS rows, XLA's bfloat16
dots on more (the same copy prefills a prompt).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

import cpu_kernels
import cpu_matvec
from config import MODEL_FILE, ConfigError, ModelConfig

Product = Callable[[str, jax.Array, jax.Array], jax.Array]  # (spec, x, y) -> float32 einsum


def plain_product(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """A backward product as XLA sees fit: one dot_general, float32 accumulation and result."""
    return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, dtype: Any, product: Product = plain_product) -> jax.Array:
    """A two-operand einsum (every index of an operand also in the other or in the output, as in
    any batched matmul) of `dtype` operands into float32, in the backward pass too.

    Plain autodiff of `einsum(a16, b16, preferred_element_type=float32)` would multiply the
    float32 cotangent with a bfloat16 operand: a float32 (or mixed) dot. Here both backward
    products take the cotangent in `dtype` too, and the forward keeps only the `dtype` operands
    for the backward pass (half the saved-activation memory). `product` computes the two
    backward einsums (the CPU passes its own layouts, cpu_kernels.bf16_product).
    """
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(spec: str, a: jax.Array, b: jax.Array, dtype: Any,
                      product: Product) -> tuple[jax.Array, tuple[Any, ...]]:
    a16, b16 = a.astype(dtype), b.astype(dtype)
    # The primal dtypes ride along as empty arrays (residuals must be JAX values).
    return jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32), (
        a16, b16, jnp.zeros(0, a.dtype), jnp.zeros(0, b.dtype))


def _mixed_einsum_bwd(spec: str, dtype: Any, product: Product, res: tuple[Any, ...],
                      g: jax.Array) -> tuple[jax.Array, jax.Array]:
    a16, b16, a_dtype, b_dtype = res
    (sa, sb), so = spec.replace(" ", "").split("->")[0].split(","), spec.split("->")[1].strip()
    g16 = g.astype(dtype)
    da = product(f"{so},{sb}->{sa}", g16, b16)
    db = product(f"{sa},{so}->{sb}", a16, g16)
    return da.astype(a_dtype.dtype), db.astype(b_dtype.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, einsum: Callable[..., jax.Array],
                     dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """Causal softmax attention over all heads at once. q, k, v: (B, T, H, D) -> (B, T, H*D).

    The two products go through `einsum` (the compute dtype's), scores and softmax are float32,
    and `dropout` (if any) applies to the attention weights.
    """
    B, T, H, D = q.shape
    att = einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)  # (B, H, T, T) float32
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
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
    rows_dense: bool = False  # dense layers on (N, K) rows: flatten the leading axes first
    # How dense weights arrive. None: float32 parameters, cast to compute_dtype at every product
    # (training, evaluation, prefill). Else a decoder's copies (`for_decoding`), made once by
    # `decode_kernel`: stored in this dtype, and laid out (out, in) where `kernels_out_in`.
    weight_dtype: str | None = None
    kernels_out_in: bool = False
    native_matvec: bool = False  # dense layers of up to MAX_ROWS rows through cpu_matvec (bfloat16 (out, in) kernels)

    def einsum(self, spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
        """A two-operand einsum in the compute dtype, float32 accumulation and result."""
        if self.compute_dtype == "float32":
            return jnp.einsum(spec, a, b)
        return mixed_einsum(spec, a, b, jnp.dtype(self.compute_dtype), self.product)

    def vecmat(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """Vector-matrix products, a (..., K) and b (..., K, N) -> (..., N) float32, in the compute
        dtype: a decode step's attention, one query row per head against the cache (on the CPU
        cpu_kernels.vecmat, its step compiled with decode_compiler_options)."""
        if self.backend == "cpu":
            return cpu_kernels.vecmat(a, b, self.compute_dtype)
        idx = "abcdefgh"[:a.ndim - 1]
        return self.einsum(f"{idx}k,{idx}kn->{idx}n", a, b)

    def decode_compiler_options(self) -> dict[str, Any]:
        """XLA options for a decode step's program (cpu_kernels.DECODE_COMPILER_OPTIONS on the CPU)."""
        return dict(cpu_kernels.DECODE_COMPILER_OPTIONS) if self.backend == "cpu" else {}

    def linear(self, x: jax.Array, w: jax.Array, *, transposed: bool = False) -> jax.Array:
        """x (..., K) @ w (K, M), or w (M, K) transposed -> (..., M) float32."""
        lead = x.shape[:-1]
        if self.rows_dense:
            x = x.reshape(-1, x.shape[-1])  # (N, K)
        idx = "nopqrs"[:x.ndim - 1]
        spec = f"{idx}k,{'mk' if transposed else 'km'}->{idx}m"
        if self.native_matvec and x.shape[0] <= cpu_matvec.MAX_ROWS:
            # x rounded to bfloat16, as every bfloat16 product rounds it; the kernel widens it back.
            # nnx.Linear hands its bfloat16 kernel over promoted to x's float32: cast back, XLA
            # drops the pair of converts (the decode step's program converts no weight).
            y = cpu_matvec.matvec(x.astype(self.compute_dtype).astype(jnp.float32), w.astype(jnp.bfloat16))
        elif self.weight_dtype == "float32" and self.compute_dtype != "float32":
            # float32 weights holding compute-dtype values (for_decoding): x rounded alike, the
            # float32 product of the same values, which is how XLA:CPU itself runs a bfloat16 dot
            # with one row (it upcasts both operands).
            y = jnp.einsum(spec, x.astype(self.compute_dtype).astype(jnp.float32), w)
        else:
            # Weights already in the compute dtype are not cast again; nor are a native decoder's
            # bfloat16 kernels past MAX_ROWS rows (a prefill's), which nnx.Linear promoted to float32:
            # XLA drops the pair of converts.
            y = self.einsum(spec, x, w)
        return y.reshape(*lead, y.shape[-1])

    def dense(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """A dense layer: x (..., K) and its kernel, (K, M) or, where `kernels_out_in`, (M, K)."""
        return self.linear(x, w, transposed=self.kernels_out_in)

    def dot_general(self, x: jax.Array, w: jax.Array, dimension_numbers: Any, precision: Any = None,
                    preferred_element_type: Any = None, out_sharding: Any = None) -> jax.Array:
        """nnx.Linear's dot_general: x (..., K) contracted with its kernel (see `dense`)."""
        del precision, preferred_element_type, out_sharding  # the compute dtype decides
        assert w.ndim == 2 and dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
        return self.dense(x, w)

    def for_decoding(self, rows: int) -> Ops:
        """These operations for a decoder's copy of the model whose steps feed `rows` tokens,
        its dense kernels converted once by `decode_kernel`, so that no step casts a weight.

        The kernels are kept in the compute dtype. XLA:CPU has no bfloat16 matrix-vector product
        (YNNPACK takes no dot with a dimension of 1, XLA's own matrix-vector kernel is float32
        only and would upcast every weight at every step), so on the CPU a bfloat16 decoder of up
        to cpu_matvec.MAX_ROWS rows multiplies through cpu_matvec's native kernel, its kernels
        laid out (out, in) for it. Where that kernel cannot be built, one row multiplies float32
        kernels holding compute-dtype values, laid out (out, in) too: XLA's float32 kernel streams
        a (M, K) weight's rows faster than a (K, M) one's columns (docs/performance.md "Sampling").
        """
        if (self.backend == "cpu" and self.compute_dtype == "bfloat16" and rows <= cpu_matvec.MAX_ROWS
                and cpu_matvec.available()):
            return dataclasses.replace(self, weight_dtype="bfloat16", kernels_out_in=True, native_matvec=True)
        if self.backend == "cpu" and rows == 1:
            return dataclasses.replace(self, weight_dtype="float32", kernels_out_in=True)
        return dataclasses.replace(self, weight_dtype=self.compute_dtype, kernels_out_in=False)

    def decode_kernel(self, w: jax.Array) -> jax.Array:
        """A dense kernel (K, M) float32 as these decoding operations take it (`for_decoding`): a
        new array, or `w` itself where nothing changes (float32 kernels for several rows)."""
        assert self.weight_dtype is not None, "decode_kernel is for the operations of for_decoding"
        if w.dtype == self.weight_dtype == self.compute_dtype and not self.kernels_out_in:
            return w
        return _decode_kernel(w, self.compute_dtype, self.weight_dtype, self.kernels_out_in)

    def attention(self, q: jax.Array, k: jax.Array, v: jax.Array,
                  dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
        """Causal attention, q, k, v: (B, T, H, D) float32 -> (B, T, H*D) float32.

        `dropout` on the attention weights needs the weights themselves, which no fused kernel
        gives: with it, attention is spelled out (per head on CPU, all heads elsewhere).
        """
        if self.attention_kernel == "per_head":
            return cpu_kernels.per_head_attention(q, k, v, self.einsum, dropout)
        if self.attention_kernel == "cudnn" and dropout is None:
            B, T, H, D = q.shape
            dtype = jnp.dtype(self.compute_dtype)  # cuDNN has no float32 kernel
            y = jax.nn.dot_product_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                             is_causal=True, implementation="cudnn")  # (B, T, H, D)
            return y.astype(jnp.float32).reshape(B, T, H * D)
        return causal_attention(q, k, v, self.einsum, dropout)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _decode_kernel(w: jax.Array, compute_dtype: str, weight_dtype: str, out_in: bool) -> jax.Array:
    """Ops.decode_kernel's conversion: one small program per kernel shape, compiled once per process."""
    w = w.astype(compute_dtype).astype(weight_dtype)  # the compute dtype's values
    return w.T if out_in else w


def resolve_compute_dtype(requested: str, backend: str, cpu_flags: frozenset[str] | None = None) -> str:
    """model.json compute_dtype on `backend`: "auto" becomes bfloat16 on accelerators (their
    matmul units are bfloat16 ones) and, on a CPU, what cpu_kernels.auto_compute_dtype says for
    its flags (`cpu_flags`: default this machine's /proc/cpuinfo)."""
    if requested != "auto":
        return requested
    if backend != "cpu":
        return "bfloat16"
    return cpu_kernels.auto_compute_dtype(cpu_kernels.cpu_flags() if cpu_flags is None else cpu_flags)


def attention_kernel(cfg: ModelConfig, backend: str) -> str:
    """The kernel model.json's `attention` resolves to on `backend`; bad choices are ConfigErrors."""
    if cfg.attention == "per_head" and backend != "cpu":
        raise ConfigError(f"{MODEL_FILE}: attention='per_head' is the CPU kernel (JAX's backend here: "
                          f"{backend}); use 'auto', 'xla' or 'cudnn'")
    if cfg.attention == "cudnn":
        if backend != "gpu":
            raise ConfigError(f"{MODEL_FILE}: attention='cudnn' needs a GPU (JAX's backend here: {backend}); "
                              f"use 'auto'")
        reason = _cudnn_unavailable(cfg)
        if reason:
            raise ConfigError(f"{MODEL_FILE}: attention='cudnn' cannot run here ({reason}); use 'auto' or 'xla'")
        return "cudnn"
    if cfg.attention != "auto":
        return cfg.attention
    if backend == "cpu":
        return "per_head"
    if backend == "gpu" and resolve_compute_dtype(cfg.compute_dtype, backend) == "bfloat16":
        reason = _cudnn_unavailable(cfg)
        if not reason:
            return "cudnn"
        print(f"note: {MODEL_FILE} attention='auto': cuDNN flash attention unavailable ({reason}); "
              f"using XLA's attention", file=sys.stderr, flush=True)
    return "xla"


def _cudnn_unavailable(cfg: ModelConfig) -> str | None:
    """Why cuDNN's flash attention cannot run this model's shapes, or None if it can.

    Lowering a forward and backward pass of one sequence for CUDA runs every check JAX makes
    (cuDNN present and recent enough, head size, layout) without compiling or running anything.
    """
    shape = jax.ShapeDtypeStruct((1, cfg.context_length, cfg.n_heads, cfg.emb_dim // cfg.n_heads), jnp.bfloat16)

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return y.astype(jnp.float32).sum()

    try:  # for CUDA explicitly where the process itself runs elsewhere (an export from a CPU)
        traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(shape, shape, shape)  # the checks run here ...
        traced.lower() if jax.default_backend() == "gpu" else traced.lower(lowering_platforms=("cuda",))  # ... or here
    except (RuntimeError, ValueError, NotImplementedError) as e:  # what JAX's cuDNN checks raise
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


@functools.lru_cache(maxsize=None)
def select(cfg: ModelConfig, backend: str | None = None) -> Ops:
    """The operations `cfg` runs with on `backend` (default: JAX's default backend).

    The one place that looks at the backend. Cached, so each (config, backend) is resolved, and
    any cuDNN probe made, once per process.
    """
    backend = backend or jax.default_backend()
    kernel = attention_kernel(cfg, backend)
    dtype = resolve_compute_dtype(cfg.compute_dtype, backend)
    if backend == "cpu":
        return Ops(backend, dtype, kernel, product=cpu_kernels.bf16_product, rows_dense=True)
    return Ops(backend, dtype, kernel)
