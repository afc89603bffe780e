"""Start-up phases of a run's model + optimiser on this device (build_on_host), and the alternative
of the optimiser state made on the device."""
import json, sys, time
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1e6
t0 = time.perf_counter()
import jax, optax
from flax import nnx
from jaxgpt.config import load_run_configs
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer
jax.devices(); cpu = jax.local_devices(backend="cpu")[0]
out = {"backend_s": time.perf_counter() - t0, "rss_backend": rss()}
run = sys.argv[1]
mcfg, tcfg = load_run_configs(Path(run))
mesh = sharding.make_mesh(tcfg.mesh, tcfg.microbatch_size)
def build():
    m = build_model(mcfg, seed=tcfg.seed); return m, make_optimizer(m, tcfg, 1000)
def lap(name, t):
    now = time.perf_counter(); out[name] = round(now - t, 3); return now
t = time.perf_counter()
abstract = nnx.eval_shape(build); t = lap("eval_shape", t)
shard = sharding.state_shardings(nnx.state(abstract), mesh, tcfg.mesh.fsdp); t = lap("shardings", t)
with jax.default_device(cpu):
    f = nnx.jit(build)
    objs = f(); jax.block_until_ready(nnx.state(objs)); t = lap("host_jit_first", t)
    objs = f(); jax.block_until_ready(nnx.state(objs)); t = lap("host_jit_second", t)
st = nnx.state(objs)
placed = jax.device_put(st, shard); jax.block_until_ready(placed); t = lap("device_put_all", t)
out["rss_after"] = rss()
# model only on host, the optimiser's state made on the device
with jax.default_device(cpu):
    m = nnx.jit(lambda: build_model(mcfg, seed=tcfg.seed))(); jax.block_until_ready(nnx.state(m))
t = lap("host_model_only", t)
t = time.perf_counter()
mstate = jax.device_put(nnx.state(m), sharding.state_shardings(nnx.state(m), mesh, tcfg.mesh.fsdp)); jax.block_until_ready(mstate)
nnx.update(m, mstate); t = lap("device_put_model", t)
opt = nnx.jit(lambda mm: make_optimizer(mm, tcfg, 1000))(m); jax.block_until_ready(nnx.state(opt)); t = lap("device_opt_jit", t)
out["rss_end"] = rss(); out["run"] = run
print(json.dumps(out), flush=True)
