"""Mixed precision: the model's matmuls in float32, or bfloat16 operands into float32.

`einsum(spec, a, b, cfg)` is every matmul of model.py, and `linear_dot(cfg)` the dot_general
its nnx.Linear layers use. With compute_dtype "bfloat16" they multiply bfloat16 operands with
float32 accumulation and results, in the forward and in both backward products (as
torch.autocast does); everything else stays float32.
"""

from __future__ import annotations

import functools
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
    """einsum into float32 with the left operand's contracted indices moved last first.

    XLA:CPU runs a bfloat16 dot natively only when the left operand contracts its last
    dimensions; a weight gradient (x^T g, contracting the token axis) would otherwise be upcast
    to a float32 dot. The barrier keeps XLA from folding the transpose back into the dot.
    """
    (sx, sy), so = spec.split("->")[0].split(","), spec.split("->")[1]
    batch = [c for c in sx if c in sy and c in so]
    order = batch + [c for c in sx if c in so and c not in batch] + [c for c in sx if c not in so]
    if order != list(sx):
        x = jax.lax.optimization_barrier(jnp.transpose(x, [sx.index(c) for c in order]))
        sx = "".join(order)
    # Ask for the dot's own output order (batch, x's free, y's free), or einsum would swap the
    # operands to produce `so` directly, and the left one would contract its first axis again.
    natural = "".join(batch + [c for c in sx if c in so and c not in batch] + [c for c in sy if c in so and c not in batch])
    out = jnp.einsum(f"{sx},{sy}->{natural}", x, y, preferred_element_type=jnp.float32)
    return out if natural == so else jnp.transpose(out, [natural.index(c) for c in so])


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
