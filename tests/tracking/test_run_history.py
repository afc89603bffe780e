"""Tests for history.py: a run's record (metrics.jsonl) read back, and the series the charts draw,
each against numbers worked out by hand. The record's rules: a torn last line is skipped, a
malformed one elsewhere is an error naming the file, the last line wins per step, checkpoint lines
give the windows (pruned checkpoints' included), the latest configs line is the session's, and a
record without train/tokens cannot be compared by tokens. The lines are written as RunLog writes
them (test_charts' helpers, checked here against the real RunLog)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from test_charts import checkpoint, configs, event, scalars, train_step, validation, write_record

from jaxgpt.tracking import history as rh
from jaxgpt.tracking import metrics


def read(tmp_path: Path, lines: list[dict], tail: str | bytes = "") -> rh.Record:
    write_record(tmp_path, lines, tail)
    return rh.read_record(tmp_path)


# ----------------------------------------------------------------------------- reading the file


def test_the_helpers_write_the_lines_the_real_runlog_writes(tmp_path: Path) -> None:
    """One session through RunLog itself, and the same through test_charts' helpers: the same lines
    (but for the time), so the fixtures of the chart tests are records the trainer could write."""
    cfgs = {"model.json": {"emb_dim": 16}, "train.json": {"clipping_max_norm": 1.0}}
    step = {
        "train/loss": 3.0,
        "train/loss_min": 2.5,
        "train/loss_max": 3.5,
        "train/tokens": 64.0,
        "optim/lr": 1e-3,
        "optim/grad_norm": None,
        "optim/clipped": 0.0,
        "optim/skipped": 1.0,
        "perf/step_time_s": 0.5,
        "perf/tokens_per_s": 128.0,
        "perf/mfu": 0.25,
    }
    (tmp_path / "real").mkdir()  # a run directory (its model.json and train.json) is there first
    log = metrics.RunLog(tmp_path / "real", 0, enabled=True)
    log.configs(0, cfgs)
    log.scalars(1, step)
    log.scalars(1, {"val/loss": float("inf"), "val/tokens": 64})
    log.scalars(1, {"hellaswag/acc": 0.25, "hellaswag/acc_norm": 0.5})
    log.checkpoint(1, "20260101T000000Z-step-1")
    log.close()
    real = metrics.read_metrics(tmp_path / "real" / "metrics.jsonl")
    ours = [
        configs(0) | {"configs": cfgs},
        train_step(1, 3.0, lo=2.5, hi=3.5, tokens=64.0, grad_norm=None, dropped=True, tokens_per_s=128.0, mfu=0.25),
        validation(1, None),
        scalars(1, {"hellaswag/acc": 0.25, "hellaswag/acc_norm": 0.5}),
        event(1, checkpoint="20260101T000000Z-step-1"),
    ]
    untimed = [[{k: v for k, v in line.items() if k != "time"} for line in lines] for lines in (real, ours)]
    assert untimed[0] == untimed[1]
    assert all(isinstance(line["time"], float) for line in real)
    assert list(real[1]) == list(ours[1])  # step, time, then the values: the same keys in the same order


def test_the_real_runlog_round_trip_through_a_resume_and_a_kill(tmp_path: Path) -> None:
    """What RunLog writes, read back: session 1 trains 1-4 (checkpoint 2) and is killed mid-line;
    session 2 resumes from 2 (the record is cut back to it) with another clip threshold."""
    run = tmp_path / "run"
    run.mkdir()
    first = metrics.RunLog(run, 0, enabled=True)
    first.configs(0, {"train.json": {"clipping_max_norm": 1.0}})
    for s in range(1, 5):
        first.scalars(
            s,
            {
                "train/loss": 10.0 - s,
                "train/loss_min": 9.0 - s,
                "train/loss_max": 11.0 - s,
                "train/tokens": 32.0 * s,
                "optim/grad_norm": None if s == 3 else 0.5 * s,
                "optim/skipped": float(s == 3),
            },
        )
        if s == 2:
            first.scalars(2, {"val/loss": float("nan"), "val/tokens": 32})
            first.checkpoint(2, "c2")
    first.close()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "train/lo')  # the kill
    assert [line["step"] for line in rh.read_record(run).lines] == [0, 1, 2, 2, 2, 3, 4]  # the torn one skipped
    second = metrics.RunLog(run, 2, enabled=True)
    second.configs(2, {"train.json": {"clipping_max_norm": 0.5}})
    for s in (3, 4):
        second.scalars(
            s,
            {
                "train/loss": 20.0 - s,
                "train/loss_min": 19.0 - s,
                "train/loss_max": 21.0 - s,
                "train/tokens": 32.0 * s,
                "optim/grad_norm": 0.1,
                "optim/skipped": 0.0,
            },
        )
    second.scalars(4, {"val/loss": 1.5, "val/tokens": 32})
    second.checkpoint(4, "c4")
    second.close()
    record = rh.read_record(run)
    assert record.path == run / "metrics.jsonl"
    assert record.series("train/loss") == ([1, 2, 3, 4], [9.0, 8.0, 17.0, 16.0])  # 3 and 4 trained again
    assert record.series("optim/grad_norm") == ([1, 2, 3, 4], [0.5, 1.0, 0.1, 0.1])
    assert record.flagged("optim/skipped") == []  # the dropped step 3 was cut back and trained again
    assert record.series("val/loss") == ([4], [1.5])  # step 2's NaN was written as null
    assert record.checkpoints == [(2, "c2"), (4, "c4")]
    assert record.configs == {"train.json": {"clipping_max_norm": 0.5}}
    assert record.windows() == [(1, 2, 7.0, 10.0), (3, 4, 15.0, 18.0)]
    assert record.tokens_at([1, 4]) == [32.0, 128.0]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    lines = [configs(0), train_step(1, 3.0, tokens=64), validation(1, 2.5)]
    for tail in ('{"step": 2, "val/lo', json.dumps(validation(2, 2.0)), b'{"step": 2, "x": "\xe2\x82'):
        record = read(tmp_path, lines, tail)  # cut mid-line (even between a character's bytes)
        assert [line["step"] for line in record.lines] == [0, 1, 1]
        assert record.series("val/loss") == ([1], [2.5])
    assert read(tmp_path, [], "").lines == ()  # an empty record: a session killed before its first line


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{broken", "malformed record"),
        ('{"step": 2, "val/loss": 1.0', "malformed record"),
        ("[1, 2]", "line 2 has no integer step"),
        ("7", "line 2 has no integer step"),
        ('{"step": 2.0}', "line 2 has no integer step"),
        ('{"step": null}', "line 2 has no integer step"),
        ('{"step": false}', "line 2 has no integer step"),
        ('{"val/loss": 1.0}', "line 2 has no integer step"),
    ],
)
def test_a_malformed_line_before_the_last_is_an_error_naming_the_file(tmp_path: Path, bad: str, message: str) -> None:
    # Only the last line can be torn (the file is only appended to): anything else is damage.
    path = write_record(
        tmp_path, [train_step(1, 3.0, tokens=64)], tail=bad + "\n" + json.dumps(validation(2, 1.0)) + "\n"
    )
    with pytest.raises(ValueError, match=message) as err:
        rh.read_record(tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_missing_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such record") as err:
        rh.read_record(tmp_path / "run")
    assert str(tmp_path / "run" / "metrics.jsonl") in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "dir" / "metrics.jsonl").mkdir(parents=True)  # not a file
    with pytest.raises(ValueError, match="no such record"):
        rh.read_record(tmp_path / "dir")


# ----------------------------------------------------------------------------- series and flags


def test_series_is_every_finite_value_by_step_and_the_last_line_wins(tmp_path: Path) -> None:
    lines = [
        {"step": 3, "time": 1.0, "train/loss": 3.0},
        {"step": 1, "time": 2.0, "train/loss": 1.0, "val/loss": 9.0},  # out of order: sorted by step
        {"step": 2, "time": 3.0, "train/loss": None},  # not finite when written
        {"step": 4, "time": 4.0, "train/loss": True},  # not a number
        {"step": 5, "time": 5.0, "train/loss": "6.0"},
        {"step": 6, "time": 6.0, "val/loss": 0.5},  # another tag
        {"step": 3, "time": 7.0, "train/loss": 30.0},  # a later line of step 3: it wins
        {"step": 7, "time": 8.0, "train/loss": 7},  # an int is a number too
    ]
    write_record(tmp_path, lines)
    with (tmp_path / "metrics.jsonl").open("a") as f:  # NaN and Infinity parse, but are no values to draw
        f.write('{"step": 8, "train/loss": NaN}\n{"step": 9, "train/loss": -Infinity}\n')
    record = rh.read_record(tmp_path)
    assert record.series("train/loss") == ([1, 3, 7], [1.0, 30.0, 7.0])
    assert all(isinstance(v, float) for v in record.series("train/loss")[1])
    assert record.series("val/loss") == ([1, 6], [9.0, 0.5])
    assert record.series("absent") == ([], [])


def test_flagged_steps_are_the_ones_set_to_1(tmp_path: Path) -> None:
    lines = [
        train_step(s, 3.0, tokens=64 * s, grad_norm=None if s in (2, 5) else 0.5, dropped=s in (2, 5))
        for s in range(1, 7)
    ]
    record = read(tmp_path, lines)
    assert record.flagged("optim/skipped") == [2, 5]
    assert record.series("optim/grad_norm")[0] == [1, 3, 4, 6]  # a dropped step has no norm
    assert record.flagged("optim/clipped") == [] and record.flagged("absent") == []


# ----------------------------------------------------------------------------- checkpoints, configs, windows


def test_checkpoints_are_every_checkpoint_line_pruned_ones_included(tmp_path: Path) -> None:
    # The folders of 10 and 20 were pruned long ago (none is on disk here): the record still names them.
    lines = [configs(0), checkpoint(20), checkpoint(10), checkpoint(30), event(30, checkpoint="again-step-30")]
    record = read(tmp_path, lines)
    assert record.checkpoints == [
        (10, checkpoint(10)["checkpoint"]),
        (20, checkpoint(20)["checkpoint"]),
        (30, "again-step-30"),
    ]  # by step; the last line of a step wins
    assert not (tmp_path / "checkpoints").exists()
    assert read(tmp_path, [configs(0), {"step": 1, "time": 1.0, "checkpoint": None}]).checkpoints == []


def test_configs_are_the_latest_sessions(tmp_path: Path) -> None:
    lines = [
        configs(0, clip=1.0),
        train_step(1, 3.0, tokens=64),
        configs(1, clip=0.5),
        train_step(2, 3.0, tokens=128),
        configs(1, clip=0.25),
    ]  # resumed at step 1 twice: the later session's
    assert read(tmp_path, lines).configs["train.json"]["clipping_max_norm"] == 0.25
    assert read(tmp_path, lines[:3]).configs["train.json"]["clipping_max_norm"] == 0.5
    assert read(tmp_path, [train_step(1, 3.0, tokens=64)]).configs == {}  # a record without one


def test_windows_are_the_steps_since_the_previous_checkpoint(tmp_path: Path) -> None:
    nan = float("nan")
    lines = [configs(0)]
    for s in range(1, 13):
        lo, hi = (nan, nan) if s == 6 else (10.0 - s, 20.0 + s)  # step 6's losses were not finite
        lines.append(train_step(s, 15.0, lo=lo, hi=hi, tokens=8 * s))
        if s in (4, 8):
            lines.append(checkpoint(s))
    lines.insert(1, checkpoint(0))  # a checkpoint of no steps (written at the start): no window
    # A step with a min but no max counts in neither: step 7's line lacks train/loss_max.
    lines = [
        (
            {k: v for k, v in line.items() if k != "train/loss_max"}
            if line["step"] == 7 and "train/loss" in line
            else line
        )
        for line in lines
    ]
    record = read(tmp_path, lines)
    assert record.checkpoints[0][0] == 0
    # 1-4: min 10-4, max 20+4; 5-8 without 6 and 7: min 10-8, max 20+8; 9-12 after the last checkpoint: none.
    assert record.windows() == [(1, 4, 6.0, 24.0), (5, 8, 2.0, 28.0)]
    # A record written before train/loss_min and train/loss_max existed: no bands at all.
    old = [{k: v for k, v in line.items() if k not in ("train/loss_min", "train/loss_max")} for line in lines]
    assert read(tmp_path, old).windows() == []


def test_the_windows_of_a_resumed_run_follow_its_checkpoints(tmp_path: Path) -> None:
    # Checkpoints at 3 and 6; a session resumed at 6 trains 7-9 (checkpoint 9): three windows.
    lines = [configs(0)]
    for s in range(1, 10):
        if s == 7:
            lines.append(configs(6))
        lines.append(train_step(s, 5.0, lo=1.0 * s, hi=2.0 * s, tokens=4 * s))
        if s % 3 == 0:
            lines.append(checkpoint(s))
    assert read(tmp_path, lines).windows() == [(1, 3, 1.0, 6.0), (4, 6, 4.0, 12.0), (7, 9, 7.0, 18.0)]


# ----------------------------------------------------------------------------- tokens


def test_tokens_at_are_the_steps_train_tokens(tmp_path: Path) -> None:
    lines = [train_step(s, 3.0, tokens=100 * s) for s in range(1, 11)] + [validation(5, 2.0), validation(10, 1.0)]
    record = read(tmp_path, lines)
    val_steps = record.series("val/loss")[0]
    assert record.tokens_at(val_steps) == [500.0, 1000.0]
    assert record.tokens_at([1, 7, 10]) == [100.0, 700.0, 1000.0] and record.tokens_at([]) == []


def test_a_record_without_train_tokens_cannot_be_compared_by_tokens(tmp_path: Path) -> None:
    old = [{k: v for k, v in train_step(s, 3.0, tokens=64 * s).items() if k != "train/tokens"} for s in (1, 2)]
    record = read(tmp_path, old + [validation(2, 2.0)])
    with pytest.raises(ValueError, match="no train/tokens at step 2") as err:
        record.tokens_at(record.series("val/loss")[0])
    assert str(tmp_path / "metrics.jsonl") in str(err.value) and "\n" not in str(err.value)
    # A step past the record's last step line (e.g. a validation line alone) is just as unknown.
    record = read(tmp_path, [train_step(1, 3.0, tokens=64), validation(2, 2.0)])
    with pytest.raises(ValueError, match="no train/tokens at step 2"):
        record.tokens_at(record.series("val/loss")[0])


# ----------------------------------------------------------------------------- smoothing and medians


def test_rolling_median_is_the_trailing_median() -> None:
    values = [25.0, 7000, 7100, 6900, 60000, 7050, 6950, 7000, 7020]  # a compile, then a fast read
    at, got = rh.rolling_median(values, 5)
    assert at == list(range(len(values)))
    assert got == [statistics.median(values[max(0, i - 4) : i + 1]) for i in range(len(values))]
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


def test_is_number_is_a_finite_int_or_float() -> None:
    assert rh.is_number(1) and rh.is_number(0.5) and rh.is_number(-3)
    assert not any(rh.is_number(v) for v in (True, None, "1", float("nan"), float("inf"), [1]))
