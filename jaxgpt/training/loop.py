"""The training loop: fetch data, step, log, validate, checkpoint. Nothing else.

train.py validates the run (run.py) and hands a `Run` to `Trainer`; the compiled step lives in
train_step.py, the optimiser in optimizer.py, placement on the device mesh in
jaxgpt/distributed/sharding.py, checkpoints in jaxgpt/checkpoints/store.py, the run's records in
jaxgpt/tracking/.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from tqdm import tqdm

from jaxgpt import ops
from jaxgpt.data.chat_template import TEMPLATE_FILE
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, to_dict
from jaxgpt.data.batches import WholeSplit
from jaxgpt.data.chat_rows import ConversationRows
from jaxgpt.distributed import sharding
from jaxgpt.distributed.peers import StopVotes
from jaxgpt.evaluation.scoring import eval_sums
from jaxgpt.model.gpt import build_model
from jaxgpt.tracking import charts
from jaxgpt.tracking.metrics import RunLog
from jaxgpt.training import mfu, muon
from jaxgpt.training.optimizer import clip_flag, make_optimizer, make_schedule, part_rates, peak_rates
from jaxgpt.training.run import TrainingError
from jaxgpt.training.train_step import StepRunner, step_key

CHARTS_PACE = 19  # charts are redrawn at most once per 19x their drawing time (Trainer.checkpoint)

if TYPE_CHECKING:
    from jaxgpt.stopping import StopFlag
    from jaxgpt.training.run import Run


def step_loss(losses: np.ndarray, stats: dict[str, Any]) -> float:
    """The step's training loss: the mean over its microbatches, or (a loss mask: fine-tuning) over
    every token it trained on, which the step computes (train_step.py)."""
    return float(stats["loss"]) if "loss" in stats else float(np.mean(losses))


@dataclass
class Window:
    """Per-step statistics since the last checkpoint: what meta.json sums up (the record has each step)."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # mean over the step's microbatches
    micro_losses: list[float] = field(default_factory=list)
    grad_norms: list[float | None] = field(default_factory=list)  # None: dropped, or not finite
    dropped: list[bool] = field(default_factory=list)  # the step applied no update
    step_times: list[float] = field(default_factory=list)  # seconds, previous result to this one
    started: float = field(default_factory=time.perf_counter)

    def record(self, done: int, losses: np.ndarray, stats: dict[str, Any], step_time: float) -> None:
        self.steps.append(done)
        self.step_times.append(step_time)
        self.losses.append(step_loss(losses, stats))
        self.micro_losses.extend(float(v) for v in losses)
        dropped = bool(stats["skipped_step"])
        gn = float(stats["grad_norm"])  # a dropped step computed none: the recorder holds an older one
        self.grad_norms.append(gn if np.isfinite(gn) and not dropped else None)
        self.dropped.append(dropped)

    @property
    def dropped_steps(self) -> int:
        """Steps skipped whole because a microbatch gradient was not finite."""
        return sum(self.dropped)

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return len(self.steps) * tokens_per_step / max(time.perf_counter() - self.started, 1e-9)


@dataclass
class Target:
    """train.json target_val_loss: the run stops at the first validation at or below it.

    Training seconds (`seconds` below, meta.json training_s) are the sum of every step's
    perf/step_time_s over every session: from the previous step's result (or the end of the
    validation or checkpoint before it) to this step's result, so the data, the host's work and
    each session's first compile are in; validation, HellaSwag, checkpoint writing and charts are not.
    """

    value: float
    best: float | None = None  # lowest validation loss so far, at every validation (not only checkpoints)
    reached: dict[str, Any] | None = None  # {"step", "tokens", "training_seconds"} where it was reached

    def check(self, val: float, step: int, tokens: int, seconds: float) -> bool:
        """Whether this validation reaches the target (for the first time)."""
        self.best = val if self.best is None else min(self.best, val)
        if self.reached is not None or not val <= self.value:
            return False
        self.reached = {"step": step, "tokens": tokens, "training_seconds": seconds}
        return True

    def record(self, step: int, tokens: int, seconds: float) -> dict[str, Any]:
        """meta.json "target": where it was reached, or (not reached) how far the run got."""
        where = self.reached or {"step": step, "tokens": tokens, "training_seconds": seconds}
        return {"value": self.value, "reached": self.reached is not None, **where, "best_loss": self.best}

    def line(self, step: int, tokens: int, seconds: float) -> str:
        r = self.record(step, tokens, seconds)
        if r["reached"]:
            return (f"Target validation loss {self.value:g} reached at step {r['step']}: {r['step']:,} steps, "
                    f"{r['tokens']:,} tokens, {r['training_seconds']:,.3f} training seconds")
        best = "n/a" if self.best is None else f"{self.best:.4f}"
        return f"Target validation loss {self.value:g} not reached in {step:,} steps (best {best})"


