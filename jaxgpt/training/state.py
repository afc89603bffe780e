"""What a training session builds once: the device mesh, the model and optimiser on it (fresh, restored
from the checkpoint it resumes from, or started from init_from's weights), the compiled step, and
the figures MFU needs. loop.py trains it; checkpoint_meta says what a checkpoint records of it.

    state, resumed_meta = build_state(run, log)
    losses, stats = state.step(Batch(inputs, targets), step_key(seed, s))     # StepRunner: train_step.py
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np

from jaxgpt import ops
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training import memory, mfu, muon
from jaxgpt.training.optimizer import clip_flag, make_optimizer, make_schedule, part_rates, peak_rates
from jaxgpt.training.train_step import PolicyLoss, StepRunner, lower_step

if TYPE_CHECKING:
    from jaxgpt.training.progress import Progress, Window
    from jaxgpt.training.run import Run


@dataclass
class TrainState:
    plan: memory.Plan  # how the step fits the device (memory.py): remat, loss chunks, microbatches
    model: Any
    optimizer: Any
    step: StepRunner  # the one step program; model/optimizer are stale until step.sync()
    mesh: Any
    rows: slice  # this process's rows of every microbatch
    schedule: Callable[[int], Any]
    compute_dtype: str  # model.json's "auto" resolved on this backend
    optimizer_name: str  # train.json "optimizer"
    routing: dict[str, Any] | None  # optimizer "muon": which parameters each part trains
    flops_per_token: float
    peak_flops: float
    peak_source: str

    def mfu(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation at this throughput (mfu.py: FLOPs per token and the peak)."""
        return mfu.mfu(tokens_per_s, self.flops_per_token, self.peak_flops)

    def observe(self, tokens_per_s: float) -> None:
        """A rate over a window of steps: above a measured peak, it becomes the peak (mfu.raise_peak)."""
        if tokens_per_s * self.flops_per_token > self.peak_flops:
            raised = mfu.raise_peak(self.compute_dtype, tokens_per_s * self.flops_per_token)
            if raised is not None:
                self.peak_flops, self.peak_source = raised


def _compute_dtype(run: Run, log: Callable[[str], None]) -> str:
    """model.json's choices on this backend (the one check that needs JAX: which devices there are)."""
    try:
        dtype = ops.select(run.model_cfg).compute_dtype
    except ConfigError as e:
        raise ConfigError(f"{run.run_dir}/{e}") from None
    if run.model_cfg.compute_dtype == "auto":
        log(f"compute_dtype auto -> {dtype} on {jax.default_backend()}")
    return dtype


def lower_plan(run: Run, mesh: Any, steps: int, policy: PolicyLoss | None, plan: memory.Plan, sample: Batch) -> Any:
    """The run's train step on a device of `mesh` under `plan`, lowered from shapes (no array is made;
    `sample`: a step's batch, its fields, dtypes and lengths)."""
    batch = sample.map(
        lambda a: jax.ShapeDtypeStruct(
            memory.split_rows(a, plan.split).shape, a.dtype, sharding=sharding.batch_sharding(mesh, a.ndim)
        )
    )
    return lower_step(plan.model_cfg(run.model_cfg), plan.train_cfg(run.train_cfg), steps, mesh, batch, policy)


def compiled_figure(lowered: Any) -> int | None:
    """What a lowered step needs on its device, from XLA's compiled program; None, or the figure of
    its refusal, where the compiler refused it for want of memory (a TPU's compiler says so)."""
    try:
        return memory.compiled_bytes(lowered.compile())
    except Exception as e:  # XLA's refusal for want of memory; others raise
        if not memory.is_out_of_memory(e):
            raise
        return memory.refused_bytes(str(e))


def step_bytes(
    run: Run, mesh: Any, steps: int, policy: PolicyLoss | None, plan: memory.Plan, sample: Batch
) -> int | None:
    """What the run's train step needs on a device of `mesh` under `plan` (compiled_figure)."""
    return compiled_figure(lower_plan(run, mesh, steps, policy, plan, sample))


PLAN_THREADS = 4  # compiles at once: each holds a step's program in host memory while XLA works on it


def plan_figures(
    run: Run, mesh: Any, steps: int, policy: PolicyLoss | None, plans: list[memory.Plan], sample: Batch
) -> Callable[[memory.Plan], int | None]:
    """step_bytes for each of `plans`, asked in order (memory.choose): the first alone, as it usually
    fits; on the first question about a later one, all the later ones lowered here and compiled at
    once in threads (XLA compiles without Python's lock). One after another, the 2026 recipe's five
    plans took about 40 s each on a TPU v5e's host."""
    later: dict[memory.Plan, concurrent.futures.Future[int | None]] = {}

    def figure(plan: memory.Plan) -> int | None:
        if plan == plans[0]:
            return step_bytes(run, mesh, steps, policy, plan, sample)
        if not later:
            lowered = {p: lower_plan(run, mesh, steps, policy, p, sample) for p in plans[1:]}
            pool = concurrent.futures.ThreadPoolExecutor(min(PLAN_THREADS, len(lowered)))
            later.update({p: pool.submit(compiled_figure, low) for p, low in lowered.items()})
            pool.shutdown(wait=False)  # threads end with their compiles: a plan that fits waits for no later one
        return later[plan].result()

    return figure


