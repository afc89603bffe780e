"""Tests for charts.py: what each chart draws from a run's record (metrics.jsonl: its data line by
line, its legend), error cases as one-line errors naming the file, and the CLI. The record's own
rules (torn lines, last line wins, windows, tokens): test_run_history.py; --compare:
test_charts_compare.py.

The fixtures write metrics.jsonl as jaxgpt.tracking.metrics.RunLog writes it (`scalars` and
`event` below; test_run_history.py checks they write the same lines as the real RunLog)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

# The modules are flat files in the project root; make them importable however pytest is launched.
sys.path.insert(0, str(ROOT))

import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

import charts  # noqa: E402
from jaxgpt.tracking import charts as drawing  # noqa: E402
from jaxgpt.tracking import history as run_history  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_767_225_600.0  # the fixtures' clock: each line's "time" is T0 + its step, no wall clock read


# ----------------------------------------------------------------------------- writing a record


def scalars(step: int, values: dict[str, float | None]) -> dict:
    """The line RunLog.scalars writes: step, time, then the values, a non-finite one as null."""
    finite = {k: v if v is None or math.isfinite(v) else None for k, v in values.items()}
    return {"step": step, "time": T0 + step} | finite


def event(step: int, **fields) -> dict:
    """The line RunLog.event writes (RunLog.configs: configs=..., RunLog.checkpoint: checkpoint=...)."""
    return {"step": step, "time": T0 + step, **fields}


def configs(step: int, clip: float | None = 1.0, **train) -> dict:
    """The configs line a session starting at `step` writes."""
    return event(
        step,
        configs={
            "model.json": {"architecture": "gpt2", "emb_dim": 16},
            "train.json": {"clipping_max_norm": clip, "train_steps": 30} | train,
        },
    )


def checkpoint(step: int) -> dict:
    return event(step, checkpoint=f"20260101T{step:06d}Z-step-{step}")


def train_step(
    step: int,
    loss: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    tokens: float,
    lr: float = 1e-3,
    grad_norm: float | None = 0.5,
    clip: float = 1.0,
    dropped: bool = False,
    tokens_per_s: float = 1000.0,
    mfu: float = 0.1,
) -> dict:
    """The per-step line the loop writes (progress.Progress.record) (grad_norm None: the step was dropped)."""
    return scalars(
        step,
        {
            "train/loss": loss,
            "train/loss_min": loss if lo is None else lo,
            "train/loss_max": loss if hi is None else hi,
            "train/tokens": tokens,
            "optim/lr": lr,
            "optim/grad_norm": grad_norm,
            "optim/clipped": float(grad_norm is not None and grad_norm > clip),
            "optim/skipped": float(dropped),
            "perf/step_time_s": tokens / step / tokens_per_s,
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": mfu,
        },
    )


def validation(step: int, loss: float | None) -> dict:
    return scalars(step, {"val/loss": float("nan") if loss is None else loss, "val/tokens": 64})


def hellaswag(step: int, acc: float, acc_norm: float) -> dict:
    return scalars(step, {"hellaswag/acc": acc, "hellaswag/acc_norm": acc_norm})


def core(step: int, score: float, **tasks: float) -> dict:
    return scalars(step, {"core/CORE": score, **{f"core/{task}": value for task, value in tasks.items()}})


def write_record(run: Path, lines: list[dict], tail: str | bytes = "") -> Path:
    """runs/<name>/metrics.jsonl holding these lines (and `tail`, e.g. a line torn by a kill)."""
    run.mkdir(parents=True, exist_ok=True)
    path = run / "metrics.jsonl"
    data = "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines).encode()
    path.write_bytes(data + (tail.encode() if isinstance(tail, str) else tail))
    return path


# ----------------------------------------------------------------------------- the demo run
# Two sessions: steps 1-20 (checkpoints 10 and 20), then resumed at 20 for steps 21-30
# (checkpoint 30). Step s: loss 7/s (microbatches 5/s to 9/s), 1024 tokens a step, 1000 + s
# tokens/s at MFU 1e-4 x tokens/s (one model, one peak). Steps 5 and 25 were dropped (no norm);
# step 25's loss was not finite too (null); step 20's norm, 2.0, is the one above the clip (1.0).
# Validations at 5, 10, 15, 20 and 30 (step 30's not finite: null).

DROPPED = (5, 25)
VALS = {5: 1.5, 10: 0.9, 15: 0.6, 20: 0.4, 30: None}
LOSS_STEPS = [s for s in range(1, 31) if s != 25]
NORM_STEPS = [s for s in range(1, 31) if s not in DROPPED]


def lr_at(step: int) -> float:
    return 1e-3 * min(step / 10, (40 - step) / 30)  # warm-up to step 10, then decay


def norm_at(step: int) -> float | None:
    return None if step in DROPPED else 2.0 if step == 20 else 0.5 + step / 100


def demo_step(step: int, mfu_scale: float = 1e-4, tokens_per_s: float | None = None) -> dict:
    nan = float("nan")
    loss, lo, hi = (nan, nan, nan) if step == 25 else (7.0 / step, 5.0 / step, 9.0 / step)
    rate = 1000.0 + step if tokens_per_s is None else tokens_per_s
    return train_step(
        step,
        loss,
        lo=lo,
        hi=hi,
        tokens=step * 1024,
        lr=lr_at(step),
        grad_norm=norm_at(step),
        dropped=step in DROPPED,
        tokens_per_s=rate,
        mfu=mfu_scale * rate,
    )


def demo_lines(
    *,
    second_clip: float = 1.0,
    second_mfu: float = 1e-4,
    extra: dict[int, list[dict]] | None = None,
    rates: dict[int, float] | None = None,
) -> list[dict]:
    """The demo run's record, line by line as the trainer writes it: a step's line, then (at an
    evaluation) its HellaSwag and validation lines, then its checkpoint's."""
    extra, rates = extra or {}, rates or {}
    lines = [configs(0)]
    for s in range(1, 31):
        if s == 21:
            lines.append(configs(20, clip=second_clip))  # the resumed session
        lines.append(demo_step(s, 1e-4 if s <= 20 else second_mfu, rates.get(s)))
        lines += extra.get(s, [])
        if s in VALS:
            lines.append(validation(s, VALS[s]))
        if s % 10 == 0:
            lines.append(checkpoint(s))
    return lines


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "demo"
    write_record(run, demo_lines())
    return run


