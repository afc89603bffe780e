"""Train-step variants of the shipped 124M runs on this chip, in one process; then a profile of one.

    python3 .accel/speed.py OUT BUDGET_S
Each row: remat policy, microbatch x k, step ms, tokens/s, MFU (197 TFLOP/s), XLA's bytes, compile s.
"""
import dataclasses, json, os, sys, tarfile, time, traceback
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_compilation_cache_dir", "/tmp/jc")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

from bench.train_step import _batches, _build
from jaxgpt.config import load_run_configs
from bench.train_step import train_flops_per_token
from jaxgpt.training import memory
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.training.train_step import StepRunner, step_key

OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
END = time.monotonic() + float(sys.argv[2])
PEAK = 197e12
rows = []


def variant(run, remat, B, k, steps=6, profile=None, tag="", train=None, **model):
    name = f"{run} remat={remat} {B}x{k} {model or ''} {train or ''} {tag}"
    if time.monotonic() > END - 30:
        print(f"{name}: skipped, budget", flush=True); return
    m, t = load_run_configs(Path("runs") / run)
    m = dataclasses.replace(m, remat=remat, loss_chunk=model.pop("loss_chunk", 4096), **model)
    if os.environ.get("SPEED_TINY"):  # a CPU rehearsal of the same code
        m = dataclasses.replace(m, emb_dim=64, n_heads=2, n_layers=2, context_length=128)
        B, t = 2, dataclasses.replace(t, sequence_length=None) if hasattr(t, "sequence_length") else t
    t = dataclasses.replace(t, microbatch_size=B, gradient_accumulation_steps=k, batch_size=None, **(train or {}))
    T = t.seq_len(m)
    row = {"name": name}
    try:
        t0 = time.perf_counter()
        mdl, opt, mesh, rws, init_s = _build(m, t, 100, run)
        put = _batches(t, m.vocab_size, T, mesh, rws)
        runner = StepRunner(mdl, opt)
        b0 = put(0)
        c0 = time.perf_counter()
        compiled = runner.lower(Batch(*b0), step_key(0, 0)).compile()
        row["compile_s"] = round(time.perf_counter() - c0, 1)
        row["xla_gib"] = round(memory.compiled_bytes(compiled) / 2**30, 2)
        jax.block_until_ready(runner(Batch(*b0), step_key(0, 0)))
        for i in range(1, 3):
            out = runner(Batch(*put(i)), step_key(0, i))
        jax.block_until_ready(out)
        times = []
        for w in range(2):
            s0 = time.perf_counter()
            for i in range(steps):
                out = runner(Batch(*put(i)), step_key(0, i))
            jax.block_until_ready(out)
            times.append((time.perf_counter() - s0) / steps)
        step = min(times)
        tok = k * B * T / step
        row.update(step_ms=round(1e3 * step, 1), ms_per_microbatch=round(1e3 * step / k, 1), tokens_s=round(tok),
                   mfu=round(tok * train_flops_per_token(m, T) / PEAK, 4), loss=float(jax.device_get(out[0]).mean()),
                   total_s=round(time.perf_counter() - t0, 1))
        if profile:
            d = Path("/tmp/prof") / profile
            jax.profiler.start_trace(str(d))
            for i in range(3):
                out = runner(Batch(*put(i)), step_key(0, i))
            jax.block_until_ready(out)
            jax.profiler.stop_trace()
            with tarfile.open(OUT / f"prof-{profile}.tgz", "w:gz") as tf:
                tf.add(d, arcname=profile)
    except Exception as e:  # one row, not the probe
        lines = [l for l in str(e).splitlines() if l.strip()]
        row["error"] = (lines[0] if lines else type(e).__name__)[:300]
        if memory.is_out_of_memory(e):
            row["refused_gib"] = round((memory.refused_bytes(str(e)) or 0) / 2**30, 2)
    print(json.dumps(row), flush=True)
    rows.append(row)
    (OUT / "speed.json").write_text(json.dumps(rows, indent=1))
    for name_ in ("mdl", "opt", "runner", "compiled", "out"):
        locals().pop(name_, None)
    jax.clear_caches()


