"""Tests for charts_compare.py and `charts.py ... --compare`: what the chart draws (tokens, not
steps, on x; every validation; one colour per run; the target), its errors, and two real runs."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.colors
import matplotlib.pyplot as plt
import pytest
from conftest import write_run
from test_charts import assert_png, legend_inside

import charts
import train
from jaxgpt.tracking import charts as drawing
from jaxgpt.tracking import compare as cc
from jaxgpt.tracking import history as rh
from jaxgpt.tracking import metrics


def meta(step: int, tokens_per_step: int, val: float) -> dict:
    """A checkpoint whose window is the 10 steps up to `step`, each with loss 10 / step."""
    steps = list(range(step - 9, step + 1))
    return {"step": step, "tokens_seen": step * tokens_per_step, "val_loss": val,
            "train_loss": {"min": 1.0, "max": 3.0, "mean": 2.0},
            "series": {"step": steps, "loss": [10.0 / s for s in steps]}}


def fake_run(root: Path, name: str, tokens_per_step: int, vals: dict[int, float]) -> Path:
    """A run dir with checkpoints every 10 steps and metrics.jsonl validations every 5."""
    run = root / name
    for step in range(10, max(vals) + 1, 10):
        path = run / "checkpoints" / f"20260101T0000{step:02d}Z-step-{step}" / "meta.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(meta(step, tokens_per_step, vals[step])))
    lines = [{"step": s, "val/loss": v, "val/tokens": 100} for s, v in sorted(vals.items())]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # "small" sees 100 tokens a step, "big" 300: at equal steps big is 3x further along the x axis.
    return [fake_run(tmp_path, "small", 100, {5: 3.0, 10: 2.5, 15: 2.2, 20: 2.0}),
            fake_run(tmp_path, "big", 300, {5: 2.8, 10: 2.1, 15: 1.9, 20: 1.8})]


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


def test_draw_compare_writes_the_file_and_names_runs_that_share_a_name(runs: list[Path], tmp_path: Path) -> None:
    twin = fake_run(tmp_path / "elsewhere", "small", 50, {10: 2.0})
    out = cc.draw_compare([*runs, twin], tmp_path / "out" / "compare.png", target=2.0)
    assert out == tmp_path / "out" / "compare.png"
    assert_png(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.png"]  # no temp file left
    assert cc._names([runs[0], twin, runs[1]]) == [str(runs[0]), str(twin), "big"]


@pytest.mark.parametrize(("out", "target", "message"), [
    ("compare.txt", None, "not '.txt'"), ("compare", None, "not 'a file without a suffix'"),
    ("compare.png", float("nan"), "--target nan: a target loss is a positive number"),
    ("compare.png", -1.0, "--target -1.0"),
])
def test_bad_arguments_fail_before_any_run_is_read(tmp_path: Path, out: str, target: float | None, message: str) -> None:
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


# ----------------------------------------------------------------------------- two real runs

MODEL = {"architecture": "a-to-a", "vocab_size": 257, "context_length": 32, "emb_dim": 16}
TRAIN = {"dataset": {"source": "builtin"}, "tokenizer": "bytes", "targets": "same", "train_steps": 8,
         "learning_rate": 0.02, "weight_decay": 0.0, "checkpoint_interval": 4, "validation_interval": 2,
         "validation_batches": 1, "keep_last_checkpoints": 1}


def test_two_real_runs_on_one_chart(tmp_path: Path, data_root: Path) -> None:
    """Two trained runs with different tokens per step (4 x 32 and 2 x 2 x 16 = 128 vs 64): every
    validation of metrics.jsonl lands at step x tokens per step; the per-run bands span the windows."""
    settings = {"narrow": {"microbatch_size": 4}, "accum": {"microbatch_size": 2, "gradient_accumulation_steps": 2,
                                                            "sequence_length": 16}}
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
        validations = [line["step"] for line in metrics.read_metrics(tmp_path / curve.name / "metrics.jsonl")
                       if "val/loss" in line]
        assert validations == [2, 4, 6, 8]  # 2 and 6 were not checkpoints
        assert curve.val_tokens == [s * per_step[curve.name] for s in validations]
        assert curve.train_tokens == [s * per_step[curve.name] for s in range(1, 9)]
    for run in runs:  # keep_last 1: step 4's meta lives on in history/, its band over steps 0-4
        records = rh.load_history(run)
        fig = drawing._loss_chart(records, run.name, False, rh.validation(run, records))
        ax = fig.axes[0]
        assert [(b.x0, b.x1) for b in (c.get_datalim(ax.transData) for c in ax.collections)] == [(0, 4), (4, 8)]
        assert list(ax.get_lines()[-1].get_xdata()) == [2, 4, 6, 8]
        plt.close("all")
