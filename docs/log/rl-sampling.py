"""The engine's sampled tokens/s at RL's sampling settings (temperature 1, top_k 50) with GPT-2's vocabulary:
a small random model (2 layers, 128 wide, vocab 50,304) so the host's draw is what is timed; 16 rows,
8 prompts x 2 samples of 64 tokens, one untimed round, then 3 timed."""
import dataclasses, json, sys, time
import numpy as np
from bench.decode import GPT2_124M
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.generation.engine import Engine
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model
cfg = dataclasses.replace(GPT2_124M, vocab_size=50304, emb_dim=128, n_heads=2, n_layers=2, context_length=256)
engine = Engine(build_model(cfg), get_tokenizer("gpt2"), rows=16)
prompts = [[10 + i, 20 + i, 30 + i] for i in range(8)]
params = SamplingParams(max_tokens=64, temperature=1.0, top_k=50, seed=1)
def once():
    t = time.perf_counter()
    out = engine.generate([p for p in prompts for _ in range(2)], params)
    return sum(len(r.sampled) for r in out) / (time.perf_counter() - t), [r.sampled for r in out]
once()
rates = []
for _ in range(3):
    r, toks = once(); rates.append(r)
print(json.dumps({"tree": sys.argv[1], "tok_s": [round(x) for x in rates], "median": round(float(np.median(rates))), "first": toks[0][:8]}))
