"""How a model's operations run on a backend, chosen once per (config, backend): `select`.

- compute_dtype "auto" resolves here (`resolve_compute_dtype`): bfloat16 on GPU / TPU and on a CPU
  with native bfloat16 dot products (AVX512_BF16 or AMX-BF16), float32 on other CPUs.
- model.json's `attention` resolves here too (`attention_kernel`): cuDNN's flash attention on a GPU
  where it can run the model's shapes, Pallas splash attention on one TPU chip, XLA's elsewhere,
  one head at a time on the CPU.
- the CPU gets cpu.py's `CpuOps`, a TPU tpu.py's `TpuOps`, every other backend neutral.py's `Ops`;
  cpu.py and jaxgpt/cpu/ are imported here for the CPU only, tpu.py for the TPU only.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from jaxgpt.config import MODEL_FILE, ConfigError, ModelConfig
from jaxgpt.ops.neutral import Ops

LANES = 128  # a TPU vector register's lanes: narrower heads run QK-norm and rotary on lanes there


def resolve_compute_dtype(requested: str, backend: str, cpu_flags: frozenset[str] | None = None) -> str:
    """model.json compute_dtype on `backend`: "auto" becomes bfloat16 on accelerators (their
    matmul units are bfloat16 ones) and, on a CPU, what jaxgpt.cpu.kernels.auto_compute_dtype says for
    its flags (`cpu_flags`: default this machine's /proc/cpuinfo)."""
    if requested != "auto":
        return requested
    if backend != "cpu":
        return "bfloat16"
    from jaxgpt.cpu import kernels  # the CPU is chosen here

    return kernels.auto_compute_dtype(kernels.cpu_flags() if cpu_flags is None else cpu_flags)


def attention_kernel(cfg: ModelConfig, backend: str) -> str:
    """The kernel model.json's `attention` resolves to on `backend`; bad choices are ConfigErrors."""
    if cfg.attention == "per_head" and backend != "cpu":
        raise ConfigError(
            f"{MODEL_FILE}: attention='per_head' is the CPU kernel (JAX's backend here: "
            f"{backend}); use 'auto', 'xla' or 'cudnn'"
        )
    if cfg.attention == "splash" and backend != "tpu":
        raise ConfigError(
            f"{MODEL_FILE}: attention='splash' is the TPU's Pallas kernel (JAX's backend here: {backend}); use 'auto'"
        )
    if cfg.attention == "cudnn":
        if backend != "gpu":
            raise ConfigError(
                f"{MODEL_FILE}: attention='cudnn' needs a GPU (JAX's backend here: {backend}); use 'auto'"
            )
        reason = _cudnn_unavailable(cfg)
        if reason:
            raise ConfigError(f"{MODEL_FILE}: attention='cudnn' cannot run here ({reason}); use 'auto' or 'xla'")
        return "cudnn"
    if cfg.attention != "auto":
        return cfg.attention
    if backend == "cpu":
        return "per_head"
    if backend == "tpu":
        # The kernel runs per chip: a mesh of several chips keeps XLA's, which the partitioner shards.
        return "splash" if jax.device_count() == 1 and cfg.context_length % 128 == 0 else "xla"
    if backend == "gpu" and resolve_compute_dtype(cfg.compute_dtype, backend) == "bfloat16":
        reason = _cudnn_unavailable(cfg)
        if not reason:
            return "cudnn"
        print(
            f"note: {MODEL_FILE} attention='auto': cuDNN flash attention unavailable ({reason}); using XLA's attention",
            file=sys.stderr,
            flush=True,
        )
    return "xla"


def _cudnn_unavailable(cfg: ModelConfig) -> str | None:
    """Why cuDNN's flash attention cannot run this model's shapes, or None if it can.

    Lowering a forward and backward pass of one sequence for CUDA runs every check JAX makes
    (cuDNN present and recent enough, head size, layout) without compiling or running anything.
    """
    T, D = cfg.context_length, cfg.head_dim
    q_shape = jax.ShapeDtypeStruct((1, T, cfg.n_heads, D), jnp.bfloat16)
    kv_shape = jax.ShapeDtypeStruct((1, T, cfg.kv_heads, D), jnp.bfloat16)
    short = min(cfg.layer_windows(), default=T)  # the model's shortest window, if it has one

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        y = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="cudnn", local_window_size=None if short >= T else (short - 1, 0)
        )
        return y.astype(jnp.float32).sum()

    try:  # for CUDA explicitly where the process itself runs elsewhere (an export from a CPU)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        traced = grad.trace(q_shape, kv_shape, kv_shape)  # the checks run here ...
        traced.lower() if jax.default_backend() == "gpu" else traced.lower(lowering_platforms=("cuda",))  # ... or here
    except (RuntimeError, ValueError, NotImplementedError) as e:  # what JAX's cuDNN checks raise
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


@functools.lru_cache(maxsize=None)
def select(cfg: ModelConfig, backend: str | None = None) -> Ops:
    """The operations `cfg` runs with on `backend` (default: JAX's default backend).

    The one place that looks at the backend. Cached, so each (config, backend) is resolved, and
    any cuDNN probe made, once per process.
    """
    backend = backend or jax.default_backend()
    kernel = attention_kernel(cfg, backend)
    dtype = resolve_compute_dtype(cfg.compute_dtype, backend)
    windows = tuple(sorted(set(cfg.layer_windows()))) if cfg.window_pattern else ()
    dense = dtype if cfg.dense_dtype == "compute" else "float32"
    if backend == "cpu":
        from jaxgpt.ops.cpu import CpuOps  # the CPU is chosen here: nothing of it, or of jaxgpt/cpu/, loads elsewhere

        return CpuOps(backend, dtype, kernel, windows=windows, dense_dtype=dense)
    if backend == "tpu":
        from jaxgpt.ops.tpu import TpuOps  # Pallas's TPU kernels load on a TPU only

        # QK-norm and rotary on lanes where a head fills less than a lane tile (128): docs/accelerators.md
        return TpuOps(backend, dtype, kernel, windows=windows, qk_lanes=cfg.head_dim < LANES, dense_dtype=dense)
    return Ops(backend, dtype, kernel, windows=windows, dense_dtype=dense)