def memory_limit(run: Run) -> int | None:
    """Bytes of one device's memory the run may fill: train.json device_memory_gib, else what the device
    reports (None: a CPU)."""
    gib = run.train_cfg.device_memory_gib
    return sharding.device_memory() if gib is None else int(gib * memory.GIB)


def _memory_plan(
    run: Run,
    mesh: Any,
    steps: int,
    policy: PolicyLoss | None,
    log: Callable[[str], None],
    max_split: int | None,
    reserve: int,
    sample: Batch | None,
) -> memory.Plan:
    """The run as configured, or on a device whose memory is known (train.json memory_plan "auto")
    the first plan whose compiled step fits it, less `reserve` bytes (memory.py), said in one line."""
    cfg, mcfg = run.train_cfg, run.model_cfg
    configured = memory.Plan(mcfg.remat, mcfg.loss_chunk)
    limit = memory_limit(run)
    if cfg.memory_plan == "off" or limit is None:
        return configured
    limit -= reserve
    if sample is None:
        sample = run.train_batches.batch(0, cfg.gradient_accumulation_steps)
    policies = memory.TPU_POLICIES if jax.default_backend() == "tpu" else memory.POLICIES
    plans = memory.candidates(mcfg, cfg, mesh.shape[sharding.DATA], max_split, policies)
    plan, needed = memory.choose(
        plans,
        plan_figures(run, mesh, steps, policy, plans, sample),
        limit,
        f"{run.run_dir}/train.json",
        lambda p: p.describe(cfg),
    )
    changed = "as configured" if plan == configured else f"configured: {configured.describe(cfg)}"
    log(f"memory plan: {plan.describe(cfg)}; the step needs {memory.size(needed)} of {memory.size(limit)} ({changed})")
    return plan


def build_state(
    run: Run,
    log: Callable[[str], None],
    *,
    optimizer_steps: int | None = None,
    policy: PolicyLoss | None = None,
    max_split: int | None = None,
    reserve: int = 0,
    sample: Batch | None = None,
) -> tuple[TrainState, dict[str, Any]]:
    """The session's state, and the meta.json of the checkpoint it resumed from ({}: a new run).
    optimizer_steps: the schedule's length (default run.total_steps); policy: RL's loss terms;
    max_split: the most smaller microbatches the memory plan may run a configured one as; reserve:
    device bytes the step must leave free (RL's sampling engine); sample: a step's (k, B, T) batch as
    the step takes it, for the plan (default: the run's first)."""
    cfg, mcfg = run.train_cfg, run.model_cfg
    steps = optimizer_steps or run.total_steps
    compute_dtype = _compute_dtype(run, log)
    try:
        mesh = sharding.make_mesh(cfg.mesh, cfg.microbatch_size)
    except ConfigError as e:  # "train.json: ...": which run's
        raise ConfigError(f"{run.run_dir}/{e}") from None

    # On one accelerator the host builds the parameters while the plan compiles (they do not depend on it).
    host = sharding.start_host_build(lambda: build_model(mcfg, seed=cfg.seed))
    plan = _memory_plan(run, mesh, steps, policy, log, max_split, reserve, sample)
    run_mcfg, run_cfg = plan.model_cfg(mcfg), plan.train_cfg(cfg)  # what the step computes with

    build, then = lambda: build_model(run_mcfg, seed=cfg.seed), lambda m: make_optimizer(m, run_cfg, steps)
    model, optimizer = sharding.create_sharded(build, mesh, cfg.mesh.fsdp, f"{run.run_dir}/model.json", then, host)
    routing = None
    if cfg.optimizer == "muon":
        routing = muon.routing_table(model, muon.routes(model))
        log(muon.format_table(routing, peak_rates(cfg)))
    meta: dict[str, Any] = {}
    if run.resume_from is not None:
        meta = ckpt.load_checkpoint(run.resume_from, model, optimizer)
        log(f"Resuming {run.run_dir} from {run.resume_from.name} (step {meta['step']})")
    elif run.init_from is not None:  # fine-tuning: these weights, step 0, fresh optimiser
        ckpt.load_weights(model, run.init_from / ckpt.WEIGHTS)
        log(f"Initialised {run.run_dir} from {run.init_from} (step 0, fresh optimizer)")
    peak, source = mfu.peak_flops(compute_dtype)  # the dtype as run
    state = TrainState(
        plan,
        model,
        optimizer,
        StepRunner(model, optimizer, policy),
        mesh,
        sharding.local_rows(mesh, cfg.microbatch_size),
        make_schedule(cfg, steps),
        compute_dtype,
        cfg.optimizer,
        routing,
        mfu.flops_per_token(mcfg, cfg.seq_len(mcfg)),
        peak,
        source,
    )
    return state, meta