def record_of(run: Path) -> run_history.Record:
    return run_history.read_record(run)


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0.01  # not a blank canvas


def legend_inside(fig: plt.Figure, ax: plt.Axes) -> bool:
    """The axes' legend lies within the axes (not over the tick labels), and the figure has no other."""
    fig.canvas.draw()
    box, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
    return (
        not fig.legends and box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0 and legend.y1 <= box.y1
    )


def legend_texts(ax: plt.Axes) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def trailing_median(values: list[float], i: int, window: int) -> float:
    """The reference: the median of the `window` values up to index i, sorted by hand."""
    part = sorted(values[max(0, i + 1 - window) : i + 1])
    mid = len(part) // 2
    return part[mid] if len(part) % 2 else (part[mid - 1] + part[mid]) / 2


# ----------------------------------------------------------------------------- draw_charts


def test_draw_charts_writes_four_valid_pngs(run_dir: Path) -> None:
    paths = drawing.draw_charts(run_dir)
    assert [p.name for p in paths] == ["loss.png", "lr.png", "grad_norm.png", "throughput.png"]
    for path in paths:
        assert path.parent == run_dir / "charts"
        assert_png(path)
    # Atomic writes must not leave temp files behind; no HellaSwag chart for a run without scores.
    assert sorted(p.name for p in (run_dir / "charts").iterdir()) == [
        "grad_norm.png",
        "loss.png",
        "lr.png",
        "throughput.png",
    ]


def test_draw_charts_adds_hellaswag_png_once_the_run_has_scores(tmp_path: Path) -> None:
    run = tmp_path / "scored"
    write_record(run, demo_lines(extra={10: [hellaswag(10, 0.26, 0.27)]}))
    paths = drawing.draw_charts(run)
    assert [p.name for p in paths] == ["loss.png", "lr.png", "grad_norm.png", "throughput.png", "hellaswag.png"]
    assert_png(run / "charts" / "hellaswag.png")


# ----------------------------------------------------------------------------- loss.png


