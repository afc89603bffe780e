"""`bench gemv`: one decode step's matrix-vector product (a 1-row activation times a weight) in
each form XLA:CPU can run it, float32 against bfloat16 weights.

A decode step at batch 1 is a chain of these (GPT-2 124M: 48 per token plus the 768 x 50257
head). They say why a bfloat16 decode is not faster than a float32 one through XLA:CPU's own
kernels (docs/log.md "Sampling"): a bfloat16 weight is half the
bytes, but no XLA kernel reads it faster per element than the float32 dot reads float32. The last
form is cpu_matvec's native kernel, what a bfloat16 decoder runs (where it can be built).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.cpu import matvec as cpu_matvec
from jaxgpt.cpu.kernels import DECODE_COMPILER_OPTIONS, cpu_info

BF16 = jnp.bfloat16


def _forms() -> dict[str, tuple[Callable[[jax.Array, jax.Array], jax.Array], str, bool, dict[str, Any]]]:
    """name -> (product of x (1, K) and the weight, weight dtype, stored (M, K), compile options)."""

    def bf16_dot(x: jax.Array, w: jax.Array, spec: str, rows: int) -> jax.Array:
        xs = jnp.pad(x, ((0, rows - 1), (0, 0))).astype(BF16)  # zero rows: YNNPACK takes no 1-row dot
        return jnp.einsum(spec, xs, w, preferred_element_type=jnp.float32)[:1]

    return {
        "float32 dot, (K, M)": (lambda x, w: x @ w, "float32", False, {}),
        "float32 dot, (M, K)": (lambda x, w: jnp.einsum("nk,mk->nm", x, w), "float32", True, {}),
        "bfloat16 dot, 1 row": (lambda x, w: bf16_dot(x, w, "nk,km->nm", 1), "bfloat16", False, {}),
        "bfloat16 dot, 2 rows (YNNPACK)": (
            lambda x, w: bf16_dot(x, w, "nk,km->nm", 2),
            "bfloat16",
            False,
            DECODE_COMPILER_OPTIONS,
        ),
        "bfloat16 dot, 2 rows, (M, K) (YNNPACK)": (
            lambda x, w: bf16_dot(x, w, "nk,mk->nm", 2),
            "bfloat16",
            True,
            DECODE_COMPILER_OPTIONS,
        ),
        "bfloat16 upcast, float32 dot, (M, K)": (
            lambda x, w: jnp.einsum("nk,mk->nm", x, w.astype(jnp.float32)),
            "bfloat16",
            True,
            {},
        ),
        "bfloat16 multiply-sum, (M, K)": (
            lambda x, w: jnp.sum(w.astype(jnp.float32) * x, axis=1)[None],
            "bfloat16",
            True,
            {},
        ),
    } | ({NATIVE: (cpu_matvec.matvec, "bfloat16", True, {})} if cpu_matvec.available() else {})


NATIVE = "bfloat16 native kernel (cpu_matvec), (M, K)"


def bench_gemv(shapes: list[tuple[int, int]], *, calls: int = 20, windows: int = 7) -> dict[str, Any]:
    """Best-of-`windows` time of `calls` back-to-back calls per form and (K, M) shape, and the
    largest difference of each bfloat16 form from the float64 product of the same
    (bfloat16-rounded) values."""
    rng = np.random.default_rng(0)
    rows = []
    for k, m in shapes:
        w32 = rng.standard_normal((k, m), dtype=np.float32)
        x = jnp.asarray(rng.standard_normal((1, k), dtype=np.float32)).astype(BF16).astype(jnp.float32)
        exact = np.asarray(x, np.float64) @ np.asarray(jnp.asarray(w32).astype(BF16).astype(jnp.float32), np.float64)
        for name, (fn, dtype, out_in, options) in _forms().items():
            w = jnp.asarray(w32.T.copy() if out_in else w32).astype(dtype)
            compiled = jax.jit(fn).lower(x, w).compile(options)
            err = float(np.abs(np.asarray(compiled(x, w), np.float64) - exact).max()) if dtype == "bfloat16" else None
            for _ in range(3):
                compiled(x, w).block_until_ready()
            best = float("inf")
            for _ in range(windows):
                t0 = time.perf_counter()
                for _ in range(calls):
                    y = compiled(x, w)
                y.block_until_ready()
                best = min(best, (time.perf_counter() - t0) / calls)
            nbytes = w.size * w.dtype.itemsize
            rows.append(
                {
                    "shape": [k, m],
                    "form": name,
                    "us": best * 1e6,
                    "weight_mb": nbytes / 1e6,
                    "gb_per_s": nbytes / best / 1e9,
                    "max_err": err,
                }
            )
            print(
                f"{k:5d} x {m:<6d} {name:40s} {best * 1e6:9.1f} us  {nbytes / best / 1e9:6.1f} GB/s"
                + (f"  max |err| {err:.2g}" if err is not None else ""),
                flush=True,
            )
    return {"cpu": cpu_info(), "backend": jax.default_backend(), "rows": rows}
