"""Tests for charts.py: history loading rules, what each chart draws (its data, its legend), error
cases and the CLI. The data behind the charts: test_run_history.py; --compare: test_charts_compare.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The modules are flat files in the project root; make them importable however pytest is launched.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

import charts  # noqa: E402
from jaxgpt.tracking import charts as drawing  # noqa: E402
from jaxgpt.tracking import history as run_history  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def meta(step: int, *, val: float | None = None, series: bool = True, **extra) -> dict:
    """A meta.json record whose series covers the steps since the previous checkpoint (10 apart)."""
    steps = list(range(step - 9, step + 1))
    record = {
        "step": step,
        "tokens_seen": step * 1024,
        "train_loss": {"min": 5.0 / step, "max": 9.0 / step, "mean": 7.0 / step, "last": 7.0 / step},
        "val_loss": val,
        "learning_rate": 1e-3,
        "grad_norm": 2.0,
        "clip_max_norm": 1.0,
        "series": {
            "step": steps,
            "loss": [7.0 / s for s in steps],
            "learning_rate": [1e-3 * s / step for s in steps],
            # None marks a step whose norm was not recorded; it must be skipped, not crash the plot.
            "grad_norm": [None if s == step - 5 else 0.5 + s / 100 for s in steps],
            "tokens_per_s": [1000.0 + s for s in steps],
            "mfu": [1e-4 * (1000.0 + s) for s in steps],  # one model, one peak: MFU / tokens/s is constant
            "dropped": [s == step - 5 for s in steps],
        }
        if series
        else {},
    }
    record.update(extra)
    return record


def write(path: Path, record: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record if isinstance(record, str) else json.dumps(record), encoding="utf-8")
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run with live checkpoints 20 and 30, a pruned step 10 in history/, aliases and an unfinished save."""
    run = tmp_path / "demo"
    ckpts = run / "checkpoints"
    write(ckpts / "history" / "20240101T000000Z-step-10.json", meta(10, val=0.9))
    # Step 20 was pruned and then live again (e.g. kept as "best"): the live copy must win.
    write(ckpts / "history" / "20240101T000100Z-step-20.json", meta(20, val=123.0))
    write(ckpts / "20240101T000100Z-step-20" / "meta.json", meta(20, val=0.4, series=False))
    last = ckpts / "20240101T000200Z-step-30"
    write(last / "meta.json", meta(30, val=None))
    (ckpts / "latest").symlink_to(last.name)
    # An alias whose target is not a checkpoint folder here: following it would add a step 99.
    write(run / "elsewhere" / "meta.json", meta(99))
    (ckpts / "best").symlink_to(run / "elsewhere")
    # An interrupted save: unreadable on purpose, so reading it would raise.
    write(ckpts / ".tmp-20240101T000300Z-step-40" / "meta.json", "{not json")
    return run


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0.01  # not a blank canvas