@dataclass(frozen=True)
class Position:
    """Where the data and the random numbers stand after a step: what an exact resume continues from."""

    seed: int
    accumulation: int  # microbatches per optimiser step
    microbatch_size: int
    dataset: str
    fingerprint: str | None
    epoch_of: Callable[[int, int], int]  # the sampler's: (step, accumulation) -> epoch

    def at(self, done: int) -> dict[str, Any]:
        k = self.accumulation
        return {
            "data_position": {
                "next_step": done,
                "microbatches_consumed": done * k,
                "sequences_consumed": done * k * self.microbatch_size,
                "epoch": self.epoch_of(done, k),
                "dataset": self.dataset,
                "fingerprint": self.fingerprint,
            },
            # Dropout keys are fold_in(key(seed), step): the seed and the step are the whole RNG state.
            "rng": {"seed": self.seed, "next_step": done, "scheme": "fold_in(key(seed), step)"},
        }


def checkpoint_meta(
    state: TrainState, progress: Progress, position: Position, done: int, stats: dict[str, Any], measured: dict
) -> dict[str, Any]:
    """meta.json: what a resume and a reader of this one checkpoint need, built here and nowhere else
    (after progress.closing: the validation it records); every step's figures are the record's
    (metrics.jsonl), not repeated here. `measured`: the benchmarks' entries since the last checkpoint."""
    window = progress.window
    micro, rate, tokens = (
        np.asarray(window.micro_losses),
        window.tokens_per_s(progress.tokens_per_step),
        done * progress.tokens_per_step,
    )
    return {
        "format": 2,
        "step": done,
        "total_steps": progress.limits.total_steps,
        "tokens_seen": tokens,
        "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "train_loss": {
            "min": float(micro.min()),
            "max": float(micro.max()),
            "mean": float(micro.mean()),
            "last": window.losses[-1],
        },
        "val_loss": progress.val,
        "val_tokens": progress.val_tokens,  # the target tokens that loss is the mean over
        "hellaswag": [],
        "core": [],
        **measured,  # since the last checkpoint: [{"step", "acc", ...}]
        "best_loss": progress.best,
        "is_best": progress.is_best,
        **_optimiser(state, progress, stats),
        "throughput_tokens_per_s": rate,
        "mfu": state.mfu(rate),
        "flops_per_token": state.flops_per_token,  # mfu.flops_per_token
        "peak_flops": state.peak_flops,
        "peak_flops_source": state.peak_source,
        "elapsed_s": progress.elapsed,
        "training_s": progress.training_seconds(),  # progress.Target's docstring says what is counted
        "target": None
        if progress.target is None
        else progress.target.record(done, tokens, progress.training_seconds()),
        "mesh": dict(state.mesh.shape) | {"processes": jax.process_count()},
        "compute_dtype": state.compute_dtype,  # the matmuls' dtype, model.json's "auto" resolved
        "memory_plan": dataclasses.asdict(state.plan),  # how the step ran (memory.py); the configs say what it computes
        **position.at(done),
    }


def _optimiser(state: TrainState, progress: Progress, stats: dict[str, Any]) -> dict[str, Any]:
    """The optimiser's side: rates, gradient norms, clipping, skipped updates, applied steps."""
    window, clip = progress.window, progress.limits.clip_max_norm
    return {
        "learning_rate": float(stats["learning_rate"]),  # used by the last applied step (muon: the matrices')
        "learning_rates": part_rates(stats),  # each part's, by name (adamw: one)
        "optimizer": state.optimizer_name,
        "routing": state.routing,
        # The schedule counts applied optimiser steps: a dropped step does not advance it.
        "next_learning_rate": float(state.schedule(int(stats["gradient_step"]))),
        "grad_norm": window.grad_norms[-1],  # pre-clip norm of the last accumulated gradient
        "clip_max_norm": clip,
        "clipped_steps": sum(clip_flag(g, clip) for g in window.grad_norms),
        **_skipped(stats, window, progress),
        "optimizer_steps_applied": int(stats["gradient_step"]),
    }


def _skipped(stats: dict[str, Any], window: Window, progress: Progress) -> dict[str, Any]:
    return {
        "skipped_updates": {
            "consecutive": int(stats["notfinite_count"]),  # microbatches
            "total": int(stats["total_notfinite"]),  # microbatches, whole run
            "dropped_steps": window.dropped_steps,  # since the last checkpoint
            "dropped_steps_total": progress.dropped_total,
        }
    }
