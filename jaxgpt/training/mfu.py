"""Model FLOPs utilisation: FLOPs per token from the model config, and the peak they are set against.

    flops_per_token(model_cfg, seq_len)   # training (forward + backward) FLOPs of one token
    peak_flops("bfloat16")                # (FLOP/s, where the figure comes from) for this machine

MFU = tokens/s x flops_per_token / peak, capped at 1; the trainer and the benchmarks use these same
functions. An accelerator's peak is its spec sheet's bf16 dense figure (CHIP_PEAKS_TFLOPS, times
the devices); a CPU or an unknown chip gets a measured matmul peak of the compute dtype, the best of
several trials, kept per machine in $JAXGPT_CACHE_DIR/peak_flops.json and only ever raised
(`python -m jaxgpt.training.mfu`, or raise_peak with a run's rate). More: docs/watching.md "MFU".
"""

from __future__ import annotations

import os
import time

from jaxgpt import caches
from jaxgpt.config import ModelConfig

FLOPS_CONVENTION = (
    "6 x (12 L C^2 + V C) + 12 L T C: matmul weights of the blocks and the (tied) head, "
    "plus attention scores/values, not halved for the causal mask (PaLM appendix B, "
    "nanoGPT's estimate_mfu; biases, LayerNorms and embedding lookups not counted); "
    "with grouped-query attention the key/value weights are 2 C K D a layer instead of "
    "2 C^2, and a sliding-window layer counts its window instead of T (nanochat's)"
)

# bfloat16 dense peaks (TFLOP/s, no sparsity; the vendors' spec sheets) by device_kind, first
# match wins: MFU on an accelerator is against the chip's peak, not a measured matmul.
CHIP_PEAKS_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756),
    ("H100 NVL", 835),
    ("H100", 989),
    ("H200", 989),
    ("H800", 989),
    ("B200", 2250),
    ("A100", 312),
    ("L40S", 362),
    ("L40", 181),
    ("L4", 121),
    ("TPU v4", 275),
    ("TPU v5 lite", 197),
    ("TPU v5e", 197),
    ("TPU v5", 459),
    ("TPU v6 lite", 918),
    ("TPU v6e", 918),
)


def flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward = 3 x forward) FLOPs of one token of a length-`seq_len` sequence.

    6 x (the head's V C + the blocks' 12 L C^2: qkv 3 C^2, projection C^2, MLP 8 C^2; less with
    grouped-query keys), plus 12 T C per layer (T capped by its window) for attention's two products
    over the whole T x T square, as PaLM and nanoGPT count it (a causal kernel skips about half).
    """
    C = model.emb_dim
    matmul_params = model.vocab_size * C  # the output head
    if model.architecture == "gpt2":
        kv = 2 * C * model.kv_heads * model.head_dim  # 2 C^2 without grouped-query attention
        matmul_params += model.n_layers * (10 * C**2 + kv)
        attended = sum(min(window, seq_len) for window in model.layer_windows())  # L T without windows
        return 6 * matmul_params + 12 * attended * C
    return 6 * matmul_params  # a-to-a: embedding -> head, no attention


def chip_peak_flops(device_kind: str) -> tuple[float, str] | None:
    """(bf16 dense peak FLOP/s, where it comes from) for a JAX device_kind, or None if unknown."""
    for name, tflops in CHIP_PEAKS_TFLOPS:
        if name.lower() in device_kind.lower():
            return tflops * 1e12, f"spec sheet: {name} bf16 dense {tflops:g} TFLOP/s"
    return None


def matmul_flops(size: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """Best FLOP/s of a jitted size^3 matmul on the default device: what a training step whose
    matmuls run in that dtype can reach at most."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.dtype(dtype))
    # float32 accumulation and result, as the model's matmuls (model.mixed_einsum): XLA:CPU runs
    # bf16 x bf16 -> f32 on its native bf16 kernels, but upcasts a bf16 -> bf16 product.
    matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    matmul(a, a).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