def test_load_history_sorts_dedupes_and_skips_aliases(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    assert [r["step"] for r in records] == [10, 20, 30]
    assert [r["val_loss"] for r in records] == [0.9, 0.4, None]


def test_draw_charts_writes_four_valid_pngs(run_dir: Path) -> None:
    paths = drawing.draw_charts(run_dir)
    assert [p.name for p in paths] == ["loss.png", "lr.png", "grad_norm.png", "throughput.png"]
    for path in paths:
        assert path.parent == run_dir / "charts"
        assert_png(path)
    # Atomic writes must not leave temp files behind.
    assert sorted(p.name for p in (run_dir / "charts").iterdir()) == ["grad_norm.png", "loss.png", "lr.png",
                                                                     "throughput.png"]


def legend_inside(fig: plt.Figure, ax: plt.Axes) -> bool:
    """The axes' legend lies within the axes (not over the tick labels), and the figure has no other."""
    fig.canvas.draw()
    box, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
    return (not fig.legends and box.x0 <= legend.x0 and legend.x1 <= box.x1
            and box.y0 <= legend.y0 and legend.y1 <= box.y1)


def trailing_median(values: list[float], i: int, window: int) -> float:
    """The reference: the median of the `window` values up to index i, sorted by hand."""
    part = sorted(values[max(0, i + 1 - window):i + 1])
    mid = len(part) // 2
    return part[mid] if len(part) % 2 else (part[mid - 1] + part[mid]) / 2


def test_loss_chart_bands_span_their_windows(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    fig = drawing._loss_chart(records, "demo", False, run_history.validation(run_dir, records))
    ax = fig.axes[0]
    bands = [band.get_datalim(ax.transData) for band in ax.collections]
    # Each window from the previous checkpoint to its own: step 20 has no series (steps 11-20).
    assert [(b.x0, b.x1) for b in bands] == [(0, 10), (10, 20), (20, 30)]
    assert [v for b in bands for v in (b.y0, b.y1)] == pytest.approx([5 / 10, 9 / 10, 5 / 20, 9 / 20, 5 / 30, 9 / 30])
    raw, smoothed, val = ax.get_lines()
    # Steps 1-10 (history) and 21-30 (step 20's live copy has no series: its band only).
    assert list(raw.get_xdata()) == list(smoothed.get_xdata()) == [*range(1, 11), *range(21, 31)]
    assert list(raw.get_ydata()) == [7.0 / s for s in [*range(1, 11), *range(21, 31)]]
    assert list(smoothed.get_ydata()) == run_history.smooth(list(raw.get_ydata()), 1)  # 20 steps: span 1
    assert list(val.get_xdata()) == [10, 20]  # step 30 has no validation loss
    assert legend_inside(fig, ax)
    plt.close("all")


def test_loss_chart_draws_every_validation_of_metrics_jsonl(run_dir: Path) -> None:
    lines = [{"step": 5, "val/loss": 1.5, "val/tokens": 64}, {"step": 6, "train/loss": 2.0},
             {"step": 15, "val/loss": 0.6, "val/tokens": 64}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = drawing.load_history(run_dir)
    fig = drawing._loss_chart(records, "demo", False, run_history.validation(run_dir, records))
    val = fig.axes[0].get_lines()[-1]
    assert list(val.get_xdata()) == [5, 10, 15, 20] and list(val.get_ydata()) == [1.5, 0.9, 0.6, 0.4]
    plt.close("all")


def test_throughput_draws_one_line_and_its_median_with_mfu_as_the_scale(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    fig = drawing._throughput_chart(records, "demo")
    assert len(fig.axes) == 1  # no twin axes: MFU is a second scale, not a second line
    ax = fig.axes[0]
    rate, median = ax.get_lines()
    steps = [*range(1, 11), *range(21, 31)]
    assert list(rate.get_xdata()) == steps and list(rate.get_ydata()) == [1000.0 + s for s in steps]
    rates = [1000.0 + s for s in steps]
    window = run_history.median_window(len(rates))
    assert list(median.get_xdata()) == steps  # under 1000 steps: a median at every step
    assert list(median.get_ydata()) == [trailing_median(rates, i, window) for i in range(len(rates))]
    (mfu_scale,) = ax.child_axes
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert low == 0 and mfu_scale.get_ylabel() == "MFU (%)"
    assert mfu_scale.get_ylim() == pytest.approx((0, 100 * 1e-4 * high))  # meta: mfu = 1e-4 x tokens/s
    assert legend_inside(fig, ax)
    plt.close("all")


def test_throughput_axis_is_set_by_the_bulk_not_a_spike(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    records[0]["series"]["tokens_per_s"][3] = 1e6  # one fast read after a slow one
    records[0]["series"]["mfu"][3] = 1e-4 * 1e6
    fig = drawing._throughput_chart(records, "demo")
    ax = fig.axes[0]
    rate, median = ax.get_lines()
    assert 1e6 in list(rate.get_ydata())  # drawn, but above the top
    assert 1030 < ax.get_ylim()[1] < 2000 and "1 above the top of the axis" in rate.get_label()
    assert max(median.get_ydata()) < 1100
    plt.close("all")


def test_throughput_of_a_run_whose_peak_changed_draws_mfu_on_its_own_panel(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    records[-1]["series"]["mfu"] = [2 * v for v in records[-1]["series"]["mfu"]]  # resumed on a slower chip
    fig = drawing._throughput_chart(records, "demo")
    top, low = fig.axes
    assert not top.child_axes  # no single MFU scale could be right
    mfu = low.get_lines()[0]
    want = [100 * 1e-4 * (1000 + s) for s in range(1, 11)] + [200 * 1e-4 * (1000 + s) for s in range(21, 31)]
    assert list(mfu.get_ydata()) == pytest.approx(want)
    assert legend_inside(fig, top) and legend_inside(fig, low)
    plt.close("all")


def test_grad_norm_chart_is_log_scaled_with_clip_count_and_dropped_steps(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    fig = drawing._grad_norm_chart(records, "demo")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    steps, norms = run_history.per_step(records, "grad_norm")
    raw, median, clip, *dropped = ax.get_lines()
    assert list(raw.get_xdata()) == steps and list(raw.get_ydata()) == norms
    assert list(clip.get_ydata()) == [1.0, 1.0]
    above = sum(n > 1.0 for n in norms)  # step 20's own value, 2.0
    assert above == 1 and clip.get_label() == f"clip at 1: 1 of {len(norms)} steps above"
    assert [line.get_xdata()[0] for line in dropped] == [5, 25]  # the series' dropped steps
    assert legend_inside(fig, ax)
    plt.close("all")


def test_hellaswag_chart(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    records[0]["hellaswag"] = [{"step": 10, "acc": 0.26, "acc_norm": 0.27}]
    records[2]["hellaswag"] = [{"step": 30, "acc": 0.3, "acc_norm": 0.32}]
    fig = drawing._hellaswag_chart(records, "demo")
    ax = fig.axes[0]
    acc, acc_norm, chance = ax.get_lines()
    assert list(acc.get_xdata()) == [10, 30] and list(acc.get_ydata()) == [0.26, 0.3]
    assert list(acc_norm.get_ydata()) == [0.27, 0.32] and list(chance.get_ydata()) == [0.25, 0.25]
    assert legend_inside(fig, ax)
    plt.close("all")

def test_per_step_series_with_fallback_and_none(run_dir: Path) -> None:
    records = drawing.load_history(run_dir)
    steps, lrs = run_history.per_step(records, "learning_rate")
    # Step 20 has no series, so its per-checkpoint value stands in for those ten steps.
    assert steps == list(range(1, 11)) + [20] + list(range(21, 31))
    assert lrs[10] == 1e-3
    steps, norms = run_history.per_step(records, "grad_norm")
    assert 5 not in steps and 25 not in steps and None not in norms


def test_log_y_changes_loss_chart_only(run_dir: Path) -> None:
    linear = {p.name: p.read_bytes() for p in drawing.draw_charts(run_dir)}
    log = {p.name: p.read_bytes() for p in drawing.draw_charts(run_dir, log_y=True)}
    assert log["loss.png"] != linear["loss.png"]
    assert log["lr.png"] == linear["lr.png"]


def test_no_checkpoints_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no checkpoints folder") as missing:
        drawing.load_history(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(missing.value) and "\n" not in str(missing.value)
    (tmp_path / "empty" / "checkpoints" / ".tmp-x").mkdir(parents=True)
    with pytest.raises(ValueError, match="no checkpoints with meta.json") as empty:
        drawing.draw_charts(tmp_path / "empty")
    assert "\n" not in str(empty.value)
    assert not (tmp_path / "empty" / "charts").exists()


@pytest.mark.parametrize(
    "content",
    ["{truncated", "[1, 2]", json.dumps({"step": "7", "train_loss": {"min": 1, "max": 2, "mean": 1.5}})],
)
def test_malformed_meta_names_the_file(run_dir: Path, content: str) -> None:
    bad = write(run_dir / "checkpoints" / "20240101T000300Z-step-40" / "meta.json", content)
    with pytest.raises(ValueError, match="malformed checkpoint metadata") as err:
        drawing.load_history(run_dir)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_mismatched_series_lengths_are_rejected(run_dir: Path) -> None:
    record = meta(40)
    record["series"]["grad_norm"].pop()
    bad = write(run_dir / "checkpoints" / "history" / "x-step-40.json", record)
    with pytest.raises(ValueError, match="grad_norm") as err:
        drawing.load_history(run_dir)
    assert str(bad) in str(err.value)


def test_single_checkpoint_without_series_or_clip(tmp_path: Path) -> None:
    run = tmp_path / "tiny"
    record = meta(1, series=False, clip_max_norm=None)
    del record["series"]
    write(run / "checkpoints" / "t-step-1" / "meta.json", record)
    for path in drawing.draw_charts(run, log_y=True):
        assert_png(path)


def test_main_return_codes(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert charts.main([str(run_dir), "--log-y"]) == 0
    out = capsys.readouterr().out
    assert str(run_dir / "charts" / "loss.png") in out
    assert_png(run_dir / "charts" / "grad_norm.png")

    assert charts.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "missing") in err

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
