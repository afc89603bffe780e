"""The train-step benchmark behind `uv run -m bench train` (and `compare`'s our side).

The harness's own optimiser step (optimizer.make_optimizer + train_step.StepRunner, built and fed as
jaxgpt/training/loop.py does) on random tokens of a run's shapes or of a bench/torch_step.py config: time to
the first result (compile), steady-state tokens/s (median, min/max, IQR over timed windows, each
ending with a block on the result), model FLOPs per token (6 x (12 L C^2 + V C) + 12 L T C) and
MFU against fp32 and bf16 matmul peaks measured in the same process, peak host RSS and device
memory; `accum_sweep` runs one fresh process per gradient-accumulation k.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.config import ConfigError, ModelConfig, TrainConfig, to_dict
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.training.mfu import CHIP_PEAKS_TFLOPS, FLOPS_CONVENTION, chip_peak_flops, matmul_flops  # noqa: F401 (bench API)
from jaxgpt.training.mfu import flops_per_token as train_flops_per_token

# name: (vocab, context, layers, heads, dims, batch), as bench/torch_step.py's CONFIGS | EXTRA_CONFIGS
REFERENCE_CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "char-tiny": (65, 256, 6, 6, 384, 8),
    "cpu-small": (256, 128, 4, 4, 128, 16),
    "gpt2-vocab": (50304, 256, 4, 4, 256, 4),
    "nano-cpu": (257, 64, 4, 4, 128, 12),  # nanoGPT's README CPU recipe on bytes (the reference's EXTRA_CONFIGS)
}


def versions() -> dict[str, str]:
    """The stack's versions, for the record."""
    import importlib.metadata

    out = {}
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


class BenchError(RuntimeError):
    """A benchmark that cannot run as asked; the message is one line."""


def reference_configs(name: str) -> tuple[ModelConfig, TrainConfig]:
    """The torch reference's model and step as our configs.

    GPT-2 with biases on (qkv too), dropout 0, the head tied to the token embedding; AdamW at
    lr 3e-4 with torch's default betas (0.9, 0.999) and weight decay 0.1 on matrices, clipping at
    1.0, one microbatch per optimiser step, float32 throughout.
    """
    if name not in REFERENCE_CONFIGS:
        raise ConfigError(f"--config {name!r}: known configs are {', '.join(sorted(REFERENCE_CONFIGS))}")
    vocab, context, layers, heads, dims, batch = REFERENCE_CONFIGS[name]
    model = ModelConfig(
        architecture="gpt2",
        vocab_size=vocab,
        context_length=context,
        emb_dim=dims,
        n_heads=heads,
        n_layers=layers,
        qkv_bias=True,
        drop_rate=0.0,
        tie_embeddings=True,
    )
    train = TrainConfig(
        microbatch_size=batch,
        gradient_accumulation_steps=1,
        train_steps=1000,
        learning_rate=3e-4,
        warmup_percent=0.0,
        adam_b1=0.9,
        adam_b2=0.999,
        adam_eps=1e-8,
        weight_decay=0.1,
        clipping_max_norm=1.0,
    )
    return model, train


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (getrusage maxrss), MiB."""
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB on Linux


def device_memory_stats() -> dict[str, int] | None:
    """The first local device's allocator figures (GPU/TPU); None where the backend keeps none (CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats()
    if not stats:
        return None
    keep = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit", "largest_alloc_size", "num_allocs")
    return {key: int(stats[key]) for key in keep if key in stats}


def _spread(rates: list[float]) -> dict[str, float]:
    q25, q50, q75 = np.percentile(rates, [25, 50, 75])
    return {
        "tokens_per_s_median": float(q50),
        "tokens_per_s_min": float(min(rates)),
        "tokens_per_s_max": float(max(rates)),
        "tokens_per_s_q25": float(q25),
        "tokens_per_s_q75": float(q75),
    }


