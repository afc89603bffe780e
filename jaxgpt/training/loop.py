"""The training loop: fetch a batch, step, read the step's results, run the jobs due. Nothing else.

train.py checks the run (run.py, before JAX starts) and calls `train`. Around the loop: what the session
builds (state.py), what it counts and prints (progress.py), what it measures (evaluators.py), and the
periodic work, as jobs (jobs.py): benchmarks, validation, the target, checkpoints, each given what it
needs; where the figures go is jaxgpt/tracking/, checkpoints jaxgpt/checkpoints/store.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from tqdm import tqdm

from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import to_dict
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.distributed import sharding
from jaxgpt.distributed.peers import StopVotes
from jaxgpt.tracking import charts
from jaxgpt.tracking.metrics import RunLog
from jaxgpt.training import memory
from jaxgpt.training.evaluators import Core, HellaSwag, Validation
from jaxgpt.training.jobs import Job, any_due, run_jobs
from jaxgpt.training.progress import Limits, Progress
from jaxgpt.training.state import Position, build_state, checkpoint_meta
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
    with s.recording():
        batch, pending, loss = s.fetch(s.progress.start), None, float("nan")
        # Each step's results are read after the next step is dispatched, so the device never waits
        # for the host; a step at which a job is due (or a profile boundary) is read, and the model
        # synced, before anything else. A stop request is agreed the same way: each step's vote is
        # read with its results, and every process stops after the same step.
        for step in range(s.progress.start, run.total_steps):
            out = s.dispatch(batch, step)
            if step + 1 < run.total_steps:
                batch = s.fetch(step + 1)  # while the device works
            if pending is not None:
                loss, stats = s.read(*pending)
            done, pending, stopping = step + 1, out, s.stops.agreed
            end = stopping or done == run.total_steps
            if not any_due(s.jobs, done, end) and not s.profile_boundary(done):
                continue
            loss, stats = s.read(*pending)
            pending = None
            if not any_due(s.jobs, done, end):
                continue
            s.stats = stats
            results = s.run_jobs(done, end)
            s.progress.clock = time.perf_counter()  # the next step's time starts now, not at this result
            if results.get("target") or stopping:
                return s.finish(0 if results.get("target") else s.interrupted(done), done, loss)
        return s.finish(0, run.total_steps, loss)


class Session:
    """One call of `train`: the state built once, the counters, the jobs, the records, the loop's steps."""

    def __init__(self, run: Run, stop: StopFlag, profile: tuple[int, int] | None, charts_pace: float) -> None:
        self.run, self.cfg, self.stop, self.charts_pace = run, run.train_cfg, stop, charts_pace
        self.is_main = jax.process_index() == 0
        self.state, meta = build_state(run, self.log)
        if (line := run.train_batches.describe()) is not None:
            self.log(line)
        self.stops = StopVotes(stop, self.state.mesh)  # a signal may reach one process only: stop if any got one
        self.progress = Progress.resumed_from(meta, _limits(run), self.state.mfu)
        self.profile = Profile(run.run_dir, profile, self.progress.start) if profile is not None else None
        self.benchmarks: list[HellaSwag | Core] = []
        self.jobs = self._jobs(run)
        self.position = Position(
            self.cfg.seed,
            self.cfg.gradient_accumulation_steps,
            self.cfg.microbatch_size,
            str(run.dataset.path),
            run.dataset.manifest.get("fingerprint"),
            run.train_batches.epoch_of,
        )
        self.charts_due = 0.0  # perf_counter time after which a checkpoint redraws the charts
        self.records: RunLog | None = None  # from recording() on
        self.bar: tqdm | None = None
        self.stats: dict[str, Any] = {}  # the last step's optimiser statistics, read at a boundary
        self.started, self.outcome = time.perf_counter(), 1  # what the records are told if the loop raises

    def _jobs(self, run: Run) -> list[Job]:
        """The periodic work, in order: benchmarks, validation (its loss decides the rest), the target,
        the checkpoint (at its interval, the end, a stop or a target reached)."""
        cfg, jobs = self.cfg, []
        tok = run.tokenizer or (get_tokenizer(cfg.tokenizer) if run.hellaswag is not None else None)
        for bench, every in (
            (HellaSwag(run.hellaswag, tok), cfg.hellaswag_interval),
            (Core(run.core), cfg.core_interval),
        ):
            if every is not None:  # at the validations of multiples of its interval, and the run's last step
                self.benchmarks.append(bench)
                jobs.append(Job(bench.name, self._measure(bench), every=(every,), at_end=False, when=self._last))
        validation = Validation(
            run.val_batches, cfg.validation_batches, self.state.mesh, self.state.rows, cfg.microbatch_size
        )
        checkpoint_every = (cfg.checkpoint_interval,)
        jobs.append(
            Job(
                "val",
                lambda done, _: self.validate(validation, done),
                every=(cfg.validation_interval, *checkpoint_every),
            )
        )
        jobs.append(Job("target", lambda done, r: self.reached_target(done, r["val"]), at_end=False, when=_after_val))
        jobs.append(Job("checkpoint", self.save, every=checkpoint_every, when=lambda _d, r: bool(r.get("target"))))
        return jobs

    def _last(self, done: int, _results: dict[str, Any]) -> bool:
        return done == self.run.total_steps

    def _measure(self, bench: HellaSwag | Core) -> Any:
        def job(done: int, _results: dict[str, Any]) -> None:
            self.records.scalars(done, bench(self.state.model, done))

        return job

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
    def recording(self) -> Iterator[None]:
        """The run's records and progress bar for the loop (closed with the session's outcome)."""
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
        self.started = time.perf_counter()
        try:
            yield
        finally:
            self.bar.close()
            if self.profile is not None:
                self.profile.stop()
            self.records.close(self.outcome)

    def finish(self, code: int, done: int, loss: float) -> int:
        """The session ends with `code` at step `done` (0: the summary is printed)."""
        self.outcome = code
        if code == 0:
            self.bar.close()
            self.log(self.progress.summary(done, time.perf_counter() - self.started, loss))
        return code

    def fetch(self, step: int) -> Batch:
        """This process's rows of step `step` as global (k, B, T) arrays on the mesh."""
        batch = self.run.train_batches.batch(step, self.cfg.gradient_accumulation_steps, rows=self.state.rows)
        split = self.state.plan.split  # the memory plan's smaller microbatches: the same rows
        return batch.map(
            lambda a: sharding.put_batch(
                memory.split_rows(a, split), self.state.mesh, self.cfg.microbatch_size // split
            )
        )

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

    def profile_boundary(self, done: int) -> bool:
        return self.profile is not None and self.profile.boundary(done)

    def run_jobs(self, done: int, end: bool) -> dict[str, Any]:
        """The jobs due at step `done`, on the synced model (a second Ctrl-C aborts between them)."""
        self.stop.check_abort()
        self.state.step.sync()
        results = run_jobs(self.jobs, done, end)
        self.stop.check_abort()
        return results

    def validate(self, validation: Validation, done: int) -> tuple[float, int]:
        """The validation loss and the targets it is the mean over, recorded."""
        scalars = validation(self.state.model)
        self.records.scalars(done, scalars)
        return scalars["val/loss"], validation.tokens

    def reached_target(self, done: int, val: tuple[float, int]) -> bool:
        """Whether this validation reaches train.json target_val_loss (recorded where, if so)."""
        if not self.progress.checked_target(done, val[0]):
            return False
        where = self.progress.target.reached
        self.records.scalars(
            done, {"target/steps": done, "target/tokens": where["tokens"], "target/seconds": where["training_seconds"]}
        )
        return True

    def save(self, done: int, results: dict[str, Any]) -> Path | None:
        """Checkpoint step `done` (none while steps are being dropped, unless the session ends here)."""
        run, progress = self.run, self.progress
        last = done == run.total_steps or self.stops.agreed or bool(results.get("target"))
        if (reason := progress.postpone(done, last)) is not None:
            self.log(reason)
            return None
        progress.closing(*results["val"])
        self.records.flush()  # the record up to this step is as durable as the checkpoint
        measured = {k: v for b in self.benchmarks for k, v in b.since_checkpoint().items()}
        self.state.observe(progress.window.tokens_per_s(progress.tokens_per_step))  # a peak measured low: raised
        meta = checkpoint_meta(self.state, progress, self.position, done, self.stats, measured)
        line = progress.line(done, self.stats)
        path = ckpt.save_checkpoint(
            run.run_dir,
            self.state.model,
            self.state.optimizer,
            meta,
            {"model.json": to_dict(run.model_cfg), "train.json": to_dict(self.cfg)},
            keep_last=self.cfg.keep_last_checkpoints,
            files=run.checkpoint_files,
        )
        self.records.checkpoint(done, path.name)
        progress.next_window()
        self.redraw(last)
        if self.is_main:
            self.bar.write(f"{line} | saved {path.name}")
        return path

    def redraw(self, last: bool) -> None:
        """Drawing the charts takes about a second on a CPU: where checkpoints are seconds apart (a small
        run) that would be much of the run. They are redrawn once the time since the last draw is
        charts_pace times what it took, and always at the end (at most ~5% of the wall time)."""
        if self.is_main and (last or time.perf_counter() >= self.charts_due):
            started = time.perf_counter()
            charts.draw_charts(self.run.run_dir, log_y=self.cfg.charts_log_y)
            self.charts_due = time.perf_counter() + self.charts_pace * (time.perf_counter() - started)

    def interrupted(self, done: int) -> int:
        again = (
            f"uv run train.py {self.run.run_dir}"
            if jax.process_count() == 1
            else f"the same command on all {jax.process_count()} processes"
        )
        self.log(f"Interrupted after step {done}/{self.run.total_steps}; checkpoint saved.\nResume with: {again}")
        return 130


def _after_val(_done: int, results: dict[str, Any]) -> bool:
    return "val" in results


def _limits(run: Run) -> Limits:
    cfg = run.train_cfg
    return Limits(
        run.run_dir,
        run.total_steps,
        cfg.tokens_per_step(run.model_cfg),
        cfg.clipping_max_norm,
        cfg.max_dropped_steps,
        cfg.target_val_loss,
    )


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
