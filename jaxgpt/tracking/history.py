"""A run's record read back: the series the charts draw, and what any tool asks of a run (no JAX).

    record = read_record(Path("runs/demo"))        # runs/demo/metrics.jsonl, the run's one record
    steps, losses = record.series("train/loss")     # every step's value of a tag (metrics.TAGS)
    val_steps, val = record.series("val/loss")      # every validation
    tokens = record.tokens_at(val_steps)            # tokens seen after each of those steps
    record.checkpoints                              # [(step, checkpoint folder name), ...]

The record (written by metrics.py) never holds a step past the checkpoint a run continues from;
where one step has two lines of a kind (a configs line of each session resumed at it), the later
one wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.tracking.metrics import METRICS_FILE, read_metrics


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Record:
    """The lines of one run's metrics.jsonl, in order."""

    path: Path
    lines: tuple[dict[str, Any], ...]

    def series(self, tag: str) -> tuple[list[int], list[float]]:
        """(steps, values) of every line carrying a finite number under `tag`, by step."""
        points = {line["step"]: float(line[tag]) for line in self.lines if is_number(line.get(tag))}
        steps = sorted(points)
        return steps, [points[s] for s in steps]

    def flagged(self, tag: str) -> list[int]:
        """The steps whose 0/1 flag `tag` is 1 (e.g. optim/skipped: the step was dropped)."""
        steps, values = self.series(tag)
        return [s for s, v in zip(steps, values) if v == 1]

    @property
    def checkpoints(self) -> list[tuple[int, str]]:
        """(step, folder name) of every checkpoint the run wrote, pruned ones included."""
        found = {line["step"]: line["checkpoint"] for line in self.lines if isinstance(line.get("checkpoint"), str)}
        return sorted(found.items())

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        """{"model.json": ..., "train.json": ...} of the latest session ({} when none is recorded)."""
        return next((line["configs"] for line in reversed(self.lines) if isinstance(line.get("configs"), dict)), {})

    def windows(self) -> list[tuple[int, int, float, float]]:
        """(first step, last step, min, max) of the microbatch training losses of each checkpoint's
        window: the steps since the previous checkpoint."""
        steps, lows = self.series("train/loss_min")
        highs = dict(zip(*self.series("train/loss_max")))
        out, previous = [], 0
        for step, _name in self.checkpoints:
            inside = [(s, lo) for s, lo in zip(steps, lows) if previous < s <= step and s in highs]
            if inside:
                out.append((inside[0][0], inside[-1][0], min(lo for _, lo in inside), max(highs[s] for s, _ in inside)))
            previous = step
        return out

    def tokens_at(self, steps: list[int]) -> list[float]:
        """Tokens seen after each of `steps`: the train/tokens of that step's line."""
        tokens = dict(zip(*self.series("train/tokens")))
        missing = [s for s in steps if s not in tokens]
        if missing:
            raise ValueError(
                f"{self.path}: no train/tokens at step {missing[0]} (a record written by an "
                f"older train.py): retrain the run to compare it by tokens"
            )
        return [tokens[s] for s in steps]


def read_record(run_dir: Path) -> Record:
    """The run's record; ValueError naming the file when it is missing or malformed."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no such record (is {run_dir} a run directory that has trained?)")
    try:
        lines = read_metrics(path)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"malformed record {path}: {exc}") from None
    for i, line in enumerate(lines, 1):
        if not isinstance(line, dict) or not isinstance(line.get("step"), int) or isinstance(line["step"], bool):
            raise ValueError(f"malformed record {path}: line {i} has no integer step")
    return Record(path, tuple(lines))


def smooth(values: list[float], span: int) -> list[float]:
    """Exponential moving average over `span` steps, bias-corrected so the start is not pulled to 0."""
    alpha, avg, out = 2 / (span + 1), 0.0, []
    for i, v in enumerate(values):
        avg = (1 - alpha) * avg + alpha * v
        out.append(avg / (1 - (1 - alpha) ** (i + 1)))
    return out


def median_window(n: int) -> int:
    """Steps in a running median of n values: about a 25th of them, at least 5 (at most n)."""
    return max(1, min(n, max(5, n // 25)))


def rolling_median(values: list[float], window: int, max_points: int = 1000) -> tuple[list[int], list[float]]:
    """Trailing running median: at step i, the median of the `window` steps up to i (fewer at the
    start), so one slow step (a compile, a validation pause) does not move it and its last point is
    the current rate. Evaluated at up to max_points evenly spread steps. Returns (indices into values,
    medians)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return [], []
    at = np.unique(np.linspace(0, arr.size - 1, min(arr.size, max_points)).round().astype(int))
    return at.tolist(), [float(np.median(arr[max(0, i + 1 - window) : i + 1])) for i in at]


def smoothing_span(n: int) -> int:
    """Steps to smooth over: about a fiftieth of the series, so the shape survives at any length."""
    return max(1, n // 50)
