"""Start-up phases of runs/gpt2-small's model + AdamW as create_sharded builds them on one accelerator
(build_on_host), each timed; then alternatives: the model built on the chip in one jit, and eagerly on the host."""
import json, sys, time, os
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return round(int(line.split()[1]) / 1e6, 2)
T = {}
t0 = time.perf_counter()
import jax
from flax import nnx
from jaxgpt import caches
from jaxgpt.config import load_run_configs
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer
caches.enable_compile_cache()
jax.devices()
T["backend"] = time.perf_counter() - t0
T["rss_backend"] = rss()
mcfg, tcfg = load_run_configs(Path("runs/gpt2-small"))
mesh = sharding.make_mesh(tcfg.mesh, tcfg.microbatch_size)
build = lambda: build_model(mcfg, seed=tcfg.seed)
then = lambda m: make_optimizer(m, tcfg, 1000)
def tick(name, t):
    T[name] = round(time.perf_counter() - t, 3)
    return time.perf_counter()
t = time.perf_counter(); t_all = t
abstract = nnx.eval_shape(lambda: (lambda b: (b, then(b)))(build()))
t = tick("eval_shape", t)
shardings = sharding.state_shardings(nnx.state(abstract), mesh, tcfg.mesh.fsdp)
t = tick("shardings", t)
cpu = jax.local_devices(backend="cpu")[0]
with jax.default_device(cpu):
    f = nnx.jit(build)
    built = f()
    jax.block_until_ready(nnx.state(built))
t = tick("host_build_first", t)
with jax.default_device(cpu):
    built2 = f(); jax.block_until_ready(nnx.state(built2)); del built2
t = tick("host_build_again", t)
placed = jax.device_put(nnx.state(built), shardings[0]); jax.block_until_ready(placed)
t = tick("device_put", t)
nnx.update(built, placed)
@nnx.jit
def rest(b):
    made = then(b)
    nnx.update(made, jax.lax.with_sharding_constraint(nnx.state(made), shardings[1]))
    return made
opt = rest(built); jax.block_until_ready(nnx.state(opt))
t = tick("optimizer_on_device_first", t)
opt2 = rest(built); jax.block_until_ready(nnx.state(opt2)); del opt2
t = tick("optimizer_on_device_again", t)
T["total_build_on_host"] = round(time.perf_counter() - t_all, 3)
T["rss_after"] = rss()
del opt, built, placed
if os.environ.get("ALT"):
    with jax.default_device(cpu):
        t = time.perf_counter(); m = build(); jax.block_until_ready(nnx.state(m)); t = tick("host_eager", t); del m
    t = time.perf_counter(); m = nnx.jit(build)(); jax.block_until_ready(nnx.state(m)); t = tick("device_jit_build_first", t); del m
    t = time.perf_counter(); m = nnx.jit(build)(); jax.block_until_ready(nnx.state(m)); t = tick("device_jit_build_again", t); del m
t = time.perf_counter()
model, opt = sharding.create_sharded(build, mesh, tcfg.mesh.fsdp, "runs/gpt2-small", then)
jax.block_until_ready(nnx.state((model, opt)))
tick("create_sharded_after_warm", t)
print(json.dumps(T), flush=True)
