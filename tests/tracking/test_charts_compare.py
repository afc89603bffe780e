"""Tests for jaxgpt/tracking/compare.py and `charts.py ... --compare`: what the chart draws from each
run's record (tokens, not steps, on x; every validation; one colour per run; the target), its
errors (a record without train/tokens among them), and two real runs trained here."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import matplotlib.pyplot as plt
import pytest
from conftest import SLOW, write_run
from test_charts import (
    assert_png,
    checkpoint,
    configs,
    legend_inside,
    legend_texts,
    train_step,
    validation,
    write_record,
)

import charts
import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.tracking import charts as drawing
from jaxgpt.tracking import compare as cc
from jaxgpt.tracking import history as rh
from jaxgpt.tracking import metrics


def fake_run(
    root: Path, name: str, tokens_per_step: int, vals: dict[int, float | None], *, tokens: bool = True
) -> Path:
    """A run whose record has steps 1 to the last validation (loss 10 / step, tokens_per_step a
    step), its validations and a checkpoint every 10 steps, as RunLog writes them. tokens=False:
    a record written before train/tokens existed."""
    lines = [configs(0)]
    for step in range(1, max(vals) + 1):
        line = train_step(step, 10.0 / step, tokens=step * tokens_per_step)
        lines.append(line if tokens else {k: v for k, v in line.items() if k != "train/tokens"})
        if step in vals:
            lines.append(validation(step, vals[step]))
        if step % 10 == 0:
            lines.append(checkpoint(step))
    write_record(root / name, lines)
    return root / name


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # "small" sees 100 tokens a step, "big" 300: at equal steps big is 3x further along the x axis.
    return [
        fake_run(tmp_path, "small", 100, {5: 3.0, 10: 2.5, 15: 2.2, 20: 2.0}),
        fake_run(tmp_path, "big", 300, {5: 2.8, 10: 2.1, 15: 1.9, 20: 1.8}),
    ]


def test_each_run_is_drawn_against_its_tokens_in_one_colour(runs: list[Path]) -> None:
    curves = [cc.run_curves(run, run.name) for run in runs]
    fig = cc.compare_figure(curves, target=1.95)
    ax = fig.axes[0]
    small_train, small_val, big_train, big_val, target = ax.get_lines()
    assert list(small_val.get_xdata()) == [500, 1000, 1500, 2000]  # every validation, x = tokens
    assert list(big_val.get_xdata()) == [1500, 3000, 4500, 6000]
    assert list(small_val.get_ydata()) == [3.0, 2.5, 2.2, 2.0] and list(big_val.get_ydata()) == [2.8, 2.1, 1.9, 1.8]
    assert list(small_train.get_xdata()) == [100.0 * s for s in range(1, 21)]
    assert list(small_train.get_ydata()) == rh.smooth([10.0 / s for s in range(1, 21)], 1)
    colour = [matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines()]
    assert colour[0] == colour[1] != colour[2] == colour[3]
    assert small_train.get_alpha() < 1 and small_val.get_alpha() is None  # training drawn lighter
    assert list(target.get_ydata()) == [1.95, 1.95] and target.get_label() == "target 1.95"
    # big first reached 1.95 at its step 15 validation (4,500 tokens); small never did.
    assert big_val.get_label() == "big: validation, best 1.800, 1.95 reached at 4.5k tokens"
    assert small_val.get_label() == "small: validation, best 2.000, 1.95 not reached"
    low, high = ax.get_ylim()
    assert low < 1.8 and 3.0 < high < 3.5  # the validations' range, not the untrained 10.0
    assert ax.get_xscale() == "linear" and legend_inside(fig, ax)
    fig = cc.compare_figure(curves, log_x=True, log_y=True)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    assert fig.axes[0].get_xlim()[0] == pytest.approx(0.8 * 500)  # from just before the first validation
    plt.close("all")


def test_the_title_of_three_long_run_names_stays_inside_the_figure(tmp_path: Path) -> None:
    names = ["shakespeare-char", "shakespeare-char-modern", "shakespeare-char-2026"]
    curves = [cc.run_curves(fake_run(tmp_path, n, 100, {5: 3.0, 10: 2.5}), n) for n in names]
    fig = cc.compare_figure(curves)
    fig.canvas.draw()
    title = fig.axes[0].title
    box = title.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox)  # one line of it overflowed
    assert title.get_text().replace("\n", " ") == "Validation loss against tokens seen: " + " vs ".join(names)
    plt.close("all")


def test_draw_compare_writes_the_file_and_names_runs_that_share_a_name(runs: list[Path], tmp_path: Path) -> None:
    twin = fake_run(tmp_path / "elsewhere", "small", 50, {10: 2.0})
    out = cc.draw_compare([*runs, twin], tmp_path / "out" / "compare.png", target=2.0)
    assert out == tmp_path / "out" / "compare.png"
    assert_png(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.png"]  # no temp file left
    assert cc._names([runs[0], twin, runs[1]]) == [str(runs[0]), str(twin), "big"]


@pytest.mark.parametrize(
    ("out", "target", "message"),
    [
        ("compare.txt", None, "not '.txt'"),
        ("compare", None, "not 'a file without a suffix'"),
        ("compare.png", float("nan"), "--target nan: a target loss is a positive number"),
        ("compare.png", -1.0, "--target -1.0"),
    ],
)
def test_bad_arguments_fail_before_any_run_is_read(
    tmp_path: Path, out: str, target: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")) as err:
        cc.draw_compare([tmp_path / "not-a-run"], tmp_path / out, target=target)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


def test_cli_compare(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.svg"
    assert charts.main([*map(str, runs), "--compare", str(out), "--log-x", "--target", "2"]) == 0
    assert capsys.readouterr().out == f"{out}\n" and out.read_text().startswith("<?xml")
    assert charts.main([str(runs[0]), str(tmp_path / "missing"), "--compare", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "missing") in err
    with pytest.raises(SystemExit) as usage:
        charts.main([str(runs[0]), "--target", "2"])  # --target means nothing without --compare
    assert usage.value.code == 2 and "--compare" in capsys.readouterr().err
    # Without --compare, several runs each get their own charts.
    assert charts.main([*map(str, runs)]) == 0
    assert all((run / "charts" / "loss.png").is_file() for run in runs)


def test_run_curves_are_the_records_losses_against_its_tokens(tmp_path: Path) -> None:
    # Step 10's validation was not finite (null): no point; step 7's is not a checkpoint: drawn.
    run = fake_run(tmp_path, "gaps", 50, {7: 2.5, 10: None, 14: 2.0})
    curve = cc.run_curves(run, "gaps")
    assert curve.name == "gaps"
    assert (curve.val_tokens, curve.val_loss) == ([350.0, 700.0], [2.5, 2.0])
    assert curve.train_tokens == [50.0 * s for s in range(1, 15)]
    assert curve.train_loss == rh.smooth([10.0 / s for s in range(1, 15)], rh.smoothing_span(14))
    assert cc.first_below(curve, 2.2) == 700.0 and cc.first_below(curve, 1.0) is None


def test_a_record_without_train_tokens_cannot_be_compared(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = fake_run(tmp_path, "old", 100, {5: 3.0, 10: 2.5}, tokens=False)
    with pytest.raises(ValueError, match="no train/tokens at step 1") as err:
        cc.run_curves(old, "old")
    assert str(old / "metrics.jsonl") in str(err.value) and "\n" not in str(err.value)
    out = tmp_path / "out" / "c.png"
    with pytest.raises(ValueError, match="no train/tokens"):
        cc.draw_compare([runs[0], old], out)
    assert not out.exists()  # nothing half drawn
    assert charts.main([str(runs[0]), str(old), "--compare", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert str(old / "metrics.jsonl") in captured.err and "no train/tokens at step 1" in captured.err
    # Its own charts are by step: they draw.
    assert charts.main([str(old)]) == 0 and (old / "charts" / "loss.png").is_file()


def test_a_malformed_record_fails_the_comparison_naming_the_file(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = runs[1] / "metrics.jsonl"
    path.write_text(path.read_text().replace('"step": 7,', '"step": "7",', 1))
    out = tmp_path / "c.png"
    assert charts.main([*map(str, runs), "--compare", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: malformed record {path}: line ") and err.count("\n") == 1
    assert not out.exists()


# ----------------------------------------------------------------------------- two real runs

MODEL = {"architecture": "a-to-a", "vocab_size": 257, "context_length": 32, "emb_dim": 16}
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "targets": "same",
    "train_steps": 8,
    "learning_rate": 0.02,
    "weight_decay": 0.0,
    "checkpoint_interval": 4,
    "validation_interval": 2,
    "validation_batches": 1,
    "keep_last_checkpoints": 1,
}


@SLOW  # two trainings end to end
def test_two_real_runs_on_one_chart(tmp_path: Path, data_root: Path) -> None:
    """Two trained runs with different tokens per step (4 x 32 and 2 x 2 x 16 = 128 vs 64): every
    validation of the record lands at step x tokens per step; the loss chart's bands span the
    checkpoint windows, the pruned checkpoint's included; the grad-norm chart clips at train.json's."""
    settings = {
        "narrow": {"microbatch_size": 4},
        "accum": {"microbatch_size": 2, "gradient_accumulation_steps": 2, "sequence_length": 16},
    }
    runs = []
    for name, extra in settings.items():
        run = write_run(tmp_path / name, MODEL, TRAIN | extra)
        assert train.main([str(run), "--data-dir", str(data_root)]) == 0
        runs.append(run)
    per_step = {"narrow": 4 * 32, "accum": 2 * 2 * 16}
    out = cc.draw_compare(runs, tmp_path / "compare.png", log_x=True)
    assert_png(out)
    curves = [cc.run_curves(run, run.name) for run in runs]
    for curve in curves:
        validations = [
            line["step"] for line in metrics.read_metrics(tmp_path / curve.name / "metrics.jsonl") if "val/loss" in line
        ]
        assert validations == [2, 4, 6, 8]  # 2 and 6 were not checkpoints
        assert curve.val_tokens == [s * per_step[curve.name] for s in validations]
        assert curve.train_tokens == [s * per_step[curve.name] for s in range(1, 9)]
    for run in runs:
        record = rh.read_record(run)
        steps, losses = record.series("train/loss")
        lows, highs = record.series("train/loss_min")[1], record.series("train/loss_max")[1]
        assert steps == list(range(1, 9)) and all(lo <= v <= hi for lo, v, hi in zip(lows, losses, highs))
        # keep_last 1: step 4's checkpoint was pruned (step 8 is the latest and the best), but the
        # record keeps its line and so its window: bands over steps 0-4 and 4-8.
        on_disk = [p.name for p in cf.list_checkpoints(run)]
        assert [s for s, _ in record.checkpoints] == [4, 8] and on_disk == [record.checkpoints[1][1]]
        assert [(first, last) for first, last, *_ in record.windows()] == [(1, 4), (5, 8)]
        assert record.configs["train.json"]["clipping_max_norm"] == 1.0  # the default, as the run resolved it
        fig = drawing._loss_chart(record, run.name, False)
        ax = fig.axes[0]
        assert [(b.x0, b.x1) for b in (c.get_datalim(ax.transData) for c in ax.collections)] == [(0, 4), (4, 8)]
        raw, _smoothed, val = ax.get_lines()
        assert list(raw.get_xdata()) == list(range(1, 9)) and list(val.get_xdata()) == [2, 4, 6, 8]
        fig = drawing._grad_norm_chart(record, run.name)
        norms = record.series("optim/grad_norm")[1]
        assert len(norms) == 8 and any(
            label.startswith(f"clip at 1: {sum(n > 1 for n in norms)} of 8 steps")
            for label in legend_texts(fig.axes[0])
        )
        plt.close("all")
        assert sorted(p.name for p in (run / "charts").iterdir()) == [
            "grad_norm.png",
            "loss.png",
            "lr.png",
            "throughput.png",
        ]  # drawn by train.py
