"""Tests for run_history.py: the series the charts draw, each against numbers worked out by hand."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from jaxgpt.tracking import history as rh


def record(step: int, tokens_per_step: int, *, series: bool = True, val: float | None = None) -> dict:
    """A meta.json record whose window is the 10 steps up to `step` (as the trainer writes it:
    tokens_seen = step x the tokens per step of the session that saved it)."""
    steps = list(range(step - 9, step + 1))
    return {"step": step, "tokens_seen": step * tokens_per_step, "val_loss": val,
            "train_loss": {"min": 1.0, "max": 3.0, "mean": 2.0},
            "series": {"step": steps, "loss": [1.0 / s for s in steps],
                       "dropped": [s == step - 2 for s in steps]} if series else {}}


def test_tokens_are_summed_window_by_window() -> None:
    # Steps 1-10 at 100 tokens a step, then a session at 200 (whose tokens_seen is step x 200).
    records = [record(10, 100), record(20, 200), record(30, 200)]
    got = rh.tokens_at(records, [0, 5, 10, 15, 20, 25, 30, 35])
    assert got == [0, 500, 1000, 2000, 3000, 4000, 5000, 6000]  # 35: past the last checkpoint, at 200
    same = [record(10, 64), record(20, 64)]
    assert rh.tokens_at(same, [1, 7, 20]) == [64, 7 * 64, 20 * 64]


def test_tokens_without_tokens_seen_is_a_one_line_error() -> None:
    old = record(10, 100)
    del old["tokens_seen"]
    with pytest.raises(ValueError, match="runs/old: the meta.json of step 10 has no tokens_seen") as err:
        rh.tokens_at([old], [10], "runs/old")
    assert "\n" not in str(err.value)


def test_validation_merges_checkpoints_and_every_metrics_line(tmp_path: Path) -> None:
    records = [record(10, 1, val=2.0), record(20, 1, val=1.5)]
    lines = [{"step": 5, "time": 1.0, "train/loss": 3.0}, {"step": 5, "val/loss": 2.5, "val/tokens": 9},
             {"step": 10, "val/loss": 2.0, "val/tokens": 9}, {"step": 15, "val/loss": None, "val/tokens": 9},
             {"step": 25, "val/loss": 1.2, "val/tokens": 9}]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 30, "val/lo')  # torn by a kill: skipped
    # Step 15's loss was not finite (null); 25 is past the last checkpoint (a run not yet resumed).
    assert rh.validation(tmp_path, records) == ([5, 10, 20, 25], [2.5, 2.0, 1.5, 1.2])
    (tmp_path / "metrics.jsonl").unlink()
    assert rh.validation(tmp_path, records) == ([10, 20], [2.0, 1.5])  # a run without metrics.jsonl


def test_a_malformed_metrics_line_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{broken\n{"step": 2}\n')
    with pytest.raises(ValueError, match="malformed metrics log") as err:
        rh.validation(tmp_path, [record(10, 1)])
    assert str(tmp_path / "metrics.jsonl") in str(err.value) and "\n" not in str(err.value)


def test_windows_and_flagged_steps() -> None:
    records = [record(10, 1), record(20, 1, series=False), record(30, 1)]
    assert rh.windows(records) == [(1, 10, 1.0, 3.0), (11, 20, 1.0, 3.0), (21, 30, 1.0, 3.0)]
    assert rh.flagged_steps(records, "dropped") == [8, 28]
    assert rh.flagged_steps(records, "absent") == []


def test_rolling_median_is_the_trailing_median() -> None:
    values = [25.0, 7000, 7100, 6900, 60000, 7050, 6950, 7000, 7020]  # a compile, then a fast read
    at, got = rh.rolling_median(values, 5)
    assert at == list(range(len(values)))
    assert got == [statistics.median(values[max(0, i - 4):i + 1]) for i in range(len(values))]
    assert 6900 <= min(got[2:]) and max(got) < 7200  # neither the compile nor the spike shows
    assert rh.rolling_median([], 5) == ([], [])


def test_rolling_median_of_a_long_run_is_evaluated_at_bounded_points() -> None:
    values = [float(i % 7) for i in range(100_000)]
    at, got = rh.rolling_median(values, 4001, max_points=500)
    assert len(at) == 500 and at[0] == 0 and at[-1] == len(values) - 1
    assert got[-1] == statistics.median(values[-4001:]) and got[0] == 0.0
    assert rh.median_window(10) == 5 and rh.median_window(3) == 3 and rh.median_window(1000) == 40


def test_smoothing_is_a_bias_corrected_moving_average() -> None:
    assert rh.smooth([3.0, 3.0, 3.0], span=5) == pytest.approx([3.0, 3.0, 3.0])  # no pull towards 0
    assert rh.smooth([1.0, 2.0, 3.0], span=1) == [1.0, 2.0, 3.0]  # span 1: the raw values
    out = rh.smooth([0.0] * 10 + [1.0] * 10, span=4)
    assert out[9] == 0.0 and 0.3 < out[10] < 0.5 and 0.99 < out[-1] < 1.0
    assert rh.smoothing_span(49) == 1 and rh.smoothing_span(600) == 12


def test_tokens_seen_must_be_a_count(tmp_path: Path) -> None:
    bad = record(10, 1)
    bad["tokens_seen"] = "many"
    path = tmp_path / "checkpoints" / "t-step-10" / "meta.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="tokens_seen='many' is not a count") as err:
        rh.load_history(tmp_path)
    assert str(path) in str(err.value)