which = os.environ.get("SPEED_ONLY", "main")
if which == "main":
    variant("gpt2-small", "full", 16, 1, profile="full")                     # baseline: 204.3 ms in the check
    variant("gpt2-small", "attention", 16, 1, profile="attention")  # the kernel's residuals kept
    variant("gpt2-small", False, 16, 1)                        # nothing recomputed, if it fits
    variant("gpt2-small", "dots", 16, 1)                       # products + kernel residuals kept
    variant("gpt2-small", "attention", 16, 4)                  # the update over 4 microbatches
    variant("gpt2-small", False, 8, 2)
    variant("gpt2-small-modern", "attention", 16, 1)
    variant("gpt2-small-modern", "full", 16, 1)
    variant("gpt2-small-2026", "attention", 8, 2, steps=3)
    variant("gpt2-small-2026", "full", 8, 2, steps=3)
elif which == "dedupe":  # the model's copy of splash's output, saved beside the kernel's residuals (before) or not
    from jaxgpt.ops.tpu import TpuOps
    after = TpuOps.names_residuals
    for tag in ("after", "before", "after", "before"):
        TpuOps.names_residuals = after if tag == "after" else (lambda self, T, dropout: False)
        variant("gpt2-small", "attention", 16, 1, tag=tag)
    TpuOps.names_residuals = after
    import jaxgpt.ops.tpu as tpu_ops  # splash's output handed on in bfloat16, not converted to float32 first
    kept = tpu_ops.splash_attention
    def bf16_out(q, k, v, segments, window, *, dtype, interpret=False):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
        B, T, H, D = q.shape
        if k.shape[2] != H:
            k, v = (jnp.repeat(t, H // k.shape[2], axis=2) for t in (k, v))
        kernel = tpu_ops._kernel(T, H, None if window is None or window >= T else window, interpret)
        hf = lambda t: t.astype(dtype).transpose(0, 2, 1, 3)
        qh, kh, vh = hf(q * D**-0.5), hf(k), hf(v)
        if segments is None:
            y = jax.vmap(kernel)(qh, kh, vh)
        else:
            y = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))(qh, kh, vh, segments)
        return y.transpose(0, 2, 1, 3).reshape(B, T, H * D)
    tpu_ops.splash_attention = bf16_out
    variant("gpt2-small", "attention", 16, 1, tag="after+bf16out")
    tpu_ops.splash_attention = kept
    variant("gpt2-small-2026", "attention", 8, 2, steps=3, tag="after")
elif which == "profiles":  # where the modern and 2026 recipes' steps go (never profiled before)
    variant("gpt2-small-2026", "full", 8, 2, steps=3, profile="2026-full")
    variant("gpt2-small-modern", "attention", 16, 1, profile="modern-attention")
elif which == "amortised":  # the update's share: the 2026 step at 8 microbatches (its plan runs 32 a step as shipped)
    variant("gpt2-small-2026", "full", 8, 8, steps=2)
    variant("gpt2-small-modern", "attention", 16, 4, steps=3)
    variant("gpt2-small-2026", "full", 8, 2, steps=3, train={"optimizer": "adamw", "learning_rate": 6e-4, "muon": None})
elif which == "attribute":  # the modern recipe's features one at a time back to GPT-2's (16 x 1, "attention")
    variant("gpt2-small-modern", "attention", 16, 1, steps=4, positions="learned", rope_base=None)
    variant("gpt2-small-modern", "attention", 16, 1, steps=4, qk_norm=False)
    variant("gpt2-small-modern", "attention", 16, 1, steps=4, logit_softcap=None)
    variant("gpt2-small-modern", "attention", 16, 1, steps=4, mlp="gelu")
    variant("gpt2-small-modern", "attention", 16, 1, steps=4, norm="layernorm")
elif which == "lanes":  # Ops.qk_lanes (QK-norm and rotary on lanes) and Ops.value_rows_once, on and off, alternating
    import jaxgpt.model.gpt as gpt_mod
    kept = gpt_mod.select_ops
    def with_flags(**flags):
        return lambda cfg, backend=None: dataclasses.replace(kept(cfg, backend), **flags)
    for tag in ("lanes", "heads", "lanes", "heads"):
        gpt_mod.select_ops = with_flags(qk_lanes=tag == "lanes")
        variant("gpt2-small-modern", "attention", 16, 1, steps=4, tag=tag)
    gpt_mod.select_ops = kept
