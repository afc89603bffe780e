"""Where the host build's 8 s go on the TPU machine: trace+lower vs compile, and whether the persistent cache hits."""
import json, time, os, logging
from pathlib import Path
T = {}
import jax
from flax import nnx
from jaxgpt import caches
T["cache_dir"] = str(caches.enable_compile_cache())
logging.basicConfig(level=logging.WARNING)
logging.getLogger("jax._src.compilation_cache").setLevel(logging.DEBUG)
logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)
from jaxgpt.config import load_run_configs
from jaxgpt.model.gpt import build_model
jax.devices()
mcfg, tcfg = load_run_configs(Path("runs/gpt2-small"))
cpu = jax.local_devices(backend="cpu")[0]
def states():
    return nnx.state(build_model(mcfg, seed=tcfg.seed))
with jax.default_device(cpu):
    t = time.perf_counter(); traced = jax.jit(states).trace(); T["trace"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter(); lowered = traced.lower(); T["lower"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter(); compiled = lowered.compile(); T["compile"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter(); out = compiled(); jax.block_until_ready(out); T["run"] = round(time.perf_counter() - t, 3)
T["cache_files"] = len(list(Path(T["cache_dir"]).glob("*"))) if T["cache_dir"] != "None" else None
T["supports_serialization_cpu"] = getattr(jax.devices("cpu")[0].client, "supports_executable_serialization", "?")
T["hlo_ops"] = lowered.as_text().count("\n")
print(json.dumps(T), flush=True)
