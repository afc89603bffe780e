"""The compiled TPU train step's HLO of the shipped 124M recipes (nothing run): where the modern and 2026
steps' backward loop copies (its while's self time: 2.6 ms a layer against gpt2's 0.1).
    python3 .accel/hlo.py OUT
"""
import dataclasses, gzip, json, sys, time
from pathlib import Path
import jax
jax.config.update("jax_compilation_cache_dir", "/tmp/jc")
from bench.train_step import _batches, _build
from jaxgpt.config import load_run_configs
from jaxgpt.training import memory
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.training.train_step import StepRunner, step_key
OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
for run, remat, B, k in (("gpt2-small-modern", "attention", 16, 1), ("gpt2-small", "attention", 16, 1),
                         ("gpt2-small-2026", "full", 8, 2)):
    t0 = time.time()
    m, t = load_run_configs(Path("runs") / run)
    m = dataclasses.replace(m, remat=remat, loss_chunk=4096)
    if "tiny" in sys.argv:  # a CPU rehearsal
        m, B = dataclasses.replace(m, emb_dim=64, n_heads=2, n_layers=4, context_length=128), 2
    t = dataclasses.replace(t, microbatch_size=B, gradient_accumulation_steps=k, batch_size=None)
    T = t.seq_len(m)
    mdl, opt, mesh, rws, init_s = _build(m, t, 100, run)
    put = _batches(t, m.vocab_size, T, mesh, rws)
    runner = StepRunner(mdl, opt)
    lowered = runner.lower(Batch(*put(0)), step_key(0, 0))
    compiled = lowered.compile()
    with gzip.open(OUT / f"hlo-{run}.txt.gz", "wt") as f:
        f.write(compiled.as_text())
    with gzip.open(OUT / f"pre-{run}.txt.gz", "wt") as f:
        f.write(lowered.as_text())
    print(run, f"{time.time() - t0:.0f} s", round(memory.compiled_bytes(compiled) / 2**30, 2), "GiB", flush=True)
    del mdl, opt, runner, compiled, lowered
    jax.clear_caches()
