"""The host's half of create_sharded on an accelerator (sharding.host_state: GPT-2 124M built by XLA:CPU in
parts), timed in a fresh process; prints seconds, and a checksum of the weights."""
import hashlib, json, sys, time
from pathlib import Path
import jax, numpy as np
from flax import nnx
from jaxgpt import caches
from jaxgpt.config import load_run_configs
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
caches.enable_compile_cache()
jax.devices()
mcfg, tcfg = load_run_configs(Path("runs/gpt2-small"))
t = time.perf_counter()
state = sharding.host_state(lambda: build_model(mcfg, seed=tcfg.seed))
jax.block_until_ready(state)
s = time.perf_counter() - t
h = hashlib.sha256()
for x in jax.tree.leaves(nnx.state(state, nnx.Param)):
    h.update(np.asarray(x).tobytes())
print(json.dumps({"tree": sys.argv[1], "host_state_s": round(s, 2), "sha": h.hexdigest()[:16]}))
