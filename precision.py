"""Mixed precision: the model's matmuls in float32, or bfloat16 operands into float32.

`einsum(spec, a, b, cfg)` is every matmul of model.py, and `linear_dot(cfg)` the dot_general
its nnx.Linear layers use. With compute_dtype "bfloat16" they multiply bfloat16 operands with
float32 accumulation and results, in the forward and in both backward products (as
torch.autocast does); everything else stays float32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from config import ModelConfig


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, dtype: Any) -> jax.Array:
    """A two-operand einsum (each index of an operand also in the other or the output, as in any
    (batched) matmul) of `dtype` operands into float32, in the backward pass too.

    Autodiff of a bfloat16 einsum would hand XLA:CPU bfloat16 dots it upcasts to float32 plus
    convert passes (measured: slower than float32); here all three products of each matmul use
    the CPU's native bfloat16 dot (2x the float32 rate here) and the operands are kept in
    bfloat16 for the backward pass (half the saved-activation memory).
    """
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(spec: str, a: jax.Array, b: jax.Array, dtype: Any) -> tuple[jax.Array, tuple[Any, ...]]:
    a16, b16 = a.astype(dtype), b.astype(dtype)
    # The primal dtypes ride along as empty arrays (residuals must be JAX values).
    return jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32), (a16, b16, jnp.zeros(0, a.dtype),
                                                                            jnp.zeros(0, b.dtype))


def _mixed_einsum_bwd(spec: str, dtype: Any, res: tuple[Any, ...], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    a16, b16, a_dtype, b_dtype = res
    (sa, sb), so = spec.replace(" ", "").split("->")[0].split(","), spec.split("->")[1].strip()
    g16 = g.astype(dtype)
    da = _einsum_f32(f"{so},{sb}->{sa}", g16, b16)
    db = _einsum_f32(f"{sa},{so}->{sb}", a16, g16)
    return da.astype(a_dtype.dtype), db.astype(b_dtype.dtype)


def _einsum_f32(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """A backward product of mixed_einsum, in a form XLA:CPU runs as a bfloat16 dot.

    XLA:CPU (YNNPACK) multiplies bfloat16 natively only when the dot's left operand contracts
    its last dimensions and is laid out row-major; otherwise it upcasts the dot to float32 (a
    weight gradient x^T g, contracting the token axis: 2.1 ms against 1.1-1.4 ms for a
    128 x 2048 x 512 one). So the left operand gets its contracted indices moved last, and the
    dot's output is put in `spec`'s order afterwards if need be; of the two operand orders, the
    one that moves fewer bytes. Each such transpose is flattened behind an optimization barrier:
    a bare transpose is only a relabelling (column-major layout: upcast all the same) that XLA
    would fold back into the dot (a transposed output becomes a dot with swapped, transposed
    operands); flattened, it is a row-major copy, and the barrier keeps it one.
    """
    (sx, sy), so = spec.split("->")[0].split(","), spec.split("->")[1]
    extent = dict(zip(sx, x.shape)) | dict(zip(sy, y.shape))
    plans = []
    for (sl, left), (sr, right) in (((sx, x), (sy, y)), ((sy, y), (sx, x))):
        batch = [c for c in sl if c in sr and c in so]
        free = [c for c in sl if c in so and c not in batch]
        order = batch + free + [c for c in sl if c not in so]
        natural = "".join(batch + free + [c for c in sr if c in so and c not in batch])
        # bytes copied: the (bfloat16) left operand if it must move, the float32 output if it must
        cost = (left.size * left.dtype.itemsize if order != list(sl) else 0) + (
            4 * math.prod(extent[c] for c in so) if natural != so else 0)
        plans.append((cost, sl, left, sr, right, order, natural))
    _, sl, left, sr, right, order, natural = min(plans, key=lambda plan: plan[0])
    if order != list(sl):
        left = _row_major(jnp.transpose(left, [sl.index(c) for c in order]))
    out = jnp.einsum(f"{''.join(order)},{sr}->{natural}", left, right, preferred_element_type=jnp.float32)
    return out if natural == so else jnp.transpose(_row_major(out), [natural.index(c) for c in so])


def _row_major(a: jax.Array) -> jax.Array:
    """`a` as its own row-major copy, which XLA may neither relabel nor fold into a dot."""
    return jax.lax.optimization_barrier(a.reshape(-1)).reshape(a.shape)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def einsum(spec: str, a: jax.Array, b: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Every matmul of the model: plain float32, or mixed_einsum for a bfloat16 compute_dtype."""
    if cfg.compute_dtype == "float32":
        return jnp.einsum(spec, a, b)
    return mixed_einsum(spec, a, b, jnp.dtype(cfg.compute_dtype))


def _bf16_dot_general(x: jax.Array, w: jax.Array, dimension_numbers: Any, precision: Any = None,
                      preferred_element_type: Any = None, out_sharding: Any = None) -> jax.Array:
    """nnx.Linear's dot_general for compute_dtype bfloat16 (Linear's inputs are always (N, K) here)."""
    del precision, preferred_element_type, out_sharding
    assert x.ndim == 2 and dimension_numbers == (((1,), (0,)), ((), ())), dimension_numbers
    return mixed_einsum("nk,km->nm", x, w, jnp.bfloat16)


def linear_dot(cfg: ModelConfig) -> Callable[..., jax.Array]:
    # Module-level functions, not closures: they are part of the graphdef, which jit caches on.
    return jax.lax.dot_general if cfg.compute_dtype == "float32" else _bf16_dot_general
