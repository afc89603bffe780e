"""QK-norm and rotary on the TPU, in variants, alone. In the modern recipe's step (303 ms at 16 x 1024)
they cost 29 and 56 ms (seventh session): both work per head on (B, T, H, 64) float32 queries and
keys, half a TPU lane tile a head. Here: 12 layers scanned under remat, each projecting x (B, T, C)
to queries and keys (bf16 operands, float32 out), RMS-normalising them per head, rotating them, and
handing splash its bfloat16 (B, H, T, D) operands; forward and backward timed; the variants' q and k
compared with the model's form in float32.

    python3 headnorm.py OUT [B T]      (a CPU rehearsal: python3 headnorm.py /tmp/x 2 128)
"""
import json, sys, time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
B, T = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (16, 1024)
C, H, L = 768, 12, 12
D, half, EPS = C // H, C // H // 2, 1e-6
f32, bf16 = jnp.float32, jnp.bfloat16
HIGHEST = jax.lax.Precision.HIGHEST


def tables():
    inv = 10000.0 ** (-2.0 * jnp.arange(half, dtype=f32) / D)
    a = jnp.arange(T, dtype=f32)[:, None] * inv  # (T, D/2)
    return jnp.cos(a), jnp.sin(a)


def to_splash(q):  # (B, T, H, D) float32 -> (B, H, T, D), as TpuOps hands it to the kernel
    return q.transpose(0, 2, 1, 3)


# --- the model's form today (layers.Rotary, nnx.RMSNorm over D): per head, (B, T, H, D)
def heads(q, cos, sin):
    q = q.reshape(B, T, H, D)
    q = q * jax.lax.rsqrt(jnp.mean(q * q, -1, keepdims=True) + EPS)
    x1, x2 = q[..., :half], q[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return to_splash(jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1))


# --- lane-dense (B, T, C): each head's halves swapped by two rolls, the sign and angle in (T, C) tables
LANE = jnp.arange(C) % D


def flat_tables(cos, sin):
    return jnp.tile(jnp.concatenate([cos, cos], -1), (1, H)), jnp.tile(jnp.concatenate([-sin, sin], -1), (1, H))


def rotate_flat(q, cosf, sinf):
    swapped = jnp.where(LANE < half, jnp.roll(q, -half, -1), jnp.roll(q, half, -1))
    return q * cosf + swapped * sinf


def head_sums_roll(s):  # each lane: the sum of its head's D lanes (a butterfly within 64-lane groups)
    shift = 1
    while shift < D:
        s = s + jnp.where(LANE & shift, jnp.roll(s, shift, -1), jnp.roll(s, -shift, -1))
        shift *= 2
    return s


E = (jnp.arange(C)[:, None] // D == jnp.arange(H)[None, :]).astype(f32)  # (C, H): lane c in head h


def head_sums_matmul(s):
    per_head = jnp.einsum("btc,ch->bth", s, E, precision=HIGHEST)
    return jnp.einsum("bth,ch->btc", per_head, E, precision=HIGHEST)


def head_sums_reshape(s):
    return jnp.repeat(s.reshape(B, T, H, D).sum(-1), D, axis=-1)


def flat(sums):
    def f(q, cos, sin):
        cosf, sinf = flat_tables(cos, sin)
        q = q * jax.lax.rsqrt(sums(q * q) / D + EPS)
        return to_splash(rotate_flat(q, cosf, sinf).reshape(B, T, H, D))
    return f


# --- transposed first: (B, H, T, D), the layout splash takes, then the same per-head work
def bhtd(q, cos, sin):
    q = to_splash(q.reshape(B, T, H, D))
    q = q * jax.lax.rsqrt(jnp.mean(q * q, -1, keepdims=True) + EPS)
    x1, x2 = q[..., :half], q[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


# --- today's form, rotated in bfloat16 after the norm (the kernel's operands are bfloat16 anyway): a
# second rounding, so a data point, not a candidate without a check of its loss
def heads_bf16_rotary(q, cos, sin):
    q = q.reshape(B, T, H, D)
    q = (q * jax.lax.rsqrt(jnp.mean(q * q, -1, keepdims=True) + EPS)).astype(bf16)
    x1, x2 = q[..., :half], q[..., half:]
    c, s = cos[:, None, :].astype(bf16), sin[:, None, :].astype(bf16)
    return to_splash(jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)).astype(f32)


VARIANTS = {"heads (today)": heads, "flat, roll sums": flat(head_sums_roll), "flat, matmul sums": flat(head_sums_matmul),
            "flat, reshape sums": flat(head_sums_reshape), "bhtd": bhtd,
            "heads, rotary in bf16": heads_bf16_rotary}


def step_fn(variant):
    cos, sin = tables()

    def layer(x, w):
        qk = jnp.einsum("btc,cm->btm", x.astype(bf16), w.astype(bf16), preferred_element_type=f32)  # (B, T, 2C)
        q, k = variant(qk[..., :C], cos, sin).astype(bf16), variant(qk[..., C:], cos, sin).astype(bf16)
        y = jnp.einsum("bhtd,bhtd->bht", q, k, preferred_element_type=f32)  # splash's stand-in: cheap, the same for all
        return x + 1e-3 * jnp.repeat(y.transpose(0, 2, 1), C // H, axis=-1), None

    def loss(ws, x):
        x, _ = jax.lax.scan(jax.checkpoint(layer), x, ws)
        return jnp.mean(x * x)

    return jax.jit(jax.value_and_grad(loss))


rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((B, T, C)), f32)
ws = jnp.asarray(rng.standard_normal((L, C, 2 * C)) * 0.02, f32)
cos, sin = tables()
q0 = jnp.asarray(rng.standard_normal((B, T, C)), f32)
ref = np.asarray(heads(q0, cos, sin))
rows = []
for name, v in VARIANTS.items():
    row = {"variant": name}
    try:
        row["max_diff_vs_today"] = float(np.abs(np.asarray(jax.jit(v)(q0, cos, sin)) - ref).max())
        f = step_fn(v)
        c0 = time.perf_counter()
        compiled = f.lower(ws, x).compile()
        row["compile_s"] = round(time.perf_counter() - c0, 1)
        row["temp_mib"] = round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1)
        jax.block_until_ready(compiled(ws, x))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(5):
                out = compiled(ws, x)
            jax.block_until_ready(out)
            times.append((time.perf_counter() - t0) / 5)
        row["ms"] = round(1e3 * min(times), 2)
        row["loss"] = float(out[0])
    except Exception as e:  # one row, not the script
        row["error"] = str(e).splitlines()[0][:300]
    print(json.dumps(row), flush=True)
    rows.append(row)
(OUT / "headnorm.json").write_text(json.dumps(rows, indent=1))
