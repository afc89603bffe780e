"""What a run has recorded, as the series the charts draw (no plotting here, no JAX).

    records = load_history(Path("runs/demo"))      # one meta.json per checkpoint step, sorted
    steps, losses = per_step(records, "loss")      # every step's value from the meta series
    val_steps, val = validation(run_dir, records)  # every validation (metrics.jsonl + meta.json)
    tokens = tokens_at(records, steps)             # tokens seen after each of those steps

A run's checkpoints are run_dir/checkpoints/<time>-step-<N>/meta.json, and the meta.json of pruned
ones is kept in run_dir/checkpoints/history/*.json. Each meta.json holds the per-step series of its
window (the steps since the previous checkpoint). run_dir/metrics.jsonl (metrics.py) has a line for
every step and every validation, including validations that were not checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.tracking.metrics import METRICS_FILE, read_metrics

# Symlinks that point at a real checkpoint folder; reading them would count that checkpoint twice.
_ALIASES = {"latest", "best"}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_meta(path: Path) -> dict[str, Any]:
    """Parse one meta.json and check the fields the charts need, naming the file on any problem."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed checkpoint metadata {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"malformed checkpoint metadata {path}: expected a JSON object, got {type(meta).__name__}")
    step, train = meta.get("step"), meta.get("train_loss")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"malformed checkpoint metadata {path}: step={step!r} is not an integer")
    if not isinstance(train, dict) or not all(is_number(train.get(k)) for k in ("min", "max", "mean")):
        raise ValueError(f"malformed checkpoint metadata {path}: train_loss={train!r} lacks numeric min/max/mean")
    tokens = meta.get("tokens_seen")
    if tokens is not None and not (is_number(tokens) and tokens >= 0):
        raise ValueError(f"malformed checkpoint metadata {path}: tokens_seen={tokens!r} is not a count")
    series = meta.get("series") or {}
    if not isinstance(series, dict):
        raise ValueError(f"malformed checkpoint metadata {path}: series={series!r} is not an object")
    n = len(series.get("step") or [])
    for key, values in series.items():
        # Per-step lists are zipped with series["step"]; a length mismatch would silently misalign the curves.
        if not isinstance(values, list) or len(values) != n:
            raise ValueError(f"malformed checkpoint metadata {path}: series[{key!r}] does not match series['step']")
    return meta


def load_history(run_dir: Path) -> list[dict[str, Any]]:
    """Return the run's checkpoint meta records, one per step, sorted by step.

    Live checkpoints win over history/ copies of the same step, since history only keeps pruned ones.
    Raises ValueError when the run has no readable checkpoints or a meta file is malformed.
    """
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    if not root.is_dir():
        raise ValueError(f"no checkpoints folder at {root} (is {run_dir} a run directory?)")
    by_step: dict[int, dict[str, Any]] = {}
    history = root / "history"
    if history.is_dir():
        for path in sorted(history.glob("*.json")):
            meta = _read_meta(path)
            by_step[meta["step"]] = meta
    for ckpt in sorted(root.iterdir()):
        # Dot folders are checkpoints still being written (".tmp-..."), aliases duplicate real folders,
        # "corrupt-..." ones were found damaged on resume and set aside (their steps were trained again).
        if (ckpt.name.startswith((".", "corrupt-")) or ckpt.name in _ALIASES or ckpt.is_symlink()
                or ckpt == history):
            continue
        meta_path = ckpt / "meta.json"
        if ckpt.is_dir() and meta_path.is_file():
            meta = _read_meta(meta_path)
            by_step[meta["step"]] = meta
    if not by_step:
        raise ValueError(f"no checkpoints with meta.json under {root}")
    return [by_step[step] for step in sorted(by_step)]