def bench_train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    *,
    name: str = "",
    steps: int = 10,
    warmup: int = 4,
    windows: int = 5,
    accumulation: int | None = None,
    matmul_size: int | None = 2048,
    xla_memory: bool = False,
    breakdown: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Figures for `uv run -m bench train`: the harness's own optimiser step on random tokens.

    The model and optimiser are built as jaxgpt/training/loop.py builds them (sharding.create_sharded over the
    run's mesh, optimizer.make_optimizer); each step is one call of train_step.StepRunner (train_step, as the
    trainer runs it) on a (k, B, T) batch put on the device with jax.device_put
    (sharding.put_batch), the next batch being put while the device works, as in training. The
    first call is timed to its result (trace + compile + one step); then `warmup` untimed steps,
    then `windows` windows of `steps` steps, each ending with a block on the last step's results.
    Tokens count k x B x T per optimiser step. The peak matmul rates are measured last (fp32 and
    bf16, size^3), so the peak RSS is training's alone.
    """
    import os

    import jax

    from jaxgpt.training.train_step import StepRunner, step_key

    train_cfg = _checked(train_cfg, steps, windows, warmup, accumulation)
    T, k, seed = train_cfg.seq_len(model_cfg), train_cfg.gradient_accumulation_steps, train_cfg.seed
    load_before, memory = os.getloadavg(), {"host_rss_peak_before_model_mib": peak_rss_mib()}  # interpreter, JAX

    total_steps = 1 + warmup + windows * steps  # the schedule's length only; the rate does not change the cost
    model, optimizer, mesh, rows, init_s = _build(model_cfg, train_cfg, total_steps, name)
    memory["host_rss_peak_after_init_mib"] = peak_rss_mib()
    put = _batches(train_cfg, model_cfg.vocab_size, T, mesh, rows)
    batch = put(0)
    runner = StepRunner(model, optimizer)
    first = _first_step(runner, batch, step_key(seed, 0), xla_memory)
    step_times, out = _timed_windows(runner, put, lambda step: step_key(seed, step), warmup, windows, steps)
    losses, stats = jax.device_get(out)
    result: dict[str, Any] = {
        **_run_fields(name, model_cfg, train_cfg, model, steps, warmup, windows, init_s),
        **_timings(first["first_step_s"], step_times, k * train_cfg.microbatch_size * T),
        "loss_last": float(np.mean(losses)),
        "grad_norm_last": float(stats["grad_norm"]),
        "flops_per_token": train_flops_per_token(model_cfg, T),
        "flops_convention": FLOPS_CONVENTION,
        **_resource_fields(memory, first, load_before),
    }
    runner.sync()
    _after_run(result, model, optimizer, batch, steps, breakdown, matmul_size)
    log(_train_report(result))
    return result


def _run_fields(
    name: str,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    model: Any,
    steps: int,
    warmup: int,
    windows: int,
    init_s: float,
) -> dict[str, Any]:
    """What was run, before any figure: the environment, the model as model.json has it, the batch
    and recipe, and the timing plan."""
    from jaxgpt.model.gpt import count_params

    B, T, k = train_cfg.microbatch_size, train_cfg.seq_len(model_cfg), train_cfg.gradient_accumulation_steps
    return {
        **_environment(name),
        **to_dict(model_cfg),
        "compute_dtype": model.ops.compute_dtype,  # model.json's keys; dtype as run ("auto" resolved)
        "microbatch_size": B,
        "seq_len": T,
        "accumulation_steps": k,
        "tokens_per_step": k * B * T,
        "packing": train_cfg.packing,
        "optimizer": train_cfg.optimizer,
        "schedule": train_cfg.schedule,
        "params": int(count_params(model)),
        "compute_dtype_requested": model_cfg.compute_dtype,
        "steps_per_window": steps,
        "warmup_steps": warmup,
        "windows": windows,
        "init_s": init_s,
    }


def _resource_fields(memory: dict[str, float], first: dict[str, Any], load_before: tuple[float, ...]) -> dict[str, Any]:
    """Host and device memory through the run, XLA's own accounting, the machine's load before and
    after: read once the timed windows are done, so the peaks are the run's."""
    import os

    return {
        **memory,
        "host_rss_peak_after_first_step_mib": first["host_rss_peak_after_first_step_mib"],
        "host_rss_peak_mib": peak_rss_mib(),
        "device_memory": device_memory_stats(),
        "xla_memory": first["xla_memory"],
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
    }


