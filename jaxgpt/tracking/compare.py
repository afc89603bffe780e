"""Several runs on one chart: validation loss against tokens seen (`charts.py ... --compare`).

    uv run charts.py runs/a runs/b --compare compare.png [--log-x] [--log-y] [--target 1.71]

    from jaxgpt.tracking.compare import draw_compare
    draw_compare([Path("runs/a"), Path("runs/b")], Path("compare.png"), target=1.71)

Tokens, not steps, are the common axis: runs with different batches or accumulation see different
tokens per step. Each run gets one colour: its validations (every val/loss of its record,
metrics.jsonl) bold with markers, its smoothed training loss light behind them.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from matplotlib.ticker import EngFormatter, FuncFormatter

from jaxgpt.tracking.figures import FORMATS, legend, plain_log_y, plt, save
from jaxgpt.tracking.history import read_record, smooth, smoothing_span

_TOKENS = EngFormatter(sep="")  # 250k, 1.5M, 10B: a token count read at a glance


@dataclass(frozen=True)
class RunCurves:
    """What the comparison draws of one run: tokens seen -> loss."""

    name: str
    train_tokens: list[float]
    train_loss: list[float]  # smoothed
    val_tokens: list[float]
    val_loss: list[float]


def run_curves(run_dir: Path, name: str) -> RunCurves:
    """The run's validation and smoothed training loss, each against the tokens seen at its step."""
    record = read_record(run_dir)
    steps, losses = record.series("train/loss")
    val_steps, val = record.series("val/loss")
    return RunCurves(
        name=name,
        train_tokens=record.tokens_at(steps),
        train_loss=smooth(losses, smoothing_span(len(losses))),
        val_tokens=record.tokens_at(val_steps),
        val_loss=val,
    )


def _names(run_dirs: list[Path]) -> list[str]:
    """Each run's folder name; the paths as given where two runs share a name."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def first_below(curve: RunCurves, target: float) -> float | None:
    """Tokens at the first validation at or below target, or None if the run never got there."""
    return next((t for t, v in zip(curve.val_tokens, curve.val_loss) if v <= target), None)


def _label(curve: RunCurves, target: float | None) -> str:
    finite = [v for v in curve.val_loss if math.isfinite(v)]
    text = f"{curve.name}: validation" + (f", best {min(finite):.3f}" if finite else "")
    if target is not None:
        reached = first_below(curve, target)
        text += f", {target:g} " + (f"reached at {_TOKENS(reached)} tokens" if reached is not None else "not reached")
    return text


def _log_minor_labels(low: float, high: float) -> FuncFormatter:
    """On a log axis of two decades or less, label the 2s and 5s between the powers of ten (in
    250k-style numbers, as the major ticks are); wider axes keep only the powers of ten readable."""
    narrow = math.log10(high / low) <= 2

    def label(value: float, _pos: int) -> str:
        leading = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        return _TOKENS(value) if narrow and leading in (2, 5) else ""

    return FuncFormatter(label)


def _check_args(out: Path, target: float | None) -> None:
    """Bad arguments fail before any run is read."""
    if out.suffix.lstrip(".").lower() not in FORMATS:
        raise ValueError(
            f"--compare {out}: the chart is written as {', '.join('.' + f for f in FORMATS)}, "
            f"not {out.suffix or 'a file without a suffix'!r}"
        )
    if out.is_dir():
        raise ValueError(f"--compare {out}: is a directory, not a chart file")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise ValueError(f"--target {target}: a target loss is a positive number")


def draw_compare(
    run_dirs: list[Path], out: Path, *, log_x: bool = False, log_y: bool = False, target: float | None = None
) -> Path:
    """Draw each run's validation loss (and, lighter, its smoothed training loss) against tokens
    seen into `out`; the target loss as a line when given. Returns `out`."""
    out = Path(out)
    _check_args(out, target)
    curves = [run_curves(Path(d), name) for d, name in zip(run_dirs, _names(run_dirs))]
    fig = compare_figure(curves, log_x=log_x, log_y=log_y, target=target)
    out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, out)
    return out


def _y_range(ax: plt.Axes, curves: list[RunCurves], target: float | None, log_y: bool) -> None:
    """The validations' range (and the target's): training starts far above them (the untrained
    loss), and letting it set the range would squeeze the curves being compared."""
    val = [v for c in curves for v in c.val_loss if math.isfinite(v)] + ([target] if target is not None else [])
    train = [v for c in curves for v in c.train_loss if math.isfinite(v)]
    if val:
        low, high = min(val + train), max(val)
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(low / 1.05, high * 1.05)
        else:
            pad = 0.05 * (high - low) if high > low else 0.05 * high
            ax.set_ylim(low - pad, high + pad)
    if log_y:
        plain_log_y(ax)


def _x_axis(ax: plt.Axes, curves: list[RunCurves], log_x: bool) -> None:
    """Tokens in 250k-style numbers; on a log axis from just before the first validation (the steps
    before it are the untrained loss, above the y range)."""
    if log_x:
        ax.set_xscale("log")  # before the formatter: the log scale installs its own
    ax.xaxis.set_major_formatter(_TOKENS)
    if not log_x:
        ax.set_xlim(left=0)
        return
    firsts = [c.val_tokens[0] for c in curves if c.val_tokens and c.val_tokens[0] > 0]
    if firsts:
        ax.set_xlim(left=0.8 * min(firsts))
    ax.xaxis.set_minor_formatter(_log_minor_labels(*ax.get_xlim()))


_TITLE_CHARS = 80  # what the 9-inch figure holds in a line of title


def compare_figure(
    curves: list[RunCurves], *, log_x: bool = False, log_y: bool = False, target: float | None = None
) -> plt.Figure:
    """The comparison chart of these runs' curves (draw_compare writes it)."""
    fig, ax = plt.subplots(figsize=(9, 5))
    for i, curve in enumerate(curves):
        color = f"C{i % 10}"
        ax.plot(
            curve.train_tokens,
            curve.train_loss,
            color=color,
            alpha=0.35,
            linewidth=1,
            label=f"{curve.name}: train, smoothed",
        )
        ax.plot(
            curve.val_tokens,
            curve.val_loss,
            color=color,
            marker="o",
            markersize=3.5,
            linewidth=1.8,
            label=_label(curve, target),
        )
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}")
    _y_range(ax, curves, target, log_y)
    _x_axis(ax, curves, log_x)
    # Wrapped: three runs' names already overflow the figure's width on one line.
    title = textwrap.fill(
        "Validation loss against tokens seen: " + " vs ".join(c.name for c in curves),
        width=_TITLE_CHARS,
        break_on_hyphens=False,
    )
    ax.set(title=title, xlabel="tokens seen", ylabel="cross-entropy loss")
    ax.grid(True, which="both", alpha=0.3)
    legend(ax)
    return fig
