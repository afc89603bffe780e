"""XLA:CPU forms of the model's operations; jaxgpt/ops/cpu.py uses them, on the CPU backend only.

Each computes what its neutral form (jaxgpt/ops/neutral.py) computes, as XLA:CPU runs it fastest
(docs/performance.md "The CPU code, lever by lever"):

- `bf16_product`: a bfloat16 matmul's backward products as native bfloat16 dots;
- dense layers on (N, K) rows (`CpuOps.linear`);
- `per_head_attention`: one (B, T, D) batched matmul per head;
- `vecmat`: a decode step's attention as an elementwise product and a sum
  (`DECODE_COMPILER_OPTIONS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp


def bf16_product(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """A backward product of ops.mixed_einsum (bfloat16 operands, float32 result), in a form
    XLA:CPU runs as a bfloat16 dot.

    XLA:CPU multiplies bfloat16 natively only when the dot's left operand contracts its last
    dimensions, row-major; otherwise it upcasts. So the left operand's contracted indices are moved
    last (in the operand order moving fewer bytes), the output put back in `spec`'s order; each such
    transpose is flattened behind an optimization barrier, so XLA cannot fold it into the dot.
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
            4 * math.prod(extent[c] for c in so) if natural != so else 0
        )
        plans.append((cost, sl, left, sr, right, order, natural))
    _, sl, left, sr, right, order, natural = min(plans, key=lambda plan: plan[0])
    if order != list(sl):
        left = _row_major(jnp.transpose(left, [sl.index(c) for c in order]))
    out = jnp.einsum(f"{''.join(order)},{sr}->{natural}", left, right, preferred_element_type=jnp.float32)
    return out if natural == so else jnp.transpose(_row_major(out), [natural.index(c) for c in so])


def _row_major(a: jax.Array) -> jax.Array:
    """`a` as its own row-major copy, which XLA may neither relabel nor fold into a dot."""
    return jax.lax.optimization_barrier(a.reshape(-1)).reshape(a.shape)


def per_head_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    einsum: Callable[..., jax.Array],
    dropout: Callable[[jax.Array], jax.Array] | None = None,
    window: int | jax.Array | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal softmax attention, one head at a time. q (B, T, H, D), k and v (B, T, Hkv, D) -> (B, T, H*D).

    The same function as ops.causal_attention: scores, softmax and the weights' dropout are
    float32, the two products go through `einsum` (the compute dtype's); query head h reads
    key/value head h // (H / Hkv), and sees `window` tokens (itself included; None: all before it)
    of its own segment (packed conversations; None: one text per row).
    """
    B, T, H, D = q.shape
    group = H // k.shape[2]
    t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    mask = s <= t if window is None else (s <= t) & (t - s < window)  # as ops.neutral.causal_mask
    if segments is not None:
        mask = mask & (segments[:, :, None] == segments[:, None, :])  # (B, T, T)
    heads = []
    for h in range(H):
        att = einsum("btd,bsd->bts", q[:, :, h], k[:, :, h // group]) / math.sqrt(D)  # (B, T, T)
        att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
        if dropout is not None:
            att = dropout(att)
        heads.append(einsum("bts,bsd->btd", att, v[:, :, h // group]))  # (B, T, D)
    return jnp.concatenate(heads, axis=-1)  # (B, T, C)


def vecmat(a: jax.Array, b: jax.Array, dtype: str) -> jax.Array:
    """Ops.vecmat on XLA:CPU: a (..., K) and b (..., K, N) -> (..., N), the product of their
    `dtype` values summed over K in float32.

    As an elementwise product and a sum XLA fuses it with the read of `b` (a slice of the KV
    cache, its rounding to `dtype` included) into one loop over the cache; as a dot XLA:CPU ran
    every (row, head) as a one-row matrix product of its own, 5-9x slower at batch 8 (docs/performance.md
    "Performance").
    """
    if dtype != "float32":
        a, b = (t.astype(dtype).astype(jnp.float32) for t in (a, b))
    return jnp.sum(a[..., None] * b, axis=-2)


# XLA options for a decode step's program: YNNPACK for dots only. Its fused sums (on by default)
# ran vecmat 5-10x slower than XLA's own loops; its dots stay (the bfloat16 ones are native).
DECODE_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


# /proc/cpuinfo flags that mean the CPU multiplies bfloat16 natively (a bf16 dot-product
# instruction), which XLA:CPU's bf16 kernels then use: AVX512_BF16 (Intel Cooper Lake and later,
# AMD Zen 4 and later) and AMX-BF16 (Intel Sapphire Rapids and later).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The first processor's /proc/cpuinfo flags (`cpuinfo`: that file's text, read here if not
    given); none where there is no /proc/cpuinfo (macOS, Windows)."""
    return frozenset(_first_processor(cpuinfo).get("flags", "").split())


def cpu_info(cpuinfo: str | None = None) -> dict[str, object]:
    """The CPU's model name and the flags that decide its matmul paths (what `bench compare`
    states), from /proc/cpuinfo as `cpu_flags`; model None where it is not known."""
    fields = _first_processor(cpuinfo)
    flags = frozenset(fields.get("flags", "").split())
    return {
        "model": fields.get("model name"),
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "amx_tile": "amx_tile" in flags,
        "native_bf16": native_bf16(flags),
    }


def _first_processor(cpuinfo: str | None) -> dict[str, str]:
    """The `key: value` fields of /proc/cpuinfo's first processor block: every core of one
    machine is the same."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def native_bf16(flags: frozenset[str] | set[str]) -> bool:
    """Whether a CPU with these /proc/cpuinfo flags has native bfloat16 dot products."""
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def auto_compute_dtype(flags: frozenset[str] | set[str]) -> str:
    """model.json compute_dtype "auto" on a CPU with these flags: bfloat16 matmuls where the CPU
    multiplies bfloat16 natively (faster at the same loss, docs/log.md "compute_dtype auto: speed and loss"), float32
    elsewhere (a bfloat16 dot there has no native instruction to run on)."""
    return "bfloat16" if native_bf16(flags) else "float32"