def _after_run(
    result: dict[str, Any],
    model: Any,
    optimizer: Any,
    batch: tuple[Any, ...],
    steps: int,
    breakdown: bool,
    matmul_size: int | None,
) -> None:
    """The figures asked for beyond the run, measured after it (so they neither disturb its timing
    nor its peak RSS) and added to result: the step's breakdown, MFU against measured peaks."""
    if breakdown:
        step_s_per_microbatch = result["step_s_median"] / result["accumulation_steps"]
        result["breakdown"] = _step_breakdown(model, optimizer, batch[0][0], batch[1][0], steps, step_s_per_microbatch)
    if matmul_size:
        result.update(
            _mfu(result["tokens_per_s_median"] * result["flops_per_token"], matmul_size, result["compute_dtype"])
        )


def _step_breakdown(
    model: Any, optimizer: Any, x: Any, y: Any, steps: int, step_s_per_microbatch: float
) -> dict[str, Any]:
    """_breakdown on the first microbatch, beside the whole train step's time per microbatch."""
    from jaxgpt.model.loss import loss_fn

    return _breakdown(model, optimizer, x, y, steps, loss_fn) | {
        "train_step_ms_per_microbatch": 1e3 * step_s_per_microbatch
    }


def _checked(train_cfg: TrainConfig, steps: int, windows: int, warmup: int, accumulation: int | None) -> TrainConfig:
    """The timing arguments checked, and train_cfg with `accumulation` as its k if given."""
    import dataclasses

    if steps < 1 or windows < 1 or warmup < 0:
        raise BenchError(f"need --steps >= 1, --windows >= 1, --warmup >= 0 (got {steps}, {windows}, {warmup})")
    if accumulation is None:
        return train_cfg
    return dataclasses.replace(train_cfg, gradient_accumulation_steps=accumulation, batch_size=None)


def _timings(first_step_s: float, step_times: list[float], tokens_per_step: int) -> dict[str, Any]:
    rates = [tokens_per_step / t for t in step_times]
    return {
        "first_step_s": first_step_s,  # trace + compile + one step, to its result
        "compile_s": max(first_step_s - float(np.median(step_times)), 0.0),  # less a steady step
        "step_s_median": float(np.median(step_times)),
        **_spread(rates),
        "window_tokens_per_s": rates,
    }


def _environment(name: str) -> dict[str, Any]:
    """What ran the benchmark: the device, the chip's bf16 peak where known, package versions."""
    import os

    import jax

    device = jax.devices()[0]
    chip = chip_peak_flops(device.device_kind) if device.platform != "cpu" else None
    return {
        "config": name,
        "device": str(device),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "versions": versions(),
        "cpu_count": os.cpu_count(),
        "chip_peak_bf16_flops": chip[0] if chip else None,
        "chip_peak_source": chip[1] if chip else None,
    }