def test_loss_chart_bands_span_their_windows(run_dir: Path) -> None:
    fig = drawing._loss_chart(record_of(run_dir), "demo", False)
    ax = fig.axes[0]
    bands = [band.get_datalim(ax.transData) for band in ax.collections]
    # Each window from the previous checkpoint to its own, the first one from step 0.
    assert [(b.x0, b.x1) for b in bands] == [(0, 10), (10, 20), (20, 30)]
    # The lowest microbatch loss of the window (its last step's) to the highest (its first's);
    # step 25 (null) is in no band.
    assert [v for b in bands for v in (b.y0, b.y1)] == pytest.approx([5 / 10, 9 / 1, 5 / 20, 9 / 11, 5 / 30, 9 / 21])
    raw, smoothed, val = ax.get_lines()
    assert list(raw.get_xdata()) == list(smoothed.get_xdata()) == LOSS_STEPS  # step 25's null skipped
    assert list(raw.get_ydata()) == [7.0 / s for s in LOSS_STEPS]
    assert list(smoothed.get_ydata()) == run_history.smooth(list(raw.get_ydata()), 1)  # 29 steps: span 1
    # Every validation of the record, checkpoint or not; step 30's was not finite.
    assert list(val.get_xdata()) == [5, 10, 15, 20] and list(val.get_ydata()) == [1.5, 0.9, 0.6, 0.4]
    # One legend entry for the bands, "train" for an unsmoothed line.
    assert legend_texts(ax) == ["train min-max of each checkpoint window", "train, each step", "train", "validation"]
    assert ax.get_yscale() == "linear" and ax.get_xlim()[0] == 0
    assert ax.get_title() == "Loss: demo"
    assert legend_inside(fig, ax)
    plt.close("all")


def test_loss_chart_smooths_a_long_run_and_bands_only_checkpointed_steps(tmp_path: Path) -> None:
    # 160 steps: a 3-step EMA; checkpoints at 50 and 100; steps 101-160 (still training) in no band.
    losses = [4.0 + (s % 7) / 10 for s in range(1, 161)]
    lines = [configs(0)]
    for s, loss in zip(range(1, 161), losses):
        lines.append(train_step(s, loss, lo=loss - 0.5, hi=loss + 0.5, tokens=64 * s))
        if s in (50, 100):
            lines.append(checkpoint(s))
    write_record(tmp_path / "long", lines)
    fig = drawing._loss_chart(record_of(tmp_path / "long"), "long", False)
    ax = fig.axes[0]
    assert [(b.x0, b.x1) for b in (c.get_datalim(ax.transData) for c in ax.collections)] == [(0, 50), (50, 100)]
    raw, smoothed = ax.get_lines()  # no validation line: the record has none
    assert list(raw.get_xdata()) == list(range(1, 161)) and list(raw.get_ydata()) == losses
    assert run_history.smoothing_span(160) == 3
    assert list(smoothed.get_ydata()) == run_history.smooth(losses, 3) != losses
    assert smoothed.get_label() == "train, smoothed (3-step EMA)"
    assert legend_texts(ax) == [
        "train min-max of each checkpoint window",
        "train, each step",
        "train, smoothed (3-step EMA)",
    ]
    plt.close("all")


def test_log_y_changes_loss_chart_only(run_dir: Path) -> None:
    linear = {p.name: p.read_bytes() for p in drawing.draw_charts(run_dir)}
    log = {p.name: p.read_bytes() for p in drawing.draw_charts(run_dir, log_y=True)}
    assert log["loss.png"] != linear["loss.png"]
    assert all(log[name] == linear[name] for name in ("lr.png", "grad_norm.png", "throughput.png"))
    record = record_of(run_dir)
    assert drawing._loss_chart(record, "demo", True).axes[0].get_yscale() == "log"
    assert drawing._loss_chart(record, "demo", False).axes[0].get_yscale() == "linear"
    plt.close("all")


# ----------------------------------------------------------------------------- throughput.png


def test_throughput_draws_one_line_and_its_median_with_mfu_as_the_scale(run_dir: Path) -> None:
    record = record_of(run_dir)
    assert drawing._mfu_per_token_rate(record) == pytest.approx(1e-4)
    fig = drawing._throughput_chart(record, "demo")
    assert len(fig.axes) == 1  # no twin axes: MFU is a second scale, not a second line
    ax = fig.axes[0]
    rate, median = ax.get_lines()
    steps = list(range(1, 31))  # every step, dropped ones included: they took time too
    rates = [1000.0 + s for s in steps]
    assert list(rate.get_xdata()) == steps and list(rate.get_ydata()) == rates
    window = run_history.median_window(len(rates))
    assert list(median.get_xdata()) == steps  # under 1000 steps: a median at every step
    assert list(median.get_ydata()) == [trailing_median(rates, i, window) for i in range(len(rates))]
    assert legend_texts(ax) == ["tokens/s, each step", f"tokens/s, median of the last {window} steps"]
    (mfu_scale,) = ax.child_axes
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert low == 0 and mfu_scale.get_ylabel() == "MFU (%)"
    assert mfu_scale.get_ylim() == pytest.approx((0, 100 * 1e-4 * high))  # the record: mfu = 1e-4 x tokens/s
    assert legend_inside(fig, ax)
    plt.close("all")


