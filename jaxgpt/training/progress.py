"""What a training session counts between its steps: each step's figures, the window since the last
checkpoint, the best validation loss, dropped steps, training seconds, the target loss; and the
lines it prints. No JAX: the loop hands it host values (loop.py).

    progress = Progress.resumed_from(meta, limits, mfu)  # meta.json of the checkpoint resumed from, or {}
    scalars = progress.record(done, losses, stats)     # the record's row of one step
    progress.check_dropped(done)                       # once it is recorded: raises on a NaN storm
    progress.closing(val, val_tokens)                   # a checkpoint: the validation it records
    progress.line(done, stats)                          # the line printed at a checkpoint
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.training.optimizer import clip_flag, part_rates
from jaxgpt.training.run import TrainingError


@dataclass(frozen=True)
class Limits:
    """What the counters need of a run: its length, its sizes, its bounds."""

    run_dir: Path  # named in a NaN storm's error
    total_steps: int
    tokens_per_step: int
    clip_max_norm: float
    max_dropped_steps: int
    target_val_loss: float | None = None


def step_loss(losses: np.ndarray, stats: dict[str, Any]) -> float:
    """The step's training loss: the mean over its microbatches, or (a loss mask: fine-tuning) over
    every token it trained on, which the step computes (train_step.py)."""
    return float(stats["loss"]) if "loss" in stats else float(np.mean(losses))


@dataclass
class Window:
    """Per-step statistics since the last checkpoint: what meta.json sums up (the record has each step)."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # each step's loss (step_loss)
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

    Training seconds (meta.json training_s) are the sum of every step's perf/step_time_s over every
    session: from the previous step's result (or the end of the validation or checkpoint before
    it) to this step's result, so the data, the host's work and each session's first compile are
    in; validation, HellaSwag, CORE, checkpoint writing and charts are not.
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
            return (
                f"Target validation loss {self.value:g} reached at step {r['step']}: {r['step']:,} steps, "
                f"{r['tokens']:,} tokens, {r['training_seconds']:,.3f} training seconds"
            )
        best = "n/a" if self.best is None else f"{self.best:.4f}"
        return f"Target validation loss {self.value:g} not reached in {step:,} steps (best {best})"


