"""The training loop: fetch a batch, step, read the step's results, validate, save. Nothing else.

train.py checks the run (run.py, before JAX starts) and calls `train`. The pieces it calls are
named and live beside it: what the session builds (state.py: mesh, model, optimiser, the compiled
step, checkpoint metadata), what it counts and prints (progress.py), what it measures at a
validation (evaluators.py), where its figures go (jaxgpt/tracking/), and checkpoints
(jaxgpt/checkpoints/store.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from tqdm import tqdm

from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import to_dict
from jaxgpt.conversations.template import TEMPLATE_FILE
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.distributed import sharding
from jaxgpt.distributed.peers import StopVotes
from jaxgpt.tracking import charts
from jaxgpt.tracking.metrics import RunLog
from jaxgpt.training.evaluators import Evaluator, evaluators
from jaxgpt.training.progress import Progress
from jaxgpt.training.state import build_state, checkpoint_meta
from jaxgpt.training.train_step import step_key

if TYPE_CHECKING:
    from jaxgpt.stopping import StopFlag
    from jaxgpt.training.run import Run

CHARTS_PACE = 19  # charts are redrawn at most once per 19x their drawing time (Session.save)


def train(run: Run, stop: StopFlag, profile: tuple[int, int] | None = None, charts_pace: float = CHARTS_PACE) -> int:
    """Train `run` from where it stands to its last step, its target or a stop request; the exit code
    (0 done, 130 stopped with a checkpoint)."""
    s = Session(run, stop, profile, charts_pace)
    if (code := s.nothing_to_do()) is not None:
        return code
    with s.recording() as done_with:
        batch, pending, loss = s.fetch(s.progress.start), None, float("nan")
        # Each step's results are read after the next step is dispatched, so the device never waits
        # for the host; a step that ends at a validation, a checkpoint or a profile boundary is read
        # (and the model synced) before anything else. A stop request is agreed the same way: each
        # step's vote is read with its results, and every process stops after the same step.
        for step in range(s.progress.start, run.total_steps):
            out = s.dispatch(batch, step)
            if step + 1 < run.total_steps:
                batch = s.fetch(step + 1)  # while the device works
            if pending is not None:
                loss, stats = s.read(*pending)
            done, pending, stopping = step + 1, out, s.stops.agreed
            if not s.boundary(done, stopping):
                continue
            loss, stats = s.read(*pending)
            pending = None
            if not s.at_validation(done, stopping):
                continue
            val = s.validate(done)
            reached = s.reached_target(done, val)  # saved whatever the interval: the run ends
            if reached or s.checkpoint_due(done, stopping):
                s.save(done, stats, val, last=reached or stopping or done == run.total_steps)
            s.progress.clock = time.perf_counter()  # the next step's time starts now, not at this result
            if reached or stopping:
                return done_with(0 if reached else s.interrupted(done), done, loss)
        return done_with(0, run.total_steps, loss)


class Session:
    """One call of `train`: the state built once, the counters, the records, and the loop's steps."""

    def __init__(self, run: Run, stop: StopFlag, profile: tuple[int, int] | None, charts_pace: float) -> None:
        self.run, self.cfg, self.stop, self.charts_pace = run, run.train_cfg, stop, charts_pace
        self.is_main = jax.process_index() == 0
        self.state, meta = build_state(run, self.log)
        self.stops = StopVotes(stop, self.state.mesh)  # a signal may reach one process only: stop if any got one
        self.progress = Progress.resumed_from(meta, run, self.state.mfu)
        self.evaluators: list[Evaluator] = evaluators(run, self.state.mesh, self.state.rows)
        self.profile = Profile(run.run_dir, profile, self.progress.start) if profile is not None else None
        self.charts_due = 0.0  # perf_counter time after which a checkpoint redraws the charts
        self.records: RunLog | None = None

    def log(self, text: str) -> None:
        if self.is_main:
            print(text, flush=True)

    def nothing_to_do(self) -> int | None:
        """An exit code when this session has no step to train (said in one line), else None."""
        run, p = self.run, self.progress
        val = p.resumed.get("val_loss")
        if p.target is not None and isinstance(val, (int, float)) and val <= p.target.value:
            self.log(
                f"Nothing to do: {run.resume_from.name} (step {p.start}) has validation loss {val:.4f}, "
                f"at or below target_val_loss {p.target.value:g}."
            )
            return 0
        if p.start >= run.total_steps:
            self.log(f"Nothing to do: {run.run_dir} already trained {p.start}/{run.total_steps} steps.")
            return 0
        if self.stops.now():
            self.log(f"Stopped before the first step of this session; nothing new to save in {run.run_dir}.")
            return 130
        return None

    @contextmanager
    def recording(self) -> Iterator[Any]:
        """The run's records and progress bar for the loop; yields done_with(code, step, last loss)."""
        run, start = self.run, self.progress.start
        self.records = RunLog(run.run_dir, start, enabled=self.is_main, wandb=self.cfg.wandb)
        self.records.configs(start, {"model.json": to_dict(run.model_cfg), "train.json": to_dict(self.cfg)})
        self.bar = tqdm(
            total=run.total_steps,
            initial=start,
            unit="step",
            dynamic_ncols=True,
            disable=None if self.is_main else True,
        )
        started, outcome = time.perf_counter(), [1]  # what the records (W&B's run state) are told if it raises

        def done_with(code: int, done: int, loss: float) -> int:
            outcome[0] = code
            if code == 0:
                self.bar.close()
                self.log(self.progress.summary(done, time.perf_counter() - started, loss))
            return code

        try:
            yield done_with
        finally:
            self.bar.close()
            if self.profile is not None:
                self.profile.stop()
            self.records.close(outcome[0])

    def fetch(self, step: int) -> Batch:
        """This process's rows of step `step` as global (k, B, T) arrays on the mesh: inputs and
        targets, and for packed conversations their loss weights and segments."""
        arrays = self.run.train_batches.batch(step, self.cfg.gradient_accumulation_steps, rows=self.state.rows)
        return Batch(*arrays).map(lambda a: sharding.put_batch(a, self.state.mesh, self.cfg.microbatch_size))

    def dispatch(self, batch: Batch, step: int) -> tuple[int, Any, Any]:
        """Start step `step` on the device (asynchronously); (its number done, results, stop vote)."""
        if self.profile is not None:
            self.profile.before(step)
        out = self.state.step(batch, step_key(self.cfg.seed, step))
        return step + 1, out, self.stops.cast()

    def read(self, done: int, out: Any, vote: Any) -> tuple[float, dict[str, Any]]:
        """Wait for step `done`'s results (only), count its stop vote, record and show them."""
        losses, stats = jax.device_get(out)
        self.stops.count(vote)
        scalars = self.progress.record(done, losses, stats)
        self.records.scalars(done, scalars)
        self.progress.check_dropped(done)  # a NaN storm stops the run with its last step recorded
        self.bar.update(1)
        rate = self.progress.window.tokens_per_s(self.progress.tokens_per_step)
        self.bar.set_postfix(
            loss=f"{scalars['train/loss']:.4f}",
            lr=f"{scalars['optim/lr']:.2e}",
            tok_s=f"{rate:,.0f}",
            mfu=f"{100 * self.state.mfu(rate):.1f}%",
            refresh=False,
        )
        if self.profile is not None:
            self.profile.after(done)
        return scalars["train/loss"], stats

    def checkpoint_due(self, done: int, stopping: bool) -> bool:
        """A checkpoint at step `done`: at the interval, at the end, at a stop; not while steps are
        being dropped (progress.postpone)."""
        due = done % self.cfg.checkpoint_interval == 0 or done == self.run.total_steps or stopping
        reason = self.progress.postpone(done, stopping) if due else None
        if reason is not None:
            self.log(reason)
        return due and reason is None

    def at_validation(self, done: int, stopping: bool) -> bool:
        """A validation (evaluators.py) at step `done`: every checkpoint has one."""
        return (
            done % self.cfg.validation_interval == 0
            or done % self.cfg.checkpoint_interval == 0
            or done == self.run.total_steps
            or stopping
        )

    def boundary(self, done: int, stopping: bool) -> bool:
        """Whether the loop reads this step's results before dispatching the next one."""
        return self.at_validation(done, stopping) or (self.profile is not None and self.profile.boundary(done))

    def validate(self, done: int) -> float:
        """Every evaluator due at step `done` (validation last); the validation loss."""
        self.stop.check_abort()
        self.state.step.sync()
        for evaluator in self.evaluators:
            if evaluator.due(done):
                scalars = evaluator(self.state.model, done)
                self.records.scalars(done, scalars)
        self.stop.check_abort()
        self.val_tokens = self.evaluators[-1].tokens
        return scalars["val/loss"]

    def reached_target(self, done: int, val: float) -> bool:
        """Whether this validation reaches train.json target_val_loss (recorded where, if so)."""
        if not self.progress.checked_target(done, val):
            return False
        where = self.progress.target.reached
        self.records.scalars(
            done, {"target/steps": done, "target/tokens": where["tokens"], "target/seconds": where["training_seconds"]}
        )
        return True

    def save(self, done: int, stats: dict[str, Any], val: float, last: bool) -> Path:
        """Checkpoint step `done` (`last`: the session's final one: the end, a target, a stop)."""
        run, progress = self.run, self.progress
        is_best = progress.closing(val)
        self.records.flush()  # the record up to this step is as durable as the checkpoint
        self.state.step.sync()
        measured = {k: v for e in self.evaluators for k, v in e.since_checkpoint().items()}
        self.state.observe(progress.window.tokens_per_s(progress.tokens_per_step))  # a peak measured low: raised
        meta = checkpoint_meta(run, self.state, progress, done, stats, val, self.val_tokens, is_best, measured)
        line = progress.line(done, progress.window, stats, val, self.val_tokens)
        path = ckpt.save_checkpoint(
            run.run_dir,
            self.state.model,
            self.state.optimizer,
            meta,
            {"model.json": to_dict(run.model_cfg), "train.json": to_dict(self.cfg)},
            keep_last=self.cfg.keep_last_checkpoints,
            files=self.checkpoint_files(),
        )
        self.records.checkpoint(done, path.name)
        progress.next_window()
        if self.is_main and (last or time.perf_counter() >= self.charts_due):
            # Drawing the charts takes about a second on a CPU: where checkpoints are seconds apart
            # (a small run) that would be much of the run. They are redrawn once the time since the
            # last draw is charts_pace times what it took, and always at the end, so they cost at
            # most ~5% of the wall time; what they draw is read from disk each time.
            started = time.perf_counter()
            charts.draw_charts(run.run_dir, log_y=self.cfg.charts_log_y)
            self.charts_due = time.perf_counter() + self.charts_pace * (time.perf_counter() - started)
        if self.is_main:
            self.bar.write(f"{line} | saved {path.name}")
        return path

    def checkpoint_files(self) -> dict[str, bytes]:
        """What travels with every checkpoint besides its weights: a trained tokenizer's file, a
        conversation dataset's chat template."""
        tok = self.run.tokenizer
        files = {} if tok is None else {"tokenizer.json": tok.data}
        template = self.run.dataset.manifest.get("template")
        if template is not None:
            files[TEMPLATE_FILE] = (json.dumps(template, indent=2) + "\n").encode()
        return files

    def interrupted(self, done: int) -> int:
        again = (
            f"uv run train.py {self.run.run_dir}"
            if jax.process_count() == 1
            else f"the same command on all {jax.process_count()} processes"
        )
        self.log(f"Interrupted after step {done}/{self.run.total_steps}; checkpoint saved.\nResume with: {again}")
        return 130


class Profile:
    """`train.py --profile START:STOP`: a jax.profiler trace of the steps that take the run from
    START to STOP steps done, into runs/<name>/profile/ (TensorBoard's profile plugin, XProf or
    Perfetto read it). The loop reads the results at both ends, so the trace holds those steps
    whole and nothing of the steps around them."""

    def __init__(self, run_dir: Path, steps: tuple[int, int], first: int) -> None:
        self.dir, (self.begin, self.end), self.active = Path(run_dir) / "profile", steps, False
        if self.begin < first:
            tqdm.write(
                f"--profile {self.begin}:{self.end}: this session starts at step {first}; nothing will be traced"
            )

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