def test_throughput_axis_is_set_by_the_bulk_not_a_spike(tmp_path: Path) -> None:
    write_record(tmp_path / "spiky", demo_lines(rates={4: 1e6}))  # one fast read after a slow one
    fig = drawing._throughput_chart(record_of(tmp_path / "spiky"), "spiky")
    assert len(fig.axes) == 1  # the spike's MFU is 1e-4 x its rate too: still one scale
    ax = fig.axes[0]
    rate, median = ax.get_lines()
    assert 1e6 in list(rate.get_ydata())  # drawn, but above the top
    assert 1030 < ax.get_ylim()[1] < 2000 and "1 above the top of the axis" in rate.get_label()
    assert max(median.get_ydata()) < 1100
    plt.close("all")


def test_throughput_of_a_run_whose_peak_changed_draws_mfu_on_its_own_panel(tmp_path: Path) -> None:
    write_record(tmp_path / "moved", demo_lines(second_mfu=2e-4))  # resumed at 20 on a slower chip
    record = record_of(tmp_path / "moved")
    assert drawing._mfu_per_token_rate(record) is None
    fig = drawing._throughput_chart(record, "moved")
    top, low = fig.axes
    assert not top.child_axes  # no single MFU scale could be right
    assert [line.get_ydata()[0] for line in top.get_lines()] == [1001.0, 1001.0]  # tokens/s stays on top
    mfu, mfu_median = low.get_lines()
    want = [100 * 1e-4 * (1000 + s) for s in range(1, 21)] + [100 * 2e-4 * (1000 + s) for s in range(21, 31)]
    assert list(mfu.get_xdata()) == list(range(1, 31)) and list(mfu.get_ydata()) == pytest.approx(want)
    window = run_history.median_window(30)
    assert list(mfu_median.get_ydata()) == pytest.approx([trailing_median(want, i, window) for i in range(30)])
    assert low.get_title() == "MFU (the peak changed during the run)" and low.get_ylabel() == "MFU (%)"
    assert legend_inside(fig, top) and legend_inside(fig, low)
    plt.close("all")


# ----------------------------------------------------------------------------- lr.png


def test_lr_chart_draws_every_step_with_its_peak_and_last(run_dir: Path) -> None:
    fig = drawing._lr_chart(record_of(run_dir), "demo")
    ax = fig.axes[0]
    (lr,) = ax.get_lines()
    assert list(lr.get_xdata()) == list(range(1, 31))  # a dropped step still had its rate
    assert list(lr.get_ydata()) == [lr_at(s) for s in range(1, 31)]
    assert lr.get_label() == f"peak 0.001, last {lr_at(30):.3g}" == "peak 0.001, last 0.000333"
    assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0
    assert ax.yaxis.get_major_formatter()(0.0015, 0) == "0.0015"  # a number, not an offset
    assert legend_inside(fig, ax)
    plt.close("all")


# ----------------------------------------------------------------------------- grad_norm.png


def test_grad_norm_chart_is_log_scaled_with_clip_count_and_dropped_steps(run_dir: Path) -> None:
    fig = drawing._grad_norm_chart(record_of(run_dir), "demo")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    norms = [norm_at(s) for s in NORM_STEPS]
    raw, median, clip, *dropped = ax.get_lines()
    assert list(raw.get_xdata()) == NORM_STEPS and list(raw.get_ydata()) == norms  # null norms skipped
    window = run_history.median_window(len(norms))
    assert list(median.get_xdata()) == NORM_STEPS
    assert list(median.get_ydata()) == [trailing_median(norms, i, window) for i in range(len(norms))]
    assert list(clip.get_ydata()) == [1.0, 1.0]
    # Step 20's 2.0 alone is above the clip.
    assert clip.get_label() == f"clip at 1: 1 of {len(norms)} steps above" == "clip at 1: 1 of 28 steps above"
    assert [line.get_xdata()[0] for line in dropped] == list(DROPPED)  # optim/skipped
    assert legend_texts(ax) == [
        "pre-clip norm, each step",
        f"median of the last {window} steps",
        "clip at 1: 1 of 28 steps above",
        "dropped step (non-finite gradient): 2",
    ]
    assert legend_inside(fig, ax)
    plt.close("all")


