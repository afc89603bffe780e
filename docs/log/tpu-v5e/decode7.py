"""The KV cache's select write on the chip: 124M bf16 greedy decoding through the engine at batch 1 and 16
(bench generate's measurement), then RL's sampling (temperature 1, top_k 50, GPT-2's vocabulary) at 96
rows: 6 prompts x 16 samples of 128 tokens, the top-k candidates drawn on the device and not, alternating
after an untimed round of each; the programs' temporaries.
    python3 decode7.py OUT
"""
import dataclasses, json, sys, time
from pathlib import Path
import numpy as np
import jax
from bench.decode import GPT2_124M, bench_generate
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.generation.engine import Engine
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model
T0 = time.time()
cfg = dataclasses.replace(GPT2_124M, compute_dtype="bfloat16", scan_layers=True)
for b in (1, 16):
    r = bench_generate(new_tokens=128, batch_size=b, cfg=cfg, uncached=False, repeats=3)
    print(json.dumps({k: r[k] for k in ("batch_size", "cached_tok_s", "ms_per_token_median", "compile_step_s", "burst")}), f"[{time.time()-T0:.0f} s]", flush=True)
engine = Engine(build_model(cfg), get_tokenizer("gpt2"), rows=96)
prompts = [[10 + i, 20 + i, 30 + i] for i in range(6)]
params = SamplingParams(max_tokens=128, temperature=1.0, top_k=50, seed=1)
def once():
    t = time.perf_counter()
    out = engine.generate([p for p in prompts for _ in range(16)], params)
    return sum(len(r.sampled) for r in out) / (time.perf_counter() - t)
for top in (True, False):
    engine.top_on_device = top
    once(); print(f"untimed round (top_on_device {top}) done [{time.time()-T0:.0f} s]", engine.stats.summary(), flush=True)
rates = {True: [], False: []}
for top in (True, False, True, False):
    engine.top_on_device = top
    engine.stats = type(engine.stats)()
    rates[top].append(once())
    print(json.dumps({"rl_rows": 96, "top_on_device": top, "tok_s": round(rates[top][-1]), "stats": engine.stats.summary()}), f"[{time.time()-T0:.0f} s]", flush=True)
for (kind, size), prog in engine.decoder._programs.items():
    ma = prog.memory_analysis()
    print(json.dumps({"program": kind, "size": str(size), "temp_MiB": round(ma.temp_size_in_bytes / 2**20, 1)}), flush=True)
