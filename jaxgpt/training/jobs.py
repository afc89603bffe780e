"""Periodic work around a training loop as jobs (Levanter's hooks): each job says when it is due; after a
step the loop asks which are due and runs them in order, each given the step and what the jobs before it
found (validation's loss decides the checkpoint, a target reached forces one).

    jobs = [Job("val", validate, every=(100,)), Job("checkpoint", save, every=(250,), when=reached)]
    if any_due(jobs, done, end):
        results = run_jobs(jobs, done, end)        # {"val": ..., "checkpoint": ...}: the jobs that ran
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Job:
    """fn(done, results so far) at the steps it is due: done a multiple of one of `every`, the session's
    last step (`at_end`: the run's end, a target, a stop), or when `when(done, results)` says so."""

    name: str
    fn: Callable[[int, dict[str, Any]], Any]
    every: tuple[int, ...] = ()
    at_end: bool = True
    when: Callable[[int, dict[str, Any]], bool] | None = None

    def due(self, done: int, end: bool, results: dict[str, Any]) -> bool:
        return (
            any(done % n == 0 for n in self.every)
            or (end and self.at_end)
            or (self.when is not None and self.when(done, results))
        )


def any_due(jobs: Sequence[Job], done: int, end: bool) -> bool:
    """Whether a job is due at step `done` before any has run (a `when` sees no results yet)."""
    return any(job.due(done, end, {}) for job in jobs)


def run_jobs(jobs: Sequence[Job], done: int, end: bool) -> dict[str, Any]:
    """Run the jobs due at step `done`, in order; their results by name."""
    results: dict[str, Any] = {}
    for job in jobs:
        if job.due(done, end, results):
            results[job.name] = job.fn(done, results)
    return results
