"""Start-up of a shipped run's model and optimiser as train.py builds them (create_sharded: the model on the
host, the optimiser's state on the device), with XLA's compile cache on as train.py has it; host memory."""
import json, sys, time
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1e6
t0 = time.perf_counter()
import jax
from flax import nnx
from jaxgpt import caches
from jaxgpt.config import load_run_configs
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer
cache = caches.enable_compile_cache()
jax.devices()
out = {"backend_s": round(time.perf_counter() - t0, 2), "rss_backend_gb": rss(), "compile_cache": str(cache)}
for run in sys.argv[1:]:
    mcfg, tcfg = load_run_configs(Path(run))
    mesh = sharding.make_mesh(tcfg.mesh, tcfg.microbatch_size)
    t = time.perf_counter()
    model, opt = sharding.create_sharded(lambda: build_model(mcfg, seed=tcfg.seed), mesh, tcfg.mesh.fsdp, where=run,
                                         then=lambda m: make_optimizer(m, tcfg, 1000))
    jax.block_until_ready(nnx.state((model, opt)))
    out[run] = {"build_s": round(time.perf_counter() - t, 2), "rss_after_gb": rss(),
                "devices": sorted({str(x.device) if hasattr(x, "device") else "?" for x in jax.tree.leaves(nnx.state(opt))})[:2]}
    del model, opt
print(json.dumps(out), flush=True)
