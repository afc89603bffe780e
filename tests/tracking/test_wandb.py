"""train.json "wandb": real wandb in its offline mode, read back from its .wandb files (`wandb leet inspect`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, SLOW, wait_for_step, write_run

import train
from jaxgpt.checkpoints import layout as ckpt
from jaxgpt.config import ConfigError, WandbConfig
from jaxgpt.tracking import wandb_log
from jaxgpt.tracking.metrics import read_metrics

MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 1}
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 2,
    "train_steps": 12,
    "learning_rate": 0.003,
    "checkpoint_interval": 5,
    "validation_batches": 1,
    "wandb": {"project": "jaxgpt-tests", "mode": "offline", "tags": ["tiny", "test"], "group": "g"},
}


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network whatever train.json says (WANDB_MODE overrides it), nothing written outside tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)


def run_main(run_dir: Path, data_root: Path) -> int:
    return train.main([str(run_dir), "--data-dir", str(data_root)])


def wandb_records(run_file: Path, complete: bool = True) -> list[dict[str, Any]]:
    """Every record of a .wandb transaction log, as wandb's own reader prints them (complete=False:
    a log whose writer was killed, which the reader reads to its end and then reports)."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 or not complete, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def history(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> the row W&B holds for it, without W&B's own keys (_step, _runtime, _timestamp)."""
    rows = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            rows[item["_step"]] = {k: v for k, v in item.items() if not k.startswith("_")}
    return rows


def record_rows(run_dir: Path, steps: range) -> dict[int, dict[str, float]]:
    """The same from metrics.jsonl: each step's scalars (its lines joined; nulls are not sent to W&B)."""
    rows: dict[int, dict[str, float]] = {}
    for line in read_metrics(run_dir / ckpt.METRICS_FILE):
        if line["step"] in steps and "configs" not in line and "checkpoint" not in line:
            rows.setdefault(line["step"], {}).update(
                {k: v for k, v in line.items() if k not in ("step", "time") and v is not None}
            )
    return rows


