"""The KV cache's write on the chip: the decode step's cache update + attention, 12 layers, 16 steps per
program (as the engine's burst), in variants; each: ms per step, cache-shaped copies in its HLO, temp bytes.
    python3 kvlayout.py OUT
"""
import json, re, sys, time
from functools import partial
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.layout import Format, Layout
L, K, D, S, G = 12, 12, 64, 1024, 1
N = 16
bf = jnp.bfloat16

def attend(kl, vl, q, pos, span, vt):
    # kl (B,K,D,span), vl (B,K,span,D) or (B,K,D,span) if vt
    att = jnp.einsum("bkd,bkds->bks", q.astype(bf), kl.astype(bf), preferred_element_type=jnp.float32) / 8.0
    vis = jnp.arange(span)[None, None, :] <= pos[:, None, None]
    att = jax.nn.softmax(jnp.where(vis, att, -jnp.inf), axis=-1)
    spec = "bks,bkds->bkd" if vt else "bks,bksd->bkd"
    return jnp.einsum(spec, att.astype(bf), vl.astype(bf), preferred_element_type=jnp.float32)

def write(kind, ck, cv, l, k, v, pos, span, vt):
    B = k.shape[0]; rows = jnp.arange(B)
    if kind == "scatter":
        ck = ck.at[l, rows, :, :, pos].set(k.astype(ck.dtype))
        cv = (cv.at[l, rows, :, :, pos] if vt else cv.at[l, rows, :, pos]).set(v.astype(cv.dtype))
        return ck, cv, ck[l, :, :, :, :span], (cv[l, :, :, :, :span] if vt else cv[l, :, :, :span])
    if kind == "where":
        hit = jnp.arange(span)[None, None, None, :] == pos[:, None, None, None]  # (B,1,1,span)
        kl = jnp.where(hit, k[..., None].astype(ck.dtype), ck[l, :, :, :, :span])
        if vt:
            vl = jnp.where(hit, v[..., None].astype(cv.dtype), cv[l, :, :, :, :span])
            cv = jax.lax.dynamic_update_slice(cv, vl[None], (l, 0, 0, 0, 0))
        else:
            hv = jnp.arange(span)[None, None, :, None] == pos[:, None, None, None]
            vl = jnp.where(hv, v[:, :, None, :].astype(cv.dtype), cv[l, :, :, :span])
            cv = jax.lax.dynamic_update_slice(cv, vl[None], (l, 0, 0, 0, 0))
        ck = jax.lax.dynamic_update_slice(ck, kl[None], (l, 0, 0, 0, 0))
        return ck, cv, kl, vl
    if kind == "rowdus":
        for b in range(B):
            ck = jax.lax.dynamic_update_slice(ck, k[b][None, None, :, :, None].astype(ck.dtype), (l, b, 0, 0, pos[b]))
            if vt:
                cv = jax.lax.dynamic_update_slice(cv, v[b][None, None, :, :, None].astype(cv.dtype), (l, b, 0, 0, pos[b]))
            else:
                cv = jax.lax.dynamic_update_slice(cv, v[b][None, None, :, None, :].astype(cv.dtype), (l, b, 0, pos[b], 0))
        return ck, cv, ck[l, :, :, :, :span], (cv[l, :, :, :, :span] if vt else cv[l, :, :, :span])

def program(kind, span, vt, ck, cv, qs, pos):
    def body(i, c):
        ck, cv, acc = c
        p = pos + i
        for l in range(L):
            q = qs[l] + acc[:, :, :D] * 0  # (B,K,D)
            ck, cv, kl, vl = write(kind, ck, cv, l, q * 0.5, q * 0.25, p, span, vt)
            acc = acc + attend(kl, vl, q, p, span, vt)
        return ck, cv, acc
    B = pos.shape[0]
    return jax.lax.fori_loop(0, N, body, (ck, cv, jnp.zeros((B, K, D), jnp.float32)))

def run(kind, B, span=256, vt=False, auto=False):
    ck = jnp.zeros((L, B, K, D, S), bf)
    cv = jnp.zeros((L, B, K, D, S) if vt else (L, B, K, S, D), bf)
    qs = jax.random.normal(jax.random.key(0), (L, B, K, D), jnp.float32)
    pos = jnp.arange(B, dtype=jnp.int32) + 100
    fmt = Format(Layout.AUTO) if auto else None
    j = jax.jit(partial(program, kind, span, vt), donate_argnums=(0, 1),
                in_shardings=(fmt, fmt, None, None) if auto else None, out_shardings=(fmt, fmt, None) if auto else None)
    t0 = time.perf_counter(); c = j.lower(ck, cv, qs, pos).compile(); comp = time.perf_counter() - t0
    if auto:
        fk, fv = c.input_formats[0][:2]
        ck, cv = jax.device_put(ck, fk), jax.device_put(cv, fv)
    txt = c.as_text()
    shapes = [",".join(map(str, ck.shape)), ",".join(map(str, cv.shape))]
    big = [l.strip()[:90] for l in txt.splitlines() if re.search(r"= \S+ copy(-start)?\(", l) and any(s in l.split("copy")[0].replace(" ", "") for s in shapes)]
    out = (ck, cv, None)
    times = []
    for r in range(6):
        t = time.perf_counter(); out = c(out[0], out[1], qs, pos); jax.block_until_ready(out); times.append(time.perf_counter() - t)
        ck, cv = out[0], out[1]
    ma = c.memory_analysis()
    res = {"kind": kind, "B": B, "span": span, "vt": vt, "auto": auto, "ms_step": round(1000 * float(np.median(times[1:])) / N, 3),
           "copies": len(big), "copy_lines": big[:2], "temp_MiB": round(ma.temp_size_in_bytes / 2**20, 1) if ma else None,
           "compile_s": round(comp, 1), "acc": float(jnp.abs(out[2]).sum())}
    if auto:
        res["layouts"] = [str(f.layout.major_to_minor) + str(f.layout.tiling) for f in c.input_formats[0][:2]]
    print(json.dumps(res), flush=True)

T0 = time.time()
for args in [("scatter", 16), ("scatter", 16, 256, False, True), ("where", 16), ("rowdus", 16), ("scatter", 16, 256, True),
             ("where", 16, 256, True), ("rowdus", 16, 256, True), ("scatter", 16, 1024), ("where", 16, 1024, True),
             ("scatter", 96), ("where", 96, 256, True), ("where", 96), ("scatter", 1), ("where", 1, 256, True), ("where", 1)]:
    try:
        run(*args)
    except Exception as e:
        print(json.dumps({"args": str(args), "error": str(e)[:300]}), flush=True)
    print(f"  [{time.time() - T0:.0f} s]", flush=True)
