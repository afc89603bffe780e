"""The model's operations on XLA:CPU: `Ops` in the forms of jaxgpt/cpu/kernels.py, and the native
kernel of jaxgpt/cpu/matvec.py.

select.py builds a `CpuOps` for the CPU backend, and only there. What changes against the neutral
`Ops` (why, lever by lever: docs/performance.md "The CPU code, lever by lever"):

- a bfloat16 matmul's backward products laid out for XLA:CPU's bfloat16 dot (kernels.bf16_product);
- dense layers on 2-D (N, K) rows;
- attention one head at a time (model.json attention "per_head", the CPU's "auto");
- a decode step's attention as a fused product and sum (kernels.vecmat), compiled with
  kernels.DECODE_COMPILER_OPTIONS;
- a decoder's copy (`for_decoding`): up to matvec.MAX_ROWS rows of a bfloat16 model multiply
  through matvec's native kernel, kernels laid out (out, in); without it, one row multiplies
  float32 kernels holding compute-dtype values, also (out, in); more rows run XLA's dots on
  compute-dtype kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jaxgpt.cpu import kernels, matvec
from jaxgpt.ops.neutral import Ops, Product


@dataclass(frozen=True)
class CpuOps(Ops):
    """`Ops` on the CPU backend (see the module docstring); frozen and hashable like it."""

    product: Product = kernels.bf16_product
    cache_dtype: str | None = "float32"  # XLA:CPU does not scatter into a bfloat16 buffer in place

    def vecmat(self, a: jax.Array, b: jax.Array) -> jax.Array:
        return kernels.vecmat(a, b, self.compute_dtype)

    def decode_compiler_options(self) -> dict[str, Any]:
        return dict(kernels.DECODE_COMPILER_OPTIONS)

    def linear(self, x: jax.Array, w: jax.Array, *, transposed: bool = False) -> jax.Array:
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])  # (N, K) rows
        if self.native_matvec and x.shape[0] <= matvec.MAX_ROWS:
            # x rounded to bfloat16, as every bfloat16 product rounds it; the kernel widens it back.
            # nnx.Linear hands its bfloat16 kernel over promoted to x's float32: cast back, XLA
            # drops the pair of converts (the decode step's program converts no weight).
            y = matvec.matvec(x.astype(self.compute_dtype).astype(jnp.float32), w.astype(jnp.bfloat16))
        elif self.weight_dtype == "float32" and self.compute_dtype != "float32":
            # float32 weights holding compute-dtype values (for_decoding): x rounded alike, the
            # float32 product of the same values, which is how XLA:CPU itself runs a bfloat16 dot
            # with one row (it upcasts both operands).
            y = jnp.einsum(
                f"nk,{'mk' if transposed else 'km'}->nm", x.astype(self.compute_dtype).astype(jnp.float32), w
            )
        else:
            # A native decoder's bfloat16 kernels past MAX_ROWS rows (a prefill's) take the neutral
            # path: the same mixed einsum, no weight cast again.
            y = super().linear(x, w, transposed=transposed)
        return y.reshape(*lead, y.shape[-1])

    def for_decoding(self, rows: int) -> Ops:
        if self.compute_dtype == "bfloat16" and rows <= matvec.MAX_ROWS and matvec.available():
            return dataclasses.replace(self, weight_dtype="bfloat16", kernels_out_in=True, native_matvec=True)
        if rows == 1:
            return dataclasses.replace(self, weight_dtype="float32", kernels_out_in=True)
        return super().for_decoding(rows)

    def attention(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        dropout: Callable[[jax.Array], jax.Array] | None = None,
        window: int | jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        if self.attention_kernel == "per_head":
            return kernels.per_head_attention(q, k, v, self.einsum, dropout, window, segments)
        return super().attention(q, k, v, dropout, window, segments)
