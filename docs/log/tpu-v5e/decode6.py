"""Where a bf16 124M decode step's time goes on this chip: greedy decoding at batch 1 and 16 through the
engine (bench generate's measurement), then each compiled decode program's HLO searched for copies of
cache-shaped arrays (a copy of the KV cache per step would explain 2.0 ms/step at batch 16), and a
profile of a few bursts at batch 16.

    python3 decode6.py OUT
"""
import dataclasses, json, re, sys, tarfile
from pathlib import Path
import jax
from bench.decode import GPT2_124M, bench_generate
from jaxgpt.generation.engine import Engine
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model
OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
cfg = dataclasses.replace(GPT2_124M, compute_dtype="bfloat16", scan_layers=True)
rows = []
for b in (1, 16):
    r = bench_generate(new_tokens=128, batch_size=b, cfg=cfg, uncached=False, repeats=3)
    rows.append({k: r[k] for k in ("batch_size", "cached_tok_s", "ms_per_token_median", "compile_step_s", "burst")})
    print(json.dumps(rows[-1]), flush=True)
model = build_model(cfg)
engine = Engine(model, None, rows=16)
params = SamplingParams(max_tokens=64, temperature=0.0)
prompts = [[1, 2, 3, 4] for _ in range(16)]
engine.generate(prompts, params)
cache_shapes = {tuple(c.shape) for c in jax.tree.leaves(engine.decoder._cache)}
print("cache shapes", cache_shapes, flush=True)
for (kind, size), prog in engine.decoder._programs.items():
    text = prog.as_text()
    (OUT / f"hlo-{kind}.txt").write_text(text) if kind in ("steps", "step") else None
    copies = [l.strip()[:200] for l in text.splitlines() if re.search(r"= \S+ copy(-start)?\(", l)]
    big = [l for l in copies if any(",".join(map(str, s)) in l.replace(" ", "") for s in cache_shapes)]
    print(json.dumps({"program": kind, "size": str(size), "copies": len(copies), "cache_shaped_copies": big[:6]}), flush=True)
d = Path("/tmp/prof-decode")
jax.profiler.start_trace(str(d))
engine.generate(prompts, params)
jax.profiler.stop_trace()
with tarfile.open(OUT / "prof-decode.tgz", "w:gz") as tf:
    tf.add(d, arcname="decode")
print("decode done", flush=True)