def _batches(train_cfg: TrainConfig, vocab_size: int, T: int, mesh: Any, rows: Any) -> Callable[[int], tuple[Any, ...]]:
    """put(step) -> (inputs, targets) on the device: two random (k, B, T) batches taken in turn; for
    packing "conversations" (fine-tuning) also loss weights and segments: each row two conversations
    and padding, about half the targets trained on, so the step runs the fine-tuning program."""
    from jaxgpt.distributed import sharding

    B, k = train_cfg.microbatch_size, train_cfg.gradient_accumulation_steps
    rng = np.random.default_rng(train_cfg.seed)
    host = [list(rng.integers(0, vocab_size, (2, k, B, T), dtype=np.int32)) for _ in range(2)]  # (inputs, targets)
    if train_cfg.packing == "conversations":
        segments = np.zeros((k, B, T), np.int32)
        segments[..., : T * 9 // 10] = 1 + (np.arange(T * 9 // 10) >= T * 4 // 10)  # 2 conversations, 10% padding
        for arrays in host:
            arrays += [(rng.random((k, B, T)) < 0.5).astype(np.float32) * (segments > 0), segments]

    def put(step: int) -> tuple[Any, ...]:
        return tuple(sharding.put_batch(a[:, rows], mesh, B) for a in host[step % len(host)])

    return put


def _first_step(runner: Any, batch: tuple[Any, ...], key: Any, xla_memory: bool) -> dict[str, Any]:
    """The first call timed to its result (trace + compile + one step), the peak RSS after it
    (compiling is most of it on CPU: LLVM, not the step's buffers), and XLA's own accounting of
    the step's buffers if asked (compiled again, after the timed call, which it would warm)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(runner(Batch(*batch), key))
    first_step_s = time.perf_counter() - t0
    out = {"first_step_s": first_step_s, "host_rss_peak_after_first_step_mib": peak_rss_mib(), "xla_memory": None}
    if xla_memory:
        t0 = time.perf_counter()
        compiled = runner.lower(Batch(*batch), key).compile()
        out["xla_memory"] = {"lower_compile_s": time.perf_counter() - t0, **_memory_analysis(compiled)}
    return out


def _build(
    model_cfg: ModelConfig, train_cfg: TrainConfig, total_steps: int, name: str
) -> tuple[Any, Any, Any, Any, float]:
    """Model and optimiser built and placed as jaxgpt/training/loop.py does; (model, optimizer, mesh, this
    process's batch rows, seconds to initialise)."""
    import jax
    from flax import nnx

    from jaxgpt import ops
    from jaxgpt.distributed import sharding
    from jaxgpt.model.gpt import build_model
    from jaxgpt.training.optimizer import make_optimizer

    try:  # model.json's choices this backend cannot run (cuDNN without a GPU), before anything is built
        ops.select(model_cfg)
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}" if name else str(e)) from None
    B = train_cfg.microbatch_size
    mesh = sharding.make_mesh(train_cfg.mesh, B)

    def build() -> tuple[Any, Any]:
        model = build_model(model_cfg, seed=train_cfg.seed)
        return model, make_optimizer(model, train_cfg, total_steps)

    t0 = time.perf_counter()
    model, optimizer = sharding.create_sharded(build, mesh, train_cfg.mesh.fsdp, where=f"{name}: model.json")
    jax.block_until_ready(nnx.state((model, optimizer)))
    return model, optimizer, mesh, sharding.local_rows(mesh, B), time.perf_counter() - t0


def _timed_windows(
    runner: Callable[..., Any],
    put: Callable[[int], tuple[Any, ...]],
    key: Callable[[int], Any],
    warmup: int,
    windows: int,
    steps: int,
) -> tuple[list[float], Any]:
    """Seconds per step of each of `windows` timed windows of `steps` steps, after `warmup`
    untimed ones (steps 1, 2, ...: step 0 was the compiling call), each window ending with a block
    on its last step's results; and those results."""
    import jax

    step, batch, out = 1, put(1), None

    def run_steps(n: int) -> Any:
        nonlocal step, batch, out
        for _ in range(n):
            out = runner(Batch(*batch), key(step))
            step += 1
            batch = put(step)  # the next batch goes to the device while this step runs
        return jax.block_until_ready(out)

    run_steps(warmup)
    step_times = []
    for _ in range(windows):
        t0 = time.perf_counter()
        run_steps(steps)
        step_times.append((time.perf_counter() - t0) / steps)
    return step_times, out


def _memory_analysis(compiled: Any) -> dict[str, int]:
    """XLA's buffer accounting of a compiled step (what the backend reports of it)."""
    analysis = compiled.memory_analysis()
    keys = (
        "temp_size_in_bytes",
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    return {key: int(getattr(analysis, key)) for key in keys if analysis is not None and hasattr(analysis, key)}


def _mfu(achieved: float, size: int, compute_dtype: str) -> dict[str, Any]:
    """Peak matmul rates measured now (fp32, bf16) and the achieved FLOP/s as a share of each."""
    fp32 = matmul_flops(size, repeats=10, dtype="float32")
    bf16 = matmul_flops(size, repeats=10, dtype="bfloat16")
    return {
        "matmul_size": size,
        "peak_fp32_flops": fp32,
        "peak_bf16_flops": bf16,
        "achieved_flops": achieved,
        "mfu_fp32": achieved / fp32,
        "mfu_bf16": achieved / bf16,
        # against the peak of the dtype the matmuls run in (model.json compute_dtype)
        "mfu": achieved / (bf16 if compute_dtype == "bfloat16" else fp32),
    }


def _breakdown(
    model: Any, optimizer: Any, x: Any, y: Any, repeats: int, loss_fn: Callable[..., Any]
) -> dict[str, float]:
    """Median ms of one (B, T) microbatch's forward, forward + backward, and the optimiser update
    alone (optimizer.update on fixed gradients, MultiSteps and all), each its own jax.jit call on
    the split state, as StepRunner calls the step (nnx.jit would add its per-call graph walk:
    ~10 ms of Python for the optimiser's hundreds of Variables, which is not the update's cost)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split((model, optimizer))
    model_def, model_state = nnx.split(model)

    def loss_of(s: Any, a: Any, b: Any) -> Any:
        return loss_fn(nnx.merge(model_def, s), a, b)

    fwd = jax.jit(loss_of)
    fwd_bwd = jax.jit(jax.value_and_grad(loss_of))

    @jax.jit
    def update(s: Any, grads: Any) -> Any:
        m, opt = nnx.merge(graphdef, s)
        opt.update(m, grads)
        return nnx.state((m, opt))

    grads = nnx.state(nnx.merge(model_def, fwd_bwd(model_state, x, y)[1]), nnx.Param)

    def median_ms(fn: Callable[[], Any]) -> float:
        jax.block_until_ready(fn())  # compile
        times = []
        for _ in range(max(repeats, 3)):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(times))

    return {
        "forward_ms": median_ms(lambda: fwd(model_state, x, y)),
        "forward_backward_ms": median_ms(lambda: fwd_bwd(model_state, x, y)),
        "optimizer_update_ms": median_ms(lambda: update(state, grads)),
    }


def _train_report(r: dict[str, Any]) -> str:
    mib = 2**20
    lines = [
        f"train step {r['config']} on {r['device']} ({r['cpu_count']} CPUs, jax {r['jax']}): "
        f"V={r['vocab_size']} T={r['seq_len']} L={r['n_layers']} H={r['n_heads']} C={r['emb_dim']}, "
        f"k={r['accumulation_steps']} x B={r['microbatch_size']} x T={r['seq_len']} = {r['tokens_per_step']:,} "
        f"tokens/step, {r['params'] / 1e6:.2f}M params",
        f"  {'first train_step, to its result':34} {r['first_step_s']:10.2f} s   "
        f"(compile ~{r['compile_s']:.2f} s + one step; steady step {r['step_s_median'] * 1e3:.1f} ms; "
        f"model + optimiser init {r['init_s']:.2f} s)",
        f"  {'tokens/s, median':34} {r['tokens_per_s_median']:10,.0f}     (min {r['tokens_per_s_min']:,.0f}, "
        f"IQR {r['tokens_per_s_q25']:,.0f}-{r['tokens_per_s_q75']:,.0f}, max {r['tokens_per_s_max']:,.0f}; "
        f"{r['windows']} windows x {r['steps_per_window']} steps after {1 + r['warmup_steps']} untimed)",
        f"  {'model FLOPs/token':34} {r['flops_per_token'] / 1e6:10,.2f} M   (6 x (12LC^2 + VC) + 12LTC)",
    ]
    if "mfu_fp32" in r:
        lines += [
            f"  {'peak matmul, measured':34} {r['peak_fp32_flops'] / 1e9:10,.0f} GFLOP/s fp32, "
            f"{r['peak_bf16_flops'] / 1e9:,.0f} GFLOP/s bf16 ({r['matmul_size']}^3)",
            f"  {'MFU (vs ' + r['compute_dtype'] + ' peak)':34} {100 * r['mfu']:10.1f} %   "
            f"({r['achieved_flops'] / 1e9:,.1f} GFLOP/s; vs fp32 peak {100 * r['mfu_fp32']:.1f} %, "
            f"vs bf16 peak {100 * r['mfu_bf16']:.1f} %)",
        ]
    lines.append(
        f"  {'host peak RSS':34} {r['host_rss_peak_mib']:10,.0f} MiB (peak before the model "
        f"{r['host_rss_peak_before_model_mib']:,.0f}, after init {r['host_rss_peak_after_init_mib']:,.0f}, "
        f"after the first step {r['host_rss_peak_after_first_step_mib']:,.0f} MiB)"
    )
    if r["device_memory"]:
        dm = r["device_memory"]
        lines.append(
            f"  {'device memory peak':34} {dm.get('peak_bytes_in_use', 0) / mib:10,.0f} MiB "
            f"(in use {dm.get('bytes_in_use', 0) / mib:,.0f} MiB of {dm.get('bytes_limit', 0) / mib:,.0f})"
        )
    if r["xla_memory"]:
        xm = r["xla_memory"]
        lines.append(
            f"  {'XLA temp / arguments':34} {xm.get('temp_size_in_bytes', 0) / mib:10,.1f} MiB / "
            f"{xm.get('argument_size_in_bytes', 0) / mib:,.1f} MiB"
        )
    if "breakdown" in r:
        b = r["breakdown"]
        lines.append(
            f"  {'per microbatch':34} forward {b['forward_ms']:.1f} ms, forward+backward "
            f"{b['forward_backward_ms']:.1f} ms, optimiser update {b['optimizer_update_ms']:.1f} ms, "
            f"whole train_step {b['train_step_ms_per_microbatch']:.1f} ms"
        )
    lines.append(
        f"  {'loss (random tokens)':34} {r['loss_last']:10.3f}     (ln V = {math.log(r['vocab_size']):.3f}); "
        f"load average {r['load_avg_before'][0]:.2f} -> {r['load_avg_after'][0]:.2f}"
    )
    return "\n".join(lines)


def accum_sweep(
    source: list[str],
    ks: list[int],
    *,
    steps: int = 1,
    warmup: int = 1,
    windows: int = 2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`bench train ... --accum k` for each k, each in a fresh process so its peak RSS is its own."""
    rows = []
    log(
        f"accumulation sweep, {' '.join(source)}: one fresh process per k ({windows} x {steps} steps after "
        f"{1 + warmup} untimed)"
    )
    log(
        f"  {'k':>4} {'tokens/step':>12} {'first step s':>12} {'compile s':>10} {'tokens/s':>10} "
        f"{'host peak RSS MiB':>18} {'XLA temp MiB':>13} {'device peak MiB':>16} {'load':>5}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        for k in ks:
            r = _sweep_run(source, k, steps, warmup, windows, Path(tmp) / f"k{k}.json")
            row = _sweep_row(k, r)
            rows.append(row)
            log(
                f"  {k:>4} {row['tokens_per_step']:>12,} {row['first_step_s']:>12.2f} {row['compile_s']:>10.2f} "
                f"{row['tokens_per_s_median']:>10,.0f} {row['host_rss_peak_mib']:>18,.0f} "
                f"{row['xla_temp_mib'] if row['xla_temp_mib'] is not None else float('nan'):>13.1f} "
                f"{row['device_peak_mib'] if row['device_peak_mib'] is not None else float('nan'):>16.0f} "
                f"{row['load_avg'][0]:>5.2f}"
            )
    return {"source": source, "accum_sweep": rows}


def _sweep_run(source: list[str], k: int, steps: int, warmup: int, windows: int, out: Path) -> dict[str, Any]:
    """One k of the sweep: `bench train --accum k` in a fresh process (its peak RSS its own), its --json read back."""
    import os
    import subprocess

    cmd = [sys.executable, "-m", "bench", "train", *source, "--accum", str(k), "--steps", str(steps)]
    cmd += ["--warmup", str(warmup), "--windows", str(windows), "--no-matmul", "--xla-memory", "--json", str(out)]
    root = Path(__file__).resolve().parent.parent  # the repository, where `-m bench` is found
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root, env=os.environ.copy())
    if done.returncode != 0:
        raise BenchError(f"k={k}: {' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return json.loads(out.read_text())


def _sweep_row(k: int, r: dict[str, Any]) -> dict[str, Any]:
    """The sweep's row of one k: time, speed and memory (MiB) from that run's figures."""
    xm, dm = r.get("xla_memory") or {}, r.get("device_memory") or {}
    return {
        "k": k,
        "tokens_per_step": r["tokens_per_step"],
        "first_step_s": r["first_step_s"],
        "compile_s": r["compile_s"],
        "tokens_per_s_median": r["tokens_per_s_median"],
        "host_rss_peak_mib": r["host_rss_peak_mib"],
        "host_rss_peak_before_model_mib": r["host_rss_peak_before_model_mib"],
        "xla_temp_mib": xm.get("temp_size_in_bytes", 0) / 2**20 if xm else None,
        "xla_argument_mib": xm.get("argument_size_in_bytes", 0) / 2**20 if xm else None,
        "device_peak_mib": dm["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in dm else None,
        "load_avg": r["load_avg_before"],
    }
