"""The model + AdamW of a run built as train.py builds them on one accelerator (create_sharded ->
build_on_host), timed in a fresh process: `parts` (the host's programs compiled in parallel threads, this
commit) or `one` (one program, as before). Prints one JSON line: phases, RSS, a checksum of the weights.

    python3 startup6.py parts|one [run]
"""
import hashlib, json, sys, time
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return round(int(line.split()[1]) / 1e6, 2)
T = {"mode": sys.argv[1], "run": sys.argv[2] if len(sys.argv) > 2 else "gpt2-small"}
t0 = time.perf_counter()
import jax
import numpy as np
from flax import nnx
from jaxgpt import caches
from jaxgpt.config import load_run_configs
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer
caches.enable_compile_cache()
jax.devices()
T["backend_s"] = round(time.perf_counter() - t0, 2)
T["rss_backend_gb"] = rss()
if T["mode"] == "one":
    sharding._built_in_parts = lambda build: nnx.jit(build)()
mcfg, tcfg = load_run_configs(Path("runs") / T["run"])
mesh = sharding.make_mesh(tcfg.mesh, tcfg.microbatch_size)
t = time.perf_counter()
model, opt = sharding.create_sharded(lambda: build_model(mcfg, seed=tcfg.seed), mesh, tcfg.mesh.fsdp, "x",
                                     lambda m: make_optimizer(m, tcfg, 1000))
jax.block_until_ready(nnx.state((model, opt)))
T["build_s"] = round(time.perf_counter() - t, 2)
T["rss_after_gb"] = rss()
h = hashlib.sha256()
for x in jax.tree.leaves(nnx.state(model, nnx.Param)):
    h.update(np.asarray(x).tobytes())
T["weights_sha"] = h.hexdigest()[:16]
T["platform"] = jax.devices()[0].platform
print(json.dumps(T), flush=True)