def test_the_latest_configs_line_gives_the_clip_threshold(tmp_path: Path) -> None:
    write_record(tmp_path / "reclipped", demo_lines(second_clip=0.6))  # resumed with clipping_max_norm 0.6
    fig = drawing._grad_norm_chart(record_of(tmp_path / "reclipped"), "reclipped")
    clip = fig.axes[0].get_lines()[2]
    above = [s for s in NORM_STEPS if norm_at(s) > 0.6]  # 0.5 + s/100 > 0.6 from step 11 on
    assert len(above) == 19
    assert list(clip.get_ydata()) == [0.6, 0.6] and clip.get_label() == "clip at 0.6: 19 of 28 steps above"
    plt.close("all")


@pytest.mark.parametrize("head", [[], [configs(0, clip=None)]], ids=["no configs line", "clipping off"])
def test_grad_norm_chart_without_a_clip_threshold_has_no_clip_line(tmp_path: Path, head: list[dict]) -> None:
    lines = head + [train_step(s, 3.0, tokens=64 * s, grad_norm=0.1 * s) for s in range(1, 6)]
    lines.append(train_step(6, 3.0, tokens=64 * 6, grad_norm=None, dropped=True))
    write_record(tmp_path / "noclip", lines)
    fig = drawing._grad_norm_chart(record_of(tmp_path / "noclip"), "noclip")
    ax = fig.axes[0]
    raw, median, dropped = ax.get_lines()  # each step, its median, step 6's drop: no clip line
    assert list(raw.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5]) and list(dropped.get_xdata()) == [6, 6]
    assert not any(label.startswith("clip") for label in legend_texts(ax))
    plt.close("all")


def test_the_clip_line_is_inside_the_log_axis(tmp_path: Path) -> None:
    # Every norm far below the threshold: the axis still reaches up to the clip line.
    write_record(
        tmp_path / "low",
        [configs(0, clip=1.0)] + [train_step(s, 3.0, tokens=64 * s, grad_norm=0.01 * s) for s in range(1, 6)],
    )
    fig = drawing._grad_norm_chart(record_of(tmp_path / "low"), "low")
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and low <= 0.01 and high >= 1.0
    assert ax.get_lines()[2].get_label() == "clip at 1: 0 of 5 steps above"
    plt.close("all")


# ----------------------------------------------------------------------------- hellaswag.png


def test_hellaswag_chart(tmp_path: Path) -> None:
    scores = {10: [hellaswag(10, 0.26, 0.27)], 30: [hellaswag(30, 0.3, 0.32)]}
    write_record(tmp_path / "scored", demo_lines(extra=scores))
    fig = drawing._hellaswag_chart(record_of(tmp_path / "scored"), "scored")
    ax = fig.axes[0]
    acc, acc_norm, chance = ax.get_lines()
    assert list(acc.get_xdata()) == [10, 30] and list(acc.get_ydata()) == [0.26, 0.3]
    assert list(acc_norm.get_xdata()) == [10, 30] and list(acc_norm.get_ydata()) == [0.27, 0.32]
    assert list(chance.get_ydata()) == [0.25, 0.25]
    assert legend_texts(ax) == ["acc (summed ending loss)", "acc_norm (mean ending loss)", "chance (1 in 4)"]
    assert ax.yaxis.get_major_formatter()(0.25, 0).startswith("25")  # a percentage of 1
    assert ax.yaxis.get_major_formatter()(0.25, 0).endswith("%")
    assert legend_inside(fig, ax)
    plt.close("all")


# ----------------------------------------------------------------------------- core.png


def test_draw_charts_adds_core_png_once_the_run_has_scores(tmp_path: Path) -> None:
    run = tmp_path / "scored"
    write_record(run, demo_lines(extra={10: [core(10, 0.02, copa=0.1, piqa=-0.06)]}))
    paths = drawing.draw_charts(run)
    assert [p.name for p in paths] == ["loss.png", "lr.png", "grad_norm.png", "throughput.png", "core.png"]
    assert_png(run / "charts" / "core.png")