def offline_runs(run_dir: Path, run_id: str) -> list[Path]:
    """The run's offline-run folders, oldest first (their names start with the start time)."""
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def without_perf(rows: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {s: {k: v for k, v in row.items() if not k.startswith("perf/")} for s, row in rows.items()}


@SLOW  # two training sessions and a W&B run
def test_offline_run_logs_the_record_and_resumes_into_the_same_run(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 1 dies after step 10 (its checkpoint at 10 fails; the one at 5 is the latest), session 2
    resumes from 5 into the same W&B run, trains 6-10 again and goes on to 12."""
    from jaxgpt.training import loop

    run = write_run(tmp_path / "wb", MODEL, TRAIN)
    save = loop.Session.save

    def dies_at_10(self: loop.Session, done: int, *args: Any, **kwargs: Any) -> Path:
        if done == 10:
            raise RuntimeError("killed before the checkpoint of step 10")
        return save(self, done, *args, **kwargs)

    monkeypatch.setattr(loop.Session, "save", dies_at_10)
    with pytest.raises(RuntimeError, match="step 10"):
        run_main(run, data_root)
    monkeypatch.setattr(loop.Session, "save", save)
    run_id = json.loads((run / ckpt.WANDB_FILE).read_text())["id"]
    first = offline_runs(run, run_id)
    assert len(first) == 1
    session1 = wandb_records(first[0] / f"run-{run_id}.wandb")
    rows1 = history(session1)
    assert sorted(rows1) == list(range(1, 11))
    assert "val/loss" in rows1[5] and "val/loss" in rows1[10] and "val/loss" not in rows1[6]
    assert rows1 == record_rows(run, range(1, 11))  # the record as session 1 left it
    started = next(r["run"] for r in session1 if r["type"] == "run")
    assert (started["project"], started["display_name"], started["run_group"]) == ("jaxgpt-tests", "wb", "g")
    assert started["tags"] == ["tiny", "test"]
    assert [r["exit"]["exit_code"] for r in session1 if r["type"] == "exit"] == [1]  # failed, and finished

    assert run_main(run, data_root) == 0
    assert json.loads((run / ckpt.WANDB_FILE).read_text())["id"] == run_id  # the same W&B run
    both = offline_runs(run, run_id)
    assert len(both) == 2 and both[0] == first[0]
    session2 = wandb_records(both[1] / f"run-{run_id}.wandb")
    rows2 = history(session2)
    # Nothing at or below the checkpoint it resumed from; steps 6-10 trained and sent again, then 11, 12.
    assert sorted(rows2) == list(range(6, 13))
    record = record_rows(run, range(1, 13))
    assert sorted(record) == list(range(1, 13))
    assert rows2 == {s: record[s] for s in range(6, 13)}
    assert {s: rows1[s] for s in range(1, 6)} == {s: record[s] for s in range(1, 6)}
    # What W&B ends with (each step's first value, `wandb sync` taking the sessions in order) is the
    # record: a resumed run replays its steps exactly, only the timings differ.
    merged = rows1 | {s: rows2[s] for s in range(11, 13)}
    assert without_perf(merged) == without_perf(record)
    # The resolved configs are the run's config, as written beside the checkpoints.
    config = {}
    for r in session2:
        config |= r["config"]["update"] if r["type"] == "config" else {}
    saved = ckpt.read_configs(ckpt.latest_checkpoint(run))
    assert config["model"] == saved["model.json"] and config["train"] == saved["train.json"]
    assert config["train"]["wandb"]["project"] == "jaxgpt-tests"
    assert [r["exit"]["exit_code"] for r in session2 if r["type"] == "exit"] == [0]
    assert not list(tmp_path.glob("wandb")) and not (Path.cwd() / "wandb").exists()  # only in the run dir


@SLOW  # two training sessions and a W&B run
def test_a_stop_finishes_the_run_as_preempting(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (a real SIGINT to this process, caught by train.py's StopFlag) after step 5's checkpoint:
    the run stops with a checkpoint at step 6, exit 130, and W&B's run is finished marked preempting."""
    from jaxgpt.training import loop

    run = write_run(tmp_path / "stop", MODEL, {**TRAIN, "train_steps": 40})
    save = loop.Session.save

    def ctrl_c_after_5(self: loop.Session, done: int, *args: Any, **kwargs: Any) -> Path:
        path = save(self, done, *args, **kwargs)
        if done == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return path

    monkeypatch.setattr(loop.Session, "save", ctrl_c_after_5)
    assert run_main(run, data_root) == 130
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 6
    run_id = json.loads((run / ckpt.WANDB_FILE).read_text())["id"]
    [folder] = offline_runs(run, run_id)
    records = wandb_records(folder / f"run-{run_id}.wandb")
    assert sorted(history(records)) == list(range(1, 7))
    assert [r["type"] for r in records if r["type"] in ("preempting", "exit")] == ["preempting", "exit"]
    assert next(r["exit"]["exit_code"] for r in records if r["type"] == "exit") == 130


@SLOW  # a training subprocess killed, then resumed
def test_kill_9_then_resume_logs_into_the_same_run(tmp_path: Path, data_root: Path) -> None:
    """kill -9 ends train.py (and wandb's writer, which flushes its file every 15 s: here it may have
    written nothing) mid-run: the next session still resumes the same W&B run, in a second offline
    folder, from the step after the checkpoint, and sends each step the record has from there."""
    run = write_run(tmp_path / "k", MODEL, {**TRAIN, "train_steps": 400, "checkpoint_interval": 20})
    # Without WANDB_SERVICE: wandb sets it in this process once an earlier test has started its service, and
    # a child would log through that service, which outlives the kill and keeps the run "in use".
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_step(run, proc, 20)
        run_id = json.loads((run / ckpt.WANDB_FILE).read_text())["id"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    resumed_from = ckpt.step_of(ckpt.latest_checkpoint(run))
    assert resumed_from < 400, "the run finished before the kill: make it longer"
    first = offline_runs(run, run_id)
    assert len(first) == 1
    killed = history(wandb_records(first[0] / f"run-{run_id}.wandb", complete=False))
    assert sorted(killed) == list(range(1, len(killed) + 1))  # what the writer got to, from step 1

    assert run_main(run, data_root) == 0
    assert json.loads((run / ckpt.WANDB_FILE).read_text())["id"] == run_id
    both = offline_runs(run, run_id)
    assert len(both) == 2 and both[0] == first[0]
    rows = history(wandb_records(both[1] / f"run-{run_id}.wandb"))
    assert sorted(rows) == list(range(resumed_from + 1, 401))
    assert rows == {s: row for s, row in record_rows(run, range(1, 401)).items() if s > resumed_from}


@pytest.mark.parametrize(
    "mode, env", [("disabled", "offline"), ("offline", "disabled")], ids=["train.json disabled", "WANDB_MODE disabled"]
)
def test_disabled_writes_nothing(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch, mode: str, env: str
) -> None:
    """train.json mode "disabled", or WANDB_MODE=disabled over mode "offline": no W&B file at all."""
    if mode == "disabled":
        monkeypatch.delenv("WANDB_MODE")
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    run = write_run(
        tmp_path / "off",
        MODEL,
        {**TRAIN, "train_steps": 2, "checkpoint_interval": 2, "wandb": {"project": "p", "mode": mode}},
    )
    assert run_main(run, data_root) == 0
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 2
    assert not (run / "wandb").exists() and not (run / ckpt.WANDB_FILE).exists()
    assert not (tmp_path / "wandb-home").exists()


BAD = [
    # (what, the wandb section, WANDB_MODE, words the one-line error must contain)
    ("unknown key", {"project": "p", "colour": "red"}, "offline", ["train.json", "wandb", "'colour'"]),
    ("bad mode", {"project": "p", "mode": "sometimes"}, "offline", ["train.json", "wandb", "mode='sometimes'"]),
    ("missing project", {"mode": "offline"}, "offline", ["train.json", "wandb", "'project'"]),
    ("project with a slash", {"project": "a/b"}, "offline", ["train.json", "project='a/b'"]),
    ("tags not a list", {"project": "p", "tags": "x"}, "offline", ["train.json", "tags='x'", "array"]),
    ("bad WANDB_MODE", {"project": "p"}, "sometimes", ["WANDB_MODE='sometimes'", "train.json"]),
]


@pytest.mark.parametrize("what,section,env,words", BAD, ids=[c[0] for c in BAD])
def test_bad_section_is_one_line_error(
    tmp_path: Path,
    data_root: Path,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    section: dict,
    env: str,
    words: list[str],
) -> None:
    monkeypatch.setenv("WANDB_MODE", env)
    run = write_run(tmp_path / "bad", MODEL, {**TRAIN, "wandb": section})
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for word in words:
        assert word in err, (word, err)
    assert not (run / "checkpoints").exists() and not (run / "wandb").exists()


def test_missing_package_or_bad_id_file_is_one_line_error(
    tmp_path: Path, data_root: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = write_run(tmp_path / "nopkg", MODEL, TRAIN)
    (run / ckpt.WANDB_FILE).write_text('{"id": "has/slash"}')
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{run / ckpt.WANDB_FILE}: id='has/slash'" in err, err
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a package as not importable
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert f"{run}/train.json: wandb:" in err and "uv sync --extra wandb" in err
    # mode "disabled" needs no package
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb_log.check(run, WandbConfig(project="p"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ConfigError, match="uv sync --extra wandb"):
        wandb_log.check(run, WandbConfig(project="p"))
    assert not (run / "checkpoints").exists()


def test_wandb_mode_overrides_train_json(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = WandbConfig(project="p", mode="online")
    assert wandb_log.resolve_mode(cfg) == "offline"  # the fixture's WANDB_MODE
    for env, mode in [("dryrun", "offline"), ("run", "online"), ("disabled", "disabled"), ("", "online")]:
        monkeypatch.setenv("WANDB_MODE", env)
        assert wandb_log.resolve_mode(cfg) == mode


def test_restart_moves_the_id_aside_with_the_record(tmp_path: Path) -> None:
    """--restart (layout.archive_checkpoints) starts a new W&B run: wandb.json goes with the record."""
    run = tmp_path / "r"
    run.mkdir()
    wandb_log.write_id(run, "abc123xy")
    (run / ckpt.METRICS_FILE).write_text('{"step": 1, "time": 0}\n')
    assert wandb_log.read_id(run) == "abc123xy"
    moved = ckpt.archive_checkpoints(run)
    assert moved is not None and wandb_log.read_id(moved) == "abc123xy"
    assert wandb_log.read_id(run) is None and not list(run.glob(".wandb.json*"))