@dataclass
class Progress:
    """A session's counters: where it started, the best validation loss, the dropped steps, the time."""

    limits: Limits
    mfu: Any  # tokens/s -> model FLOPs utilisation (loop.py makes it from mfu.py's figures)
    start: int = 0
    best: float | None = None  # lowest validation loss at a checkpoint so far
    val: float | None = None  # the validation the checkpoint being written records (closing)
    val_tokens: int = 0
    is_best: bool = False
    elapsed: float = 0.0  # wall seconds of the sessions' windows up to the last checkpoint
    trained_s: float = 0.0  # training seconds (Target) up to the last checkpoint, every session
    dropped_total: int = 0
    dropped_streak: int = 0  # optimiser steps dropped in a row (non-finite gradients)
    resumed: dict[str, Any] = field(default_factory=dict)  # meta.json of the checkpoint resumed from
    target: Target | None = None
    window: Window = field(default_factory=Window)
    clock: float = field(default_factory=time.perf_counter)  # when the step now running was started

    @classmethod
    def resumed_from(cls, meta: dict[str, Any], limits: Limits, mfu: Any) -> Progress:
        best, value = meta.get("best_loss"), limits.target_val_loss
        target = None if value is None else Target(value, best=(meta.get("target") or {}).get("best_loss", best))
        elapsed = meta.get("elapsed_s", 0.0)
        # Checkpoints from before training seconds were counted: their elapsed time (validation included).
        return cls(
            limits,
            mfu,
            start=meta.get("step", 0),
            best=best,
            elapsed=elapsed,
            trained_s=meta.get("training_s", elapsed),
            dropped_total=meta.get("skipped_updates", {}).get("dropped_steps_total", 0),
            resumed=meta,
            target=target,
        )

    @property
    def tokens_per_step(self) -> int:
        return self.limits.tokens_per_step

    def training_seconds(self) -> float:
        return self.trained_s + sum(self.window.step_times)

    def record(self, done: int, losses: np.ndarray, stats: dict[str, Any]) -> dict[str, float | None]:
        """Step `done`'s results into the window; its row of the record (check_dropped next)."""
        now = time.perf_counter()
        step_time, self.clock = now - self.clock, now
        self.window.record(done, losses, stats, step_time)
        self.dropped_streak = self.dropped_streak + 1 if stats["skipped_step"] else 0
        self.dropped_total += int(bool(stats["skipped_step"]))
        tokens_per_s = self.tokens_per_step / max(step_time, 1e-9)
        gn = self.window.grad_norms[-1]
        rates = {f"optim/lr_{part}": v for part, v in part_rates(stats).items() if part not in ("adamw", "muon")}
        if "momentum" in stats:
            rates["optim/muon_momentum"] = float(stats["momentum"])
        return rates | {
            "train/loss": self.window.losses[-1],
            "train/loss_min": float(np.min(losses)),
            "train/loss_max": float(np.max(losses)),
            "train/tokens": done * self.tokens_per_step,
            "optim/lr": float(stats["learning_rate"]),
            "optim/grad_norm": gn,
            "optim/clipped": float(clip_flag(gn, self.limits.clip_max_norm)),
            "optim/skipped": float(self.window.dropped[-1]),
            "perf/step_time_s": step_time,
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": self.mfu(tokens_per_s),
        }

    def check_dropped(self, done: int) -> None:
        """Bound a storm of dropped steps: past max_dropped_steps in a row, stop with an error (after
        step `done`'s row is in the record: the step that stops the run is its last)."""
        from jaxgpt.checkpoints import layout

        limit = self.limits.max_dropped_steps
        if self.dropped_streak >= limit:
            latest = layout.latest_checkpoint(self.limits.run_dir)
            kept = f"checkpoints/latest is {latest.name}" if latest is not None else "no checkpoint was written"
            raise TrainingError(
                f"{self.limits.run_dir}: the last {self.dropped_streak} optimiser steps (to step {done}) were all "
                f"dropped for non-finite gradients (train.json max_dropped_steps={limit}): the run diverged; "
                f"{kept}. Lower learning_rate, or check the data, and rerun"
            )

    def postpone(self, done: int, stopping: bool) -> str | None:
        """Why an interval checkpoint is skipped (steps are being dropped: `latest` stays on the last
        good one; the weights did not move, but the data position did), or None. A stop request saves."""
        if self.dropped_streak == 0 or stopping or done == self.limits.total_steps:
            return None
        return (
            f"step {done}: checkpoint postponed, the last {self.dropped_streak} step(s) were dropped "
            f"(non-finite gradients)"
        )

    def checked_target(self, done: int, val: float) -> bool:
        """Whether this validation reaches train.json target_val_loss (for the first time)."""
        return self.target is not None and self.target.check(
            val, done, done * self.tokens_per_step, self.training_seconds()
        )

    def closing(self, val: float, val_tokens: int) -> bool:
        """A checkpoint with validation loss `val` (over `val_tokens` targets) is about to be written: the
        window's wall time is counted; whether `val` is the best so far."""
        self.val, self.val_tokens = val, val_tokens
        self.is_best = self.best is None or val < self.best
        self.best = val if self.is_best else self.best
        self.elapsed += time.perf_counter() - self.window.started
        return self.is_best

    def next_window(self) -> None:
        """The checkpoint is written: what it counted is settled, a new window starts."""
        self.trained_s = self.training_seconds()
        self.window = Window()

    def line(self, done: int, stats: dict[str, Any]) -> str:
        """The line printed at a checkpoint (after closing: the window and validation it records)."""
        window = self.window
        gn = window.grad_norms[-1]
        clipped = gn is not None and clip_flag(gn, self.limits.clip_max_norm)
        gn_txt = "n/a" if gn is None else f"{gn:.3g}" + (" (clipped)" if clipped else "")
        rate = window.tokens_per_s(self.tokens_per_step)
        return (
            f"step {done}/{self.limits.total_steps} | loss {np.mean(window.losses):.4f} | "
            f"val {self.val:.4f} ({self.val_tokens:,} tokens) | lr {float(stats['learning_rate']):.3e} | "
            f"grad norm {gn_txt} | {rate:,.0f} tok/s | MFU {100 * self.mfu(rate):.1f}%"
        )

    def summary(self, done: int, seconds: float, last_loss: float) -> str:
        tokens = (done - self.start) * self.tokens_per_step
        target = (
            "" if self.target is None else "\n" + self.target.line(done, done * self.tokens_per_step, self.trained_s)
        )
        return (
            f"Training complete in {seconds:,.3f} seconds\n"
            f"Tokens seen: {done * self.tokens_per_step:,} ({tokens:,} in this session)\n"
            f"Throughput: {tokens / seconds:,.0f} tokens/second\n"
            f"Final train loss: {last_loss:.4f}\n"
            f"Best validation loss: {self.best:.4f}" + target
        )