def test_core_chart(tmp_path: Path) -> None:
    scores = {10: [core(10, 0.02, copa=0.1, piqa=-0.06)], 30: [core(30, 0.05, copa=0.12, piqa=-0.02)]}
    write_record(tmp_path / "scored", demo_lines(extra=scores))
    fig = drawing._core_chart(record_of(tmp_path / "scored"), "scored")
    ax = fig.axes[0]
    copa, piqa, score, gpt2, chance = ax.get_lines()
    assert list(copa.get_xdata()) == [10, 30] and list(copa.get_ydata()) == [0.1, 0.12]
    assert list(piqa.get_ydata()) == [-0.06, -0.02]
    assert list(score.get_xdata()) == [10, 30] and list(score.get_ydata()) == [0.02, 0.05]
    assert list(gpt2.get_ydata()) == [0.1139, 0.1139] and list(chance.get_ydata()) == [0.0, 0.0]
    assert legend_texts(ax) == ["CORE (mean centred accuracy)", "GPT-2 124M: 0.1139", "chance (0)"]
    assert legend_inside(fig, ax)
    plt.close("all")


# ----------------------------------------------------------------------------- small and broken records


@pytest.mark.parametrize(
    "lines",
    [
        [configs(0)],  # a session that wrote its configs and was stopped before its first step
        [configs(0), train_step(1, 5.5, tokens=64, grad_norm=None, dropped=True)],  # one step, dropped
        [train_step(1, 5.5, lo=5.0, hi=6.0, tokens=64), checkpoint(1)],  # one step, no configs line
    ],
    ids=["no steps", "one dropped step", "one step"],
)
def test_a_tiny_record_still_draws_every_chart(tmp_path: Path, lines: list[dict]) -> None:
    write_record(tmp_path / "tiny", lines)
    for path in drawing.draw_charts(tmp_path / "tiny", log_y=True):
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_a_torn_last_line_is_not_drawn(run_dir: Path) -> None:
    # A kill -9 mid-write: the last line has no newline (even if its JSON happens to parse).
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(validation(31, 0.1)))
    fig = drawing._loss_chart(record_of(run_dir), "demo", False)
    assert list(fig.axes[0].get_lines()[-1].get_xdata()) == [5, 10, 15, 20]
    plt.close("all")
    assert len(drawing.draw_charts(run_dir)) == 4


def test_no_record_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such record") as missing:
        drawing.draw_charts(tmp_path / "nope")
    assert str(tmp_path / "nope" / "metrics.jsonl") in str(missing.value) and "\n" not in str(missing.value)
    (tmp_path / "untrained").mkdir()
    (tmp_path / "untrained" / "train.json").write_text("{}")
    with pytest.raises(ValueError, match="no such record") as untrained:
        drawing.draw_charts(tmp_path / "untrained")
    assert str(tmp_path / "untrained" / "metrics.jsonl") in str(untrained.value) and "\n" not in str(untrained.value)
    assert not (tmp_path / "untrained" / "charts").exists() and not (tmp_path / "nope").exists()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{broken\n", "malformed record"),
        (b"[1, 2]\n", "line 3 has no integer step"),
        (b'{"step": "7", "train/loss": 1.0}\n', "line 3 has no integer step"),
        (b'{"step": true, "train/loss": 1.0}\n', "line 3 has no integer step"),
        (b'{"time": 1.0, "train/loss": 1.0}\n', "line 3 has no integer step"),
        (b'{"step": 7, "train/loss": "\xff"}\n', "malformed record"),  # not UTF-8
    ],
    ids=["not json", "not an object", "string step", "bool step", "no step", "not utf-8"],
)
def test_a_malformed_line_is_a_one_line_error_naming_the_file(tmp_path: Path, bad: bytes, message: str) -> None:
    path = write_record(
        tmp_path / "bad",
        [configs(0), train_step(1, 5.0, tokens=64)],
        tail=bad + (json.dumps(train_step(2, 4.0, tokens=128)) + "\n").encode(),
    )
    with pytest.raises(ValueError, match=message) as err:
        drawing.draw_charts(tmp_path / "bad")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "bad" / "charts").exists()


# ----------------------------------------------------------------------------- the CLI


def test_main_return_codes(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert charts.main([str(run_dir), "--log-y"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        str(run_dir / "charts" / name) for name in ("loss.png", "lr.png", "grad_norm.png", "throughput.png")
    ]
    assert_png(run_dir / "charts" / "grad_norm.png")

    assert charts.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "missing") in err

    bad = write_record(tmp_path / "bad", [configs(0)], tail="{broken\n" + json.dumps(configs(1)) + "\n")
    assert charts.main([str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: malformed record ") and err.count("\n") == 1 and str(bad) in err

    with pytest.raises(SystemExit) as help_exit:
        charts.main(["--help"])
    assert help_exit.value.code == 0
    assert "--log-y" in capsys.readouterr().out


def test_script_entry_point(tmp_path: Path) -> None:
    script = Path(charts.__file__)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "missing")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and str(tmp_path / "missing") in result.stderr
