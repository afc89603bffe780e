"""A run's training charts, drawn from its records: loss, learning rate, gradient norm, throughput, HellaSwag, CORE.

    paths = draw_charts(Path("runs/demo"), log_y=True)    # -> runs/demo/charts/*.png

loss.png (training loss raw and smoothed, each checkpoint window's min-max band, every
validation), lr.png, grad_norm.png (log scale, the clip threshold, dropped steps), throughput.png
(tokens/s and its running median; MFU on the right axis) and, when scored, hellaswag.png and
core.png. The series come from history.py; several runs on one chart: compare.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter, PercentFormatter

from jaxgpt.tracking.figures import SIZE, legend, plain_log_y, plt, save
from jaxgpt.tracking.history import (
    Record,
    is_number,
    median_window,
    read_record,
    rolling_median,
    smooth,
    smoothing_span,
)

__all__ = ["draw_charts", "read_record"]


def _loss_chart(record: Record, title: str, log_y: bool) -> plt.Figure:
    fig, ax = plt.subplots(figsize=SIZE)
    # Each window's band spans the steps it covers (from the previous checkpoint to its own), so
    # the first window's range, which holds the untrained step 1, stays over the first steps.
    for i, (first, last, lo, hi) in enumerate(record.windows()):
        ax.fill_between(
            [first - 1, last],
            [lo, lo],
            [hi, hi],
            color="tab:blue",
            alpha=0.12,
            linewidth=0,
            label="train min-max of each checkpoint window" if i == 0 else None,
        )
    steps, losses = record.series("train/loss")
    if steps:  # every step's loss, raw and smoothed
        span = smoothing_span(len(losses))
        ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=0.6, label="train, each step")
        ax.plot(
            steps,
            smooth(losses, span),
            color="tab:blue",
            linewidth=1.8,
            label=f"train, smoothed ({span}-step EMA)" if span > 1 else "train",
        )
    val = record.series("val/loss")
    if val[0]:
        ax.plot(*val, marker="o", markersize=4, color="tab:orange", linewidth=1.5, label="validation")
    if log_y:
        plain_log_y(ax)
    ax.set(title=f"Loss: {title}", xlabel="optimiser step", ylabel="cross-entropy loss")
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    legend(ax)
    return fig


def _mfu_per_token_rate(record: Record) -> float | None:
    """MFU / (tokens/s) when it is one number over the run (one model, one peak), else None: a run
    resumed on another chip or dtype has a different peak, and one right-axis scale would lie."""
    rates = dict(zip(*record.series("perf/tokens_per_s")))
    ratios = [m / rates[s] for s, m in zip(*record.series("perf/mfu")) if rates.get(s, 0) > 0]
    if ratios and max(ratios) - min(ratios) <= 1e-6 * max(ratios):
        return ratios[0]
    return None


def _rate_lines(ax: plt.Axes, steps: list[int], values: list[float], color: str, unit: str) -> None:
    """Each step faint, its running median bold; the y range set by the bulk of the steps, so one
    spike (a fast read after a slow validation) does not flatten the rest."""
    window = median_window(len(values))
    at, median = rolling_median(values, window)
    top = 1.15 * max(float(np.percentile(values, 99, method="lower")), max(median))
    above = sum(v > top for v in values)
    ax.plot(
        steps,
        values,
        color=color,
        alpha=0.3,
        linewidth=0.7,
        label=f"{unit}, each step" + (f" ({above} above the top of the axis)" if above else ""),
    )
    ax.plot(
        [steps[i] for i in at], median, color=color, linewidth=2, label=f"{unit}, median of the last {window} steps"
    )
    ax.set_ylim(0, top if top > 0 else None)


def _throughput_chart(record: Record, title: str) -> plt.Figure:
    steps, rates = record.series("perf/tokens_per_s")
    mfu_steps, mfu = record.series("perf/mfu")
    ratio = _mfu_per_token_rate(record)
    # tokens/s and MFU are proportional: on twin axes their lines coincide. One line then, with MFU
    # as the right axis' scale; only a run whose peak changed (resumed elsewhere) gets its own panel.
    own_panel = bool(mfu_steps) and ratio is None
    fig, axes = plt.subplots(
        2 if own_panel else 1,
        1,
        sharex=True,
        squeeze=False,
        figsize=(SIZE[0], SIZE[1] * (1.4 if own_panel else 1)),
        gridspec_kw={"height_ratios": [2, 1]} if own_panel else None,
    )
    ax = axes[0][0]
    if steps:
        _rate_lines(ax, steps, rates, "tab:green", "tokens/s")
    ax.set(title=f"Throughput: {title}", ylabel="tokens / second")
    if ratio is not None:
        right = ax.secondary_yaxis("right", functions=(lambda t: 100 * ratio * t, lambda m: m / (100 * ratio)))
        right.set_ylabel("MFU (%)")
    if own_panel:
        low = axes[1][0]
        _rate_lines(low, mfu_steps, [100 * v for v in mfu], "tab:purple", "MFU %")
        low.set(ylabel="MFU (%)", title="MFU (the peak changed during the run)")
        low.grid(True, alpha=0.3)
        legend(low)
    axes[-1][0].set_xlabel("optimiser step")
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    legend(ax)
    return fig


def _lr_chart(record: Record, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=SIZE)
    steps, lrs = record.series("optim/lr")
    if steps:
        ax.plot(steps, lrs, label=f"peak {max(lrs):.3g}, last {lrs[-1]:.3g}")
    ax.set(title=f"Learning rate: {title}", xlabel="optimiser step", ylabel="learning rate")
    # Each tick as a number (0.0015), not an offset printed above the axis (1e-3) to multiply in.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    legend(ax)
    return fig


def _grad_norm_chart(record: Record, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=SIZE)
    steps, norms = record.series("optim/grad_norm")
    if steps:
        window = median_window(len(norms))
        at, median = rolling_median(norms, window)
        ax.plot(steps, norms, color="tab:blue", alpha=0.4, linewidth=0.7, label="pre-clip norm, each step")
        ax.plot(
            [steps[i] for i in at], median, color="tab:blue", linewidth=1.8, label=f"median of the last {window} steps"
        )
    # The latest session's train.json holds the clip threshold in force (it may change on a resume).
    clip = record.configs.get("train.json", {}).get("clipping_max_norm")
    if is_number(clip):
        above = sum(n > clip for n in norms)
        ax.axhline(
            clip, color="tab:red", linestyle="--", label=f"clip at {clip:g}: {above} of {len(norms)} steps above"
        )
    dropped = record.flagged("optim/skipped")
    for i, s in enumerate(dropped):  # no norm for these: their gradient was not finite
        ax.axvline(
            s,
            color="tab:red",
            alpha=0.4,
            linewidth=0.8,
            label=f"dropped step (non-finite gradient): {len(dropped)}" if i == 0 else None,
        )
    if norms and min(norms) > 0:  # log: a spike does not flatten the steps near the threshold
        plain_log_y(ax)  # after the clip line, so its limits include it
    ax.set(title=f"Gradient norm: {title}", xlabel="optimiser step", ylabel="global L2 norm")
    ax.set_xlim(left=0)
    ax.grid(True, which="both", alpha=0.3)
    legend(ax)
    return fig


def _hellaswag_chart(record: Record, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=SIZE)
    steps, acc = record.series("hellaswag/acc")
    acc_norm = record.series("hellaswag/acc_norm")[1]
    ax.plot(steps, acc, marker="o", label="acc (summed ending loss)")
    ax.plot(steps, acc_norm, marker="o", label="acc_norm (mean ending loss)")
    ax.axhline(0.25, color="grey", linestyle=":", label="chance (1 in 4)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set(title=f"HellaSwag: {title}", xlabel="optimiser step", ylabel="accuracy")
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    legend(ax)
    return fig


# nanochat's CORE of OpenAI's GPT-2 124M (docs/core.md): the bar a small model is drawn against.
GPT2_124M_CORE = 0.1139


def _core_tasks(record: Record) -> list[str]:
    """The CORE task tags the record holds (core/<task>), in the order first seen."""
    tags = dict.fromkeys(tag for line in record.lines for tag in line if tag.startswith("core/") and tag != "core/CORE")
    return list(tags)


def _core_chart(record: Record, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=SIZE)
    for tag in _core_tasks(record):  # each task's centred accuracy, faint: CORE is their mean
        ax.plot(*record.series(tag), color="grey", alpha=0.25, linewidth=0.8)
    steps, core = record.series("core/CORE")
    ax.plot(steps, core, marker="o", color="C0", label="CORE (mean centred accuracy)")
    ax.axhline(GPT2_124M_CORE, color="C1", linestyle="--", label=f"GPT-2 124M: {GPT2_124M_CORE}")
    ax.axhline(0.0, color="grey", linestyle=":", label="chance (0)")
    ax.set(title=f"CORE: {title}", xlabel="optimiser step", ylabel="centred accuracy (grey: each task)")
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    legend(ax)
    return fig


def draw_charts(run_dir: Path, *, log_y: bool = False) -> list[Path]:
    """Draw loss.png, lr.png, grad_norm.png and throughput.png (and hellaswag.png / core.png when the
    run scores HellaSwag / CORE: train.json hellaswag_interval / core_interval) into run_dir/charts
    from the run's record (metrics.jsonl); their paths."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    out = run_dir / "charts"
    out.mkdir(parents=True, exist_ok=True)
    title = run_dir.resolve().name
    figures = {
        "loss.png": lambda: _loss_chart(record, title, log_y),
        "lr.png": lambda: _lr_chart(record, title),
        "grad_norm.png": lambda: _grad_norm_chart(record, title),
        "throughput.png": lambda: _throughput_chart(record, title),
    }
    if record.series("hellaswag/acc")[0]:  # drawn once there are results
        figures["hellaswag.png"] = lambda: _hellaswag_chart(record, title)
    if record.series("core/CORE")[0]:
        figures["core.png"] = lambda: _core_chart(record, title)
    paths = []
    for name, build in figures.items():
        save(build(), out / name)
        paths.append(out / name)
    return paths
