"""Draw training charts for a run from its checkpoint metadata.

Usage:
    uv run charts.py runs/<name> [--log-y]

Reads run_dir/checkpoints/<time>-step-<N>/meta.json and run_dir/checkpoints/history/*.json (metadata kept from
pruned checkpoints), and writes run_dir/charts/loss.png (every step's training loss, smoothed,
under the per-checkpoint band, and the validation points), lr.png, grad_norm.png and
throughput.png (tokens/s and MFU per step). From Python:

    from charts import draw_charts, load_history
    paths = draw_charts(Path("runs/demo"), log_y=True)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

# Select the file-only backend before pyplot is imported, so charts work on headless machines.
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Symlinks that point at a real checkpoint folder; reading them would count that checkpoint twice.
_ALIASES = {"latest", "best"}


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
    if not isinstance(train, dict) or not all(_is_number(train.get(k)) for k in ("min", "max", "mean")):
        raise ValueError(f"malformed checkpoint metadata {path}: train_loss={train!r} lacks numeric min/max/mean")
    series = meta.get("series") or {}
    if not isinstance(series, dict):
        raise ValueError(f"malformed checkpoint metadata {path}: series={series!r} is not an object")
    n = len(series.get("step") or [])
    for key, values in series.items():
        # Per-step lists are zipped with series["step"]; a length mismatch would silently misalign the curves.
        if not isinstance(values, list) or len(values) != n:
            raise ValueError(f"malformed checkpoint metadata {path}: series[{key!r}] does not match series['step']")
    return meta


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def _per_step(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Concatenate a per-step series over records, falling back to the checkpoint's own value when absent."""
    points: dict[int, float] = {}
    for rec in records:
        series = rec.get("series") or {}
        values = series.get(key) or []
        if values:
            points.update((s, v) for s, v in zip(series["step"], values) if _is_number(v))
        elif _is_number(rec.get(key)):
            points[rec["step"]] = rec[key]
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def _save(fig: plt.Figure, path: Path) -> None:
    """Write the figure to path atomically, so a viewer or a killed process never sees a half-written PNG."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.stem}-", suffix=".png", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format="png", dpi=100)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def smooth(values: list[float], span: int) -> list[float]:
    """Exponential moving average over `span` steps, bias-corrected so the start is not pulled to 0."""
    alpha, avg, out = 2 / (span + 1), 0.0, []
    for i, v in enumerate(values):
        avg = (1 - alpha) * avg + alpha * v
        out.append(avg / (1 - (1 - alpha) ** (i + 1)))
    return out


def _loss_chart(records: list[dict[str, Any]], title: str, log_y: bool) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [r["step"] for r in records]
    lo, hi = [r["train_loss"]["min"] for r in records], [r["train_loss"]["max"] for r in records]
    ax.fill_between(steps, lo, hi, alpha=0.15, color="tab:blue", label="train min-max per checkpoint")
    per_step, losses = _per_step(records, "loss")
    if per_step:  # every step's loss (meta.json series), raw and lightly smoothed
        ax.plot(per_step, losses, color="tab:blue", alpha=0.3, linewidth=0.6)
        ax.plot(per_step, smooth(losses, max(1, len(losses) // 50)), color="tab:blue", label="train (per step, smoothed)")
    else:
        ax.plot(steps, [r["train_loss"]["mean"] for r in records], marker=".", label="train mean")
    val = [(r["step"], r["val_loss"]) for r in records if _is_number(r.get("val_loss"))]
    if val:
        ax.plot(*zip(*val), marker="o", color="tab:orange", label="validation")
    if log_y:
        ax.set_yscale("log")
    ax.set(title=f"Loss: {title}", xlabel="optimiser step", ylabel="cross-entropy loss")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _throughput_chart(records: list[dict[str, Any]], title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps, rates = _per_step(records, "tokens_per_s")
    ax.plot(steps, rates, color="tab:green", linewidth=0.8, label="tokens/s")
    ax.set(title=f"Throughput: {title}", xlabel="optimiser step", ylabel="tokens / second")
    ax.grid(True, alpha=0.3)
    mfu_steps, mfu = _per_step(records, "mfu")
    if mfu_steps:
        right = ax.twinx()
        right.plot(mfu_steps, [100 * v for v in mfu], color="tab:purple", linewidth=0.8, alpha=0.7, label="MFU")
        right.set_ylabel("MFU (%)")
        right.set_ylim(bottom=0)
        fig.legend(loc="lower right")
    ax.set_ylim(bottom=0)
    return fig


def _lr_chart(records: list[dict[str, Any]], title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*_per_step(records, "learning_rate"))
    ax.set(title=f"Learning rate: {title}", xlabel="optimiser step", ylabel="learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(True, alpha=0.3)
    return fig


def _grad_norm_chart(records: list[dict[str, Any]], title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*_per_step(records, "grad_norm"), linewidth=0.8, label="grad norm (pre-clip)")
    # The latest record holds the clip threshold currently in force (it may change when a run is resumed).
    clip = next((r["clip_max_norm"] for r in reversed(records) if _is_number(r.get("clip_max_norm"))), None)
    if clip is not None and math.isfinite(clip):
        ax.axhline(clip, color="tab:red", linestyle="--", label="clip")
    ax.set(title=f"Gradient norm: {title}", xlabel="optimiser step", ylabel="global L2 norm")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _hellaswag_chart(records: list[dict[str, Any]], title: str) -> plt.Figure:
    points = sorted((h["step"], h["acc"], h["acc_norm"]) for r in records for h in r.get("hellaswag") or []
                    if isinstance(h, dict) and all(_is_number(h.get(k)) for k in ("step", "acc", "acc_norm")))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps, acc, acc_norm = zip(*points)
    ax.plot(steps, acc, marker="o", label="acc")
    ax.plot(steps, acc_norm, marker="o", label="acc_norm")
    ax.axhline(0.25, color="grey", linestyle=":", label="chance")
    ax.set(title=f"HellaSwag: {title}", xlabel="optimiser step", ylabel="accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def draw_charts(run_dir: Path, *, log_y: bool = False) -> list[Path]:
    """Draw loss.png, lr.png, grad_norm.png and throughput.png (and hellaswag.png when meta.json
    has HellaSwag results: train.json hellaswag_interval) into run_dir/charts; their paths."""
    run_dir = Path(run_dir)
    records = load_history(run_dir)
    out = run_dir / "charts"
    out.mkdir(parents=True, exist_ok=True)
    title = run_dir.resolve().name
    figures = {
        "loss.png": lambda: _loss_chart(records, title, log_y),
        "lr.png": lambda: _lr_chart(records, title),
        "grad_norm.png": lambda: _grad_norm_chart(records, title),
        "throughput.png": lambda: _throughput_chart(records, title),
    }
    if any(r.get("hellaswag") for r in records):  # drawn once there are results (train.json hellaswag_interval)
        figures["hellaswag.png"] = lambda: _hellaswag_chart(records, title)
    paths = []
    for name, build in figures.items():
        _save(build(), out / name)
        paths.append(out / name)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw loss, learning-rate and gradient-norm charts for a run.")
    parser.add_argument("run_dir", type=Path, help="run folder, e.g. runs/<name>")
    parser.add_argument("--log-y", action="store_true", help="use a logarithmic loss axis")
    args = parser.parse_args(argv)
    try:
        paths = draw_charts(args.run_dir, log_y=args.log_y)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