elif which.startswith("flags2026"):  # the same two flags on the 2026 recipe's step ("flags2026b": the other order)
    import jaxgpt.model.gpt as gpt_mod
    kept = gpt_mod.select_ops
    def with_flags(**flags):
        return lambda cfg, backend=None: dataclasses.replace(kept(cfg, backend), **flags)
    order = ("once", "neither", "lanes+once") if which == "flags2026" else ("neither", "lanes+once", "once")
    for tag in order * 2:
        gpt_mod.select_ops = with_flags(qk_lanes="lanes" in tag, value_rows_once="once" in tag)
        variant("gpt2-small-2026", "full", 8, 2, steps=3, tag=tag)
    gpt_mod.select_ops = kept
elif which == "bf16act":  # hypothesis: the step's float32 elementwise work (the gap to 45%) halves with bfloat16
    # dense outputs: nnx.Linear in bfloat16 (its bias added in bfloat16, GELU on bfloat16), the residual
    # stream and the norms still float32. A timing probe, not the model's numerics.
    import jax.numpy as jnp
    from flax import nnx
    from jaxgpt.ops.neutral import Ops
    init0, dg0 = nnx.Linear.__init__, Ops.dot_general
    def init16(self, *a, **k):
        k.setdefault("dtype", jnp.bfloat16)
        init0(self, *a, **k)
    def dg16(self, x, w, *a, **k):
        return dg0(self, x, w, *a, **k).astype(x.dtype)
    for tag in ("bf16", "f32", "bf16", "f32"):
        nnx.Linear.__init__, Ops.dot_general = (init16, dg16) if tag == "bf16" else (init0, dg0)
        variant("gpt2-small", "attention", 16, 1, steps=4, tag=tag)
    for tag in ("bf16", "f32"):
        nnx.Linear.__init__, Ops.dot_general = (init16, dg16) if tag == "bf16" else (init0, dg0)
        variant("gpt2-small-modern", "attention", 16, 1, steps=4, tag=tag)
    nnx.Linear.__init__, Ops.dot_general = init0, dg0
elif which == "dense":  # model.json dense_dtype as built (the probe above rounded the weights' gradients), alternating
    for dense in ("compute", "float32", "compute", "float32"):
        variant("gpt2-small", "attention", 16, 1, steps=4, tag=dense, dense_dtype=dense)
    for run, remat, B, k in (("gpt2-small-modern", "attention", 16, 1), ("gpt2-small-2026", "full", 8, 2)):
        for dense in ("compute", "float32"):
            variant(run, remat, B, k, steps=4, tag=dense, dense_dtype=dense)
    # hypothesis: with the dense outputs in bfloat16 the saved products take half the memory, so keeping
    # them ("dots", or nothing recomputed at 8 x 2) may now fit and beat recomputing them
    variant("gpt2-small", "dots", 16, 1, steps=4, tag="compute", dense_dtype="compute")
    variant("gpt2-small", False, 8, 2, steps=4, tag="compute", dense_dtype="compute")
    variant("gpt2-small", "attention", 16, 1, steps=4, tag="compute", dense_dtype="compute", profile="dense")
elif which == "next":  # the update amortised as shipped (k = 8 of the 32), then splash's block for 64-wide heads
    variant("gpt2-small", "attention", 16, 8, steps=2, tag="k8")
    import jaxgpt.ops.tpu as tpu_ops  # hypothesis: a 64-wide head leaves a 512-row block's work too small
    for block in (1024, 256, 512):
        tpu_ops.BLOCK = block
        tpu_ops._kernel.cache_clear()
        variant("gpt2-small", "attention", 16, 1, steps=4, tag=f"block{block}")
elif which == "headloss":  # hypothesis: the head's gradient made beside its loss (no recomputed logits) saves ~8 ms
    import jaxgpt.model.loss as loss_mod
    made = loss_mod.head_loss
    def recomputed(ops, cfg, w, x, targets, weights):  # the loss before: chunked_losses' checkpointed scan
        ce = loss_mod.chunked_losses(ops, cfg, w, x.reshape(-1, x.shape[-1]), targets.reshape(-1)).reshape(targets.shape)
        return ce.mean() if weights is None else (ce * weights).sum()
    for tag in ("made", "recomputed", "made", "recomputed"):
        loss_mod.head_loss = made if tag == "made" else recomputed
        variant("gpt2-small", "attention", 16, 1, steps=4, tag=tag)
    for run, remat, B, k in (("gpt2-small-modern", "attention", 16, 1), ("gpt2-small-2026", "attention", 8, 2)):
        for tag in ("made", "recomputed"):
            loss_mod.head_loss = made if tag == "made" else recomputed
            variant(run, remat, B, k, steps=4, tag=tag)
    loss_mod.head_loss = made
print("speed done", flush=True)