CACHE = "peak_flops.json"  # in caches.cache_root()
TRIALS, REPEATS = 3, 5  # a first measurement: the best of TRIALS rounds of REPEATS matmuls


def _measured_key(compute_dtype: str) -> tuple[str, str, int] | None:
    """(cache key, dtype, device count) when this machine's peak is measured, None for a spec sheet's."""
    import jax

    device = jax.devices()[0]
    if device.platform != "cpu" and chip_peak_flops(device.device_kind) is not None:
        return None
    dtype = "float32" if compute_dtype == "float32" else "bfloat16"
    # One CPU device runs on every core: its measured peak is the machine's, not multiplied.
    count = 1 if device.platform == "cpu" else jax.device_count()
    key = (
        f"{device.platform}|{device.device_kind}|{caches.cpu_model()}|{os.cpu_count()} cores|"
        f"jax {jax.__version__}|{dtype}"
    )
    return key, dtype, count


def _store(key: str, flops: float, how: str) -> dict:
    record = {"flops": flops, "date": time.strftime("%Y-%m-%d"), "cpu": caches.cpu_model(), "how": how}
    caches.remember(CACHE, key, record)
    return record


def _source(record: dict, dtype: str) -> str:
    return f"{record['how']} ({dtype}, {record['cpu']}, {record['date']}; {caches.cache_root() / CACHE})"


def peak_flops(compute_dtype: str, *, measure: bool = False) -> tuple[float, str]:
    """(peak FLOP/s of all this job's devices, where the figure comes from) for MFU. A measured peak is
    stored once (best of TRIALS rounds); `measure`: measure again now, keeping the higher figure."""
    import jax

    found = _measured_key(compute_dtype)
    if found is None:
        chip = chip_peak_flops(jax.devices()[0].device_kind)
        assert chip is not None
        return chip[0] * jax.device_count(), f"{chip[1]} x {jax.device_count()} device(s)"
    key, dtype, count = found
    record = caches.recall(CACHE, key)
    dated = isinstance(record, dict) and isinstance(record.get("flops"), (int, float))
    if not dated or measure:  # none yet, or an older cache's undated figure (maybe of a busy machine)
        old = record["flops"] if dated else record if isinstance(record, (int, float)) else 0.0
        best = max(matmul_flops(2048, repeats=REPEATS, dtype=dtype) for _ in range(TRIALS))
        how = f"measured: best {dtype} 2048^3 matmul of {TRIALS}x{REPEATS} on {jax.devices()[0].device_kind}"
        if not dated or best > old:
            record = _store(key, max(best, old), how)
    return record["flops"] * count, _source(record, dtype)


def raise_peak(compute_dtype: str, achieved: float) -> tuple[float, str] | None:
    """A run reached `achieved` FLOP/s: above a measured peak (one measured while the machine was
    busy), that rate is the new stored peak; (peak, source) then, else None."""
    found = _measured_key(compute_dtype)
    if found is None:
        return None
    key, dtype, count = found
    record = caches.recall(CACHE, key)
    stored = record.get("flops", 0.0) if isinstance(record, dict) else 0.0
    if achieved / count <= stored:
        return None
    record = _store(key, achieved / count, "raised to a training run's achieved rate")
    return record["flops"] * count, _source(record, dtype)


def mfu(tokens_per_s: float, per_token: float, peak: float) -> float:
    """Model FLOPs utilisation, at most 1: a step timed short (a noisy clock) is no faster than the peak."""
    return min(1.0, tokens_per_s * per_token / peak)


if __name__ == "__main__":  # uv run python -m jaxgpt.training.mfu: measure again (a quiet machine), keep the higher
    for name in ("float32", "bfloat16"):
        flops, where = peak_flops(name, measure=True)
        print(f"{name}: {flops / 1e9:,.1f} GFLOP/s, {where}")