class Trainer:
    def __init__(self, run: Run, stop: StopFlag, profile: tuple[int, int] | None = None) -> None:
        self.run, self.cfg, self.mcfg, self.stop = run, run.train_cfg, run.model_cfg, stop
        self.k = self.cfg.gradient_accumulation_steps
        self.tokens_per_step = self.cfg.tokens_per_step(self.mcfg)
        self.is_main = jax.process_index() == 0
        self.mesh = sharding.make_mesh(self.cfg.mesh, self.cfg.microbatch_size)
        self.stops = StopVotes(stop, self.mesh)  # a signal may reach one process only: stop if any got one
        self.rows = sharding.local_rows(self.mesh, self.cfg.microbatch_size)
        self.schedule = make_schedule(self.cfg, run.total_steps)

        try:  # model.json's choices this backend cannot run, before anything is built
            self.compute_dtype = ops.select(self.mcfg).compute_dtype  # "auto" resolved, on this backend
        except ConfigError as e:
            raise ConfigError(f"{run.run_dir}/{e}") from None
        if run.hellaswag is not None and jax.process_count() > 1:  # its batches are one process's arrays
            raise ConfigError(f"{run.run_dir}/train.json: hellaswag_interval works in single-process runs only; "
                              f"score checkpoints with evaluate.py --hellaswag instead")
        if run.core is not None and jax.process_count() > 1:
            raise ConfigError(f"{run.run_dir}/train.json: core_interval works in single-process runs only; "
                              f"score checkpoints with evaluate.py --core instead")
        if self.mcfg.compute_dtype == "auto":
            self.log(f"compute_dtype auto -> {self.compute_dtype} on {jax.default_backend()}")

        def build() -> tuple[Any, Any]:
            model = build_model(self.mcfg, seed=self.cfg.seed)
            return model, make_optimizer(model, self.cfg, run.total_steps)

        self.model, self.optimizer = sharding.create_sharded(
            build, self.mesh, self.cfg.mesh.fsdp, where=f"{run.run_dir}/model.json")
        self.routing = None  # optimizer "muon": which parameters each part trains (muon.py)
        if self.cfg.optimizer == "muon":
            self.routing = muon.routing_table(self.model, muon.routes(self.model))
            self.log(muon.format_table(self.routing, peak_rates(self.cfg)))
        if self.cfg.packing in ("documents", "conversations"):
            self.log(run.train_batches.describe())
        self.start, self.best, self.elapsed, self.dropped_total = 0, None, 0.0, 0
        self.trained_s = 0.0  # training seconds (Target) up to the last checkpoint, every session
        self.resumed: dict[str, Any] = {}  # meta.json of the checkpoint this session resumed from
        self.dropped_streak = 0  # optimiser steps dropped in a row (non-finite gradients)
        self.val_tokens = 0  # tokens the last validation scored
        self.hellaswag_results: list[dict[str, Any]] = []  # since the last checkpoint (meta.json)
        self.core_results: list[dict[str, Any]] = []  # the same for CORE
        self.charts_due = 0.0  # perf_counter time after which a checkpoint redraws the charts
        if run.resume_from is not None:
            meta = ckpt.load_checkpoint(run.resume_from, self.model, self.optimizer)
            self.start, self.best, self.elapsed = meta["step"], meta.get("best_loss"), meta.get("elapsed_s", 0.0)
            self.dropped_total = meta.get("skipped_updates", {}).get("dropped_steps_total", 0)
            # Checkpoints from before training seconds were counted: their elapsed time (validation included).
            self.trained_s, self.resumed = meta.get("training_s", self.elapsed), meta
            self.log(f"Resuming {run.run_dir} from {run.resume_from.name} (step {self.start})")
        elif run.init_from is not None:  # fine-tuning: these weights, step 0, fresh optimiser
            ckpt.load_weights(self.model, run.init_from / ckpt.WEIGHTS)
            self.log(f"Initialised {run.run_dir} from {run.init_from} (step 0, fresh optimizer)")
        self.done = self.start
        self.step = StepRunner(self.model, self.optimizer)  # self.model/optimizer are stale until step.sync()
        self.flops_per_token = mfu.flops_per_token(self.mcfg, self.cfg.seq_len(self.mcfg))
        self.peak_flops, self.peak_source = mfu.peak_flops(self.compute_dtype)  # the dtype as run
        self.profile = Profile(run.run_dir, profile, self.start) if profile is not None else None
        self.target = None if self.cfg.target_val_loss is None else Target(
            self.cfg.target_val_loss, best=(self.resumed.get("target") or {}).get("best_loss", self.best))

    def log(self, text: str) -> None:
        if self.is_main:
            print(text, flush=True)

    def batch(self, step: int) -> tuple[jax.Array, ...]:
        """This process's rows of step `step`, assembled into global (k, B, T) arrays: inputs and
        targets, and for packed conversations their loss weights and segments."""
        arrays = self.run.train_batches.batch(step, self.k, rows=self.rows)
        return tuple(sharding.put_batch(a, self.mesh, self.cfg.microbatch_size) for a in arrays)

    def validate(self, done: int | None = None) -> float:
        """The mean loss over every validation token scored; how many there were: self.val_tokens.
        At step `done`, also HellaSwag and CORE when train.json hellaswag_interval / core_interval ask."""
        self.step.sync()
        if done is not None:
            self.hellaswag(done)
            self.core(done)
        val, B = self.run.val_batches, self.cfg.microbatch_size
        whole = isinstance(val, WholeSplit)  # validation_batches "all"
        chat = isinstance(val, ConversationRows)  # answers only, counted once (the same rows each time)
        n = val.n_batches if whole or (chat and self.cfg.validation_batches == "all") else self.cfg.validation_batches
        n = min(n, val.n_batches) if chat else n
        sums = []  # device scalars, read once at the end: no host round trip per batch
        for i in range(n):
            x, y, *rest = val.microbatch(i, rows=self.rows)
            rest = rest if whole or chat else [np.ones(x.shape, np.float32)]
            sums.append(eval_sums(self.model, *(sharding.put_batch(a, self.mesh, B) for a in (x, y, *rest)))[0])
        # Counted here, not on the device: exact at any size (the rows of every process together).
        if chat:
            self.val_tokens = self.val_tokens or val.targets_in(n)
        else:
            self.val_tokens = val.n_targets if whole else self.cfg.validation_batches * B * val.seq_len
        return float(np.sum(np.asarray(jax.device_get(sums), np.float64))) / self.val_tokens

    def hellaswag(self, done: int) -> None:
        """train.json hellaswag_interval: score HellaSwag at this validation, if it is one of its steps."""
        every = self.cfg.hellaswag_interval
        if self.run.hellaswag is None or not (done % every == 0 or done == self.run.total_steps):
            return
        from jaxgpt.data.tokenizer import get_tokenizer
        from jaxgpt.evaluation.scoring import hellaswag_score

        tok = self.run.tokenizer or get_tokenizer(self.cfg.tokenizer)
        r = hellaswag_score(self.model, self.run.hellaswag, tok, progress=False)
        self.hellaswag_results.append({"step": done, "acc": r["acc"], "acc_norm": r["acc_norm"],
                                       "examples": r["examples"], "tokenizer": r["tokenizer"]})
        self.records.scalars(done, {"hellaswag/acc": r["acc"], "hellaswag/acc_norm": r["acc_norm"]})
        if self.is_main:
            tqdm.write(f"step {done}: hellaswag acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f} "
                       f"({r['examples']:,} examples)")

    def core(self, done: int) -> None:
        """train.json core_interval: score CORE at this validation, if it is one of its steps."""
        every = self.cfg.core_interval
        if self.run.core is None or not (done % every == 0 or done == self.run.total_steps):
            return
        from jaxgpt.evaluation.scoring import core_score

        r = core_score(self.model, self.run.core, progress=False)
        self.core_results.append({"step": done, "CORE": r["core"], "capped": r["capped"],
                                  "tasks": {label: {k: t[k] for k in ("accuracy", "centered", "examples")}
                                            for label, t in r["tasks"].items()}})
        self.records.scalars(done, {"core/CORE": r["core"]} | {f"core/{label}": t["centered"]
                                                               for label, t in r["tasks"].items()})
        if self.is_main:
            tqdm.write(f"step {done}: CORE {r['core']:.4f} ({len(r['tasks'])} tasks"
                       f"{', examples capped per task' if r['capped'] else ''})")

    def checkpoint(self, done: int, window: Window, stats: dict[str, Any], val: float, last: bool) -> Path:
        """Save step `done`; `last`: the session's final checkpoint (the end, a target, a stop)."""
        self.step.sync()
        is_best = self.best is None or val < self.best
        self.best = val if is_best else self.best
        meta = self.meta(done, window, stats, val, is_best)
        tok = self.run.tokenizer  # a trained one travels with each checkpoint
        files = {} if tok is None else {"tokenizer.json": tok.data}
        template = self.run.dataset.manifest.get("template")  # a conversation dataset's chat template too
        if template is not None:
            files[TEMPLATE_FILE] = (json.dumps(template, indent=2) + "\n").encode()
        path = ckpt.save_checkpoint(self.run.run_dir, self.model, self.optimizer, meta,
                                    {"model.json": to_dict(self.mcfg), "train.json": to_dict(self.cfg)},
                                    keep_last=self.cfg.keep_last_checkpoints, files=files)
        self.records.checkpoint(done, path.name)
        if self.is_main and (last or time.perf_counter() >= self.charts_due):
            # Drawing the charts takes about a second on a CPU: where checkpoints are seconds
            # apart (a small run) that would be much of the run. They are redrawn once the time
            # since the last draw is CHARTS_PACE times what it took, and always at the end, so
            # they cost at most ~5% of the wall time; what they draw is read from disk each time.
            started = time.perf_counter()
            charts.draw_charts(self.run.run_dir, log_y=self.cfg.charts_log_y)
            drawn = time.perf_counter()
            self.charts_due = drawn + CHARTS_PACE * (drawn - started)
        return path

    def training_seconds(self) -> float:
        """Training seconds so far (Target's docstring says what they count)."""
        return self.trained_s + sum(self.window.step_times)

    def already_reached(self) -> bool:
        """The checkpoint this session resumed from is at or below the target: say so, train nothing."""
        val = self.resumed.get("val_loss")
        if self.target is None or not isinstance(val, (int, float)) or not val <= self.target.value:
            return False
        self.log(f"Nothing to do: {self.run.resume_from.name} (step {self.start}) has validation loss {val:.4f}, "
                 f"at or below target_val_loss {self.target.value:g}.")
        return True

    def fit(self) -> int:
        run = self.run
        if self.already_reached():
            return 0
        if self.start >= run.total_steps:
            self.log(f"Nothing to do: {run.run_dir} already trained {self.start}/{run.total_steps} steps.")
            return 0
        if self.stops.now():
            self.log(f"Stopped before the first step of this session; nothing new to save in {run.run_dir}.")
            return 130
        self.records = RunLog(run.run_dir, self.start, enabled=self.is_main, wandb=self.cfg.wandb)
        self.records.configs(self.start, {"model.json": to_dict(self.mcfg), "train.json": to_dict(self.cfg)})
        self.bar = tqdm(total=run.total_steps, initial=self.start, unit="step", dynamic_ncols=True,
                        disable=None if self.is_main else True)
        t0 = time.perf_counter()
        self.window = Window()
        code = 1  # what the records (W&B's run state) are told if the loop raises
        try:
            code, last_loss = self.loop()
        finally:
            self.bar.close()
            if self.profile is not None:
                self.profile.stop()
            self.records.close(code)
        if code == 0:
            self.summary(time.perf_counter() - t0, last_loss)
        return code

    def check_target(self, done: int, val: float) -> bool:
        """Whether this validation reaches train.json target_val_loss (recorded, and logged, if so)."""
        tokens = done * self.tokens_per_step
        if self.target is None or not self.target.check(val, done, tokens, self.training_seconds()):
            return False
        self.records.scalars(done, {"target/steps": done, "target/tokens": tokens,
                                    "target/seconds": self.target.reached["training_seconds"]})
        return True

    def loop(self) -> tuple[int, float]:
        """The steps of this session; (exit code, last training loss)."""
        run, cfg, profile = self.run, self.cfg, self.profile
        last_loss, self.clock = float("nan"), time.perf_counter()
        batch = self.batch(self.start)
        # Each step's results are read after the next step is dispatched, so the device never
        # waits for the host between steps; a step that ends at a validation, a checkpoint or
        # an end of the profiled range is read (and the model synced) before anything else.
        # Stop requests are agreed the same way (peers.StopVotes): each step's vote is read with
        # its results, and every process stops after the same step.
        pending: tuple[int, Any] | None = None
        vote = None  # the pending step's stop vote
        for s in range(self.start, run.total_steps):
            if profile is not None:
                profile.before(s)
            out = self.step(*batch[:2], step_key(cfg.seed, s), *batch[2:])
            cast = self.stops.cast()
            if s + 1 < run.total_steps:  # assemble the next batch while the device works
                batch = self.batch(s + 1)
            if pending is not None:
                last_loss, stats = self.read(*pending)
                self.stops.count(vote)
            done, pending, vote = s + 1, (s + 1, out), cast
            stopping = self.stops.agreed
            at_ckpt = done % cfg.checkpoint_interval == 0 or done == run.total_steps or stopping
            at_eval = at_ckpt or done % cfg.eval_interval() == 0
            if not (at_eval or (profile is not None and profile.boundary(done))):
                continue
            last_loss, stats = self.read(*pending)
            self.stops.count(vote)
            pending = None
            if profile is not None:
                profile.after(done)
            if not at_eval:
                continue
            self.stop.check_abort()
            val = self.validate(done)
            self.records.scalars(done, {"val/loss": val, "val/tokens": self.val_tokens})
            self.stop.check_abort()
            reached = self.check_target(done, val)  # saved here, whatever the interval: the run ends
            if reached or (at_ckpt and not self.postpone(done, stopping)):
                self.save(done, stats, val, last=reached or stopping or done == run.total_steps)
            self.clock = time.perf_counter()  # the next step's time starts now, not at this result
            self.done = done
            if reached:
                return 0, last_loss
            if stopping:
                again = (f"uv run train.py {run.run_dir}" if jax.process_count() == 1 else
                         f"the same command on all {jax.process_count()} processes")
                self.log(f"Interrupted after step {done}/{run.total_steps}; checkpoint saved.\n"
                         f"Resume with: {again}")
                return 130, last_loss
        return 0, last_loss

    def read(self, done: int, out: Any) -> tuple[float, dict[str, Any]]:
        """Wait for step `done`'s results (only), record and show them."""
        losses, stats = jax.device_get(out)
        now = time.perf_counter()
        step_time, self.clock = now - self.clock, now
        self.window.record(done, losses, stats, step_time)
        self.count_dropped(done, bool(stats["skipped_step"]))
        tokens_per_s = self.tokens_per_step / max(step_time, 1e-9)
        gn, dropped = self.window.grad_norms[-1], self.window.dropped[-1]
        loss = step_loss(losses, stats)
        rates = {f"optim/lr_{part}": v for part, v in part_rates(stats).items() if part not in ("adamw", "muon")}
        if "momentum" in stats:
            rates["optim/muon_momentum"] = float(stats["momentum"])
        self.records.scalars(done, rates | {
            "train/loss": loss, "train/loss_min": float(np.min(losses)), "train/loss_max": float(np.max(losses)),
            "train/tokens": done * self.tokens_per_step, "optim/lr": float(stats["learning_rate"]), "optim/grad_norm": gn,
            "optim/clipped": float(clip_flag(gn, self.cfg.clipping_max_norm)), "optim/skipped": float(dropped),
            "perf/step_time_s": step_time, "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": self.mfu_at(tokens_per_s)})
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{float(stats['learning_rate']):.2e}",
                             tok_s=f"{self.window.tokens_per_s(self.tokens_per_step):,.0f}",
                             mfu=f"{100 * self.mfu_at(self.window.tokens_per_s(self.tokens_per_step)):.1f}%", refresh=False)
        return loss, stats

    def save(self, done: int, stats: dict[str, Any], val: float, last: bool) -> None:
        self.elapsed += time.perf_counter() - self.window.started
        self.records.flush()  # the record up to this step is as durable as the checkpoint
        path = self.checkpoint(done, self.window, stats, val, last)
        self.trained_s = self.training_seconds()
        self.hellaswag_results, self.core_results = [], []
        if self.is_main:
            self.bar.write(self.progress_line(done, self.window, stats, val) + f" | saved {path.name}")
        self.window = Window()

    def mfu_at(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation at this throughput (mfu.py: FLOPs per token and the peak)."""
        return mfu.mfu(tokens_per_s, self.flops_per_token, self.peak_flops)

    def count_dropped(self, done: int, dropped: bool) -> None:
        """Bound a storm of dropped steps: past max_dropped_steps in a row, stop with an error."""
        self.dropped_streak = self.dropped_streak + 1 if dropped else 0
        self.dropped_total += int(dropped)
        if self.dropped_streak >= self.cfg.max_dropped_steps:
            latest = ckpt.latest_checkpoint(self.run.run_dir)
            kept = f"checkpoints/latest is {latest.name}" if latest is not None else "no checkpoint was written"
            raise TrainingError(
                f"{self.run.run_dir}: the last {self.dropped_streak} optimiser steps (to step {done}) were all "
                f"dropped for non-finite gradients (train.json max_dropped_steps={self.cfg.max_dropped_steps}): "
                f"the run diverged; {kept}. Lower learning_rate, or check the data, and rerun")

    def postpone(self, done: int, stopping: bool) -> bool:
        """Skip an interval checkpoint while steps are being dropped: `latest` stays on the last
        good one (the weights did not move, but the data position did). A stop request saves."""
        if self.dropped_streak == 0 or stopping or done == self.run.total_steps:
            return False
        self.log(f"step {done}: checkpoint postponed, the last {self.dropped_streak} step(s) were dropped "
                 f"(non-finite gradients)")
        return True

    def meta(self, done: int, window: Window, stats: dict[str, Any], val: float, is_best: bool) -> dict[str, Any]:
        """What a resume and a reader of this one checkpoint need; every step's figures are the
        record's (metrics.jsonl), not repeated here."""
        cfg, micro = self.cfg, np.asarray(window.micro_losses)
        return {
            "format": 2,
            "step": done,
            "total_steps": self.run.total_steps,
            "tokens_seen": done * self.tokens_per_step,
            "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "train_loss": {"min": float(micro.min()), "max": float(micro.max()),
                           "mean": float(micro.mean()), "last": window.losses[-1]},
            "val_loss": val,
            "val_tokens": self.val_tokens,  # target tokens that loss is the mean over
            "hellaswag": self.hellaswag_results,  # [{"step", "acc", "acc_norm", ...}] since the last checkpoint
            "core": self.core_results,  # [{"step", "CORE", "capped", "tasks": {label: {accuracy, centered, ...}}}]
            "best_loss": self.best,  # lowest validation loss so far
            "is_best": is_best,
            "learning_rate": float(stats["learning_rate"]),  # used by the last applied step (muon: the matrices')
            "learning_rates": part_rates(stats),  # each part's, by name (adamw: one)
            "optimizer": cfg.optimizer,
            "routing": self.routing,  # muon: each part's tensors and params (muon.routing_table)
            # The schedule counts applied optimiser steps: a dropped step does not advance it.
            "next_learning_rate": float(self.schedule(int(stats["gradient_step"]))),
            "grad_norm": window.grad_norms[-1],  # pre-clip norm of the last accumulated gradient
            "clip_max_norm": cfg.clipping_max_norm,
            "clipped_steps": sum(clip_flag(g, cfg.clipping_max_norm) for g in window.grad_norms),
            "skipped_updates": {"consecutive": int(stats["notfinite_count"]),  # microbatches
                                "total": int(stats["total_notfinite"]),  # microbatches, whole run
                                "dropped_steps": window.dropped_steps,  # since the last checkpoint
                                "dropped_steps_total": self.dropped_total},
            "optimizer_steps_applied": int(stats["gradient_step"]),
            "throughput_tokens_per_s": window.tokens_per_s(self.tokens_per_step),
            "mfu": self.mfu_at(window.tokens_per_s(self.tokens_per_step)),
            "flops_per_token": self.flops_per_token,  # mfu.flops_per_token: 6N + 12 L T C
            "peak_flops": self.peak_flops, "peak_flops_source": self.peak_source,
            "elapsed_s": self.elapsed,
            "training_s": self.training_seconds(),  # Target's docstring says what is counted
            "target": None if self.target is None else self.target.record(
                done, done * self.tokens_per_step, self.training_seconds()),
            "mesh": dict(self.mesh.shape) | {"processes": jax.process_count()},
            "compute_dtype": self.compute_dtype,  # the matmuls' dtype, model.json's "auto" resolved
            "data_position": {"next_step": done, "microbatches_consumed": done * self.k,
                              "sequences_consumed": done * self.k * cfg.microbatch_size,
                              "epoch": self.run.train_batches.epoch_of(done, self.k),
                              "dataset": str(self.run.dataset.path),
                              "fingerprint": self.run.dataset.manifest.get("fingerprint")},
            # Dropout keys are fold_in(key(seed), step): the seed and the step are the whole RNG state.
            "rng": {"seed": cfg.seed, "next_step": done, "scheme": "fold_in(key(seed), step)"},
        }

    def progress_line(self, done: int, window: Window, stats: dict[str, Any], val: float) -> str:
        gn = window.grad_norms[-1]
        gn_txt = "n/a" if gn is None else f"{gn:.3g}" + (" (clipped)" if clip_flag(gn, self.cfg.clipping_max_norm) else "")
        return (f"step {done}/{self.run.total_steps} | loss {np.mean(window.losses):.4f} | "
                f"val {val:.4f} ({self.val_tokens:,} tokens) | lr {float(stats['learning_rate']):.3e} | grad norm {gn_txt} | "
                f"{window.tokens_per_s(self.tokens_per_step):,.0f} tok/s | "
                f"MFU {100 * self.mfu_at(window.tokens_per_s(self.tokens_per_step)):.1f}%")

    def summary(self, seconds: float, last_loss: float) -> None:
        tokens = (self.done - self.start) * self.tokens_per_step
        target = "" if self.target is None else "\n" + self.target.line(
            self.done, self.done * self.tokens_per_step, self.trained_s)
        self.log(f"Training complete in {seconds:,.3f} seconds\n"
                 f"Tokens seen: {self.done * self.tokens_per_step:,} ({tokens:,} in this session)\n"
                 f"Throughput: {tokens / seconds:,.0f} tokens/second\n"
                 f"Final train loss: {last_loss:.4f}\n"
                 f"Best validation loss: {self.best:.4f}" + target)


class Profile:
    """`train.py --profile START:STOP`: a jax.profiler trace of the steps that take the run from
    START to STOP steps done, into runs/<name>/profile/ (TensorBoard's profile plugin, XProf or
    Perfetto read it). The loop reads the results at both ends, so the trace holds those steps
    whole and nothing of the steps around them."""

    def __init__(self, run_dir: Path, steps: tuple[int, int], first: int) -> None:
        self.dir, (self.begin, self.end), self.active = Path(run_dir) / "profile", steps, False
        if self.begin < first:
            tqdm.write(f"--profile {self.begin}:{self.end}: this session starts at step {first}; "
                       f"nothing will be traced")

    def boundary(self, done: int) -> bool:
        return done in (self.begin, self.end)

    def before(self, s: int) -> None:
        if s == self.begin and jax.process_index() == 0:
            jax.profiler.start_trace(str(self.dir))
            self.active = True

    def after(self, done: int) -> None:
        if done == self.end:
            self.stop()

    def stop(self) -> None:
        if self.active:
            self.active = False
            jax.profiler.stop_trace()
            tqdm.write(f"Profile of steps {self.begin}:{self.end} written under {self.dir}/plugins/profile/")