def per_step(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Concatenate a per-step series over records, falling back to the checkpoint's own value when absent."""
    points: dict[int, float] = {}
    for rec in records:
        series = rec.get("series") or {}
        values = series.get(key) or []
        if values:
            points.update((s, v) for s, v in zip(series["step"], values) if is_number(v))
        elif is_number(rec.get(key)):
            points[rec["step"]] = rec[key]
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def flagged_steps(records: list[dict[str, Any]], key: str) -> list[int]:
    """The steps whose per-step flag (a series of booleans, e.g. "dropped") is true."""
    steps = set()
    for rec in records:
        series = rec.get("series") or {}
        steps.update(s for s, flag in zip(series.get("step") or [], series.get(key) or []) if flag is True)
    return sorted(steps)


def windows(records: list[dict[str, Any]]) -> list[tuple[int, int, float, float]]:
    """(first step, last step, min, max) of each checkpoint's training-loss window: the steps its
    meta series lists, or, without a series, the steps since the previous checkpoint."""
    out, previous = [], 0
    for rec in records:
        steps = (rec.get("series") or {}).get("step") or []
        first, last = (steps[0], steps[-1]) if steps else (previous + 1, rec["step"])
        out.append((first, last, rec["train_loss"]["min"], rec["train_loss"]["max"]))
        previous = rec["step"]
    return out


def validation(run_dir: Path, records: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Every validation loss of the run by step: checkpoints' val_loss, and metrics.jsonl's val/loss
    lines, which also hold the validations between checkpoints (validation_interval)."""
    points = {r["step"]: r["val_loss"] for r in records if is_number(r.get("val_loss"))}
    path = Path(run_dir) / METRICS_FILE
    if path.is_file():
        try:
            lines = read_metrics(path)
        except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"malformed metrics log {path}: {exc}") from None
        for line in lines:
            # A non-finite loss is written as null (metrics.py); a line without val/loss is a step's.
            if isinstance(line, dict) and is_number(line.get("step")) and is_number(line.get("val/loss")):
                points[int(line["step"])] = line["val/loss"]
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def tokens_at(records: list[dict[str, Any]], steps: list[int], where: str = "run") -> list[float]:
    """Tokens seen after each step. A checkpoint's tokens_seen / step is the tokens per step of the
    session that trained its window (the batch cannot change on resume, but a resumed session
    recomputes tokens_seen from its own batch), so tokens are summed window by window; steps past
    the last checkpoint continue at its rate."""
    ends, totals, total, previous = [0], [0.0], 0.0, 0
    for rec in records:
        if not is_number(rec.get("tokens_seen")) or rec["step"] <= 0:
            raise ValueError(f"{where}: the meta.json of step {rec['step']} has no tokens_seen, so its "
                             f"tokens cannot be counted")
        rate = rec["tokens_seen"] / rec["step"]
        total += (rec["step"] - previous) * rate
        ends.append(rec["step"])
        totals.append(total)
        previous = rec["step"]
    last_rate = records[-1]["tokens_seen"] / records[-1]["step"]
    out = np.interp(steps, ends, totals)  # exact: the count is linear in the step within a window
    beyond = np.asarray(steps, dtype=float) > ends[-1]
    out[beyond] = totals[-1] + (np.asarray(steps, dtype=float)[beyond] - ends[-1]) * last_rate
    return out.tolist()


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
    start). Unlike a mean, one slow step (a compile, a validation pause) or one fast read does not
    move it; trailing, like the EMA of the loss, so its last point is the current rate. Evaluated
    at up to max_points evenly spread steps (a chart is under a thousand pixels wide), so a long
    run costs max_points medians. Returns (indices into values, medians)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return [], []
    at = np.unique(np.linspace(0, arr.size - 1, min(arr.size, max_points)).round().astype(int))
    return at.tolist(), [float(np.median(arr[max(0, i + 1 - window):i + 1])) for i in at]


def smoothing_span(n: int) -> int:
    """Steps to smooth over: about a fiftieth of the series, so the shape survives at any length."""
    return max(1, n // 50)

