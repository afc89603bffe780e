"""Tokens to target (train.json target_val_loss) through train.py: the run stops at the first
validation at or below the target with a checkpoint there, records steps, tokens and training
seconds, does the same after an interrupt and a resume, does nothing once reached, and records a
target not reached. The target is picked from an uninterrupted run's validation losses."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TINY_MODEL, TINY_TRAIN, wait_for_step, write_run

import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.tracking import metrics
from jaxgpt.tracking.history import read_record

# Not in the fast tier (-m "not slow"): trainings end to end, one interrupted and resumed.
pytestmark = pytest.mark.slow

MODEL = TINY_MODEL
TRAIN = {**TINY_TRAIN, "checkpoint_interval": 20, "validation_interval": 5}
TOKENS_PER_STEP = 4 * 2 * 32


def run_main(run_dir: Path, data_root: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train.main([str(run_dir), "--data-dir", str(data_root)])
    return code, out.getvalue()


def records(run_dir: Path) -> list[dict]:
    return metrics.read_metrics(run_dir / metrics.METRICS_FILE)


def per_step_losses(run_dir: Path) -> dict[int, float]:
    out = {}
    out.update(zip(*read_record(run_dir).series("train/loss")))
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> dict:
    """The whole run, its target (1e-6) never reached; its validation losses choose the target:
    the last validation that is a new lowest loss, late in the run and between two checkpoints."""
    run = write_run(tmp_path_factory.mktemp("straight") / "run", MODEL, {**TRAIN, "target_val_loss": 1e-6})
    code, out = run_main(run, data_root)
    assert code == 0
    vals = {r["step"]: r["val/loss"] for r in records(run) if "val/loss" in r}
    assert sorted(vals) == list(range(5, 121, 5))
    best, firsts = float("inf"), []
    for step in sorted(vals):
        if vals[step] < best:
            best = vals[step]
            firsts.append(step)  # the first validation at or below its own loss
    chosen = [s for s in firsts if s % TRAIN["checkpoint_interval"] and s >= 60]
    assert chosen, f"no late new-lowest validation between checkpoints in {vals}"
    return {"run": run, "out": out, "vals": vals, "step": chosen[-1], "target": vals[chosen[-1]]}


def check_reached(run: Path, straight: dict) -> dict:
    """Stopped at the chosen validation with a checkpoint there; the record says where."""
    step = straight["step"]
    latest = ckpt.latest_checkpoint(run)
    assert ckpt.step_of(latest) == step  # between two interval checkpoints: saved because reached
    meta = ckpt.read_meta(latest)
    target = meta["target"]
    assert (target["value"], target["reached"], target["step"], target["tokens"]) == (
        straight["target"],
        True,
        step,
        step * TOKENS_PER_STEP,
    )
    assert 0 < target["training_seconds"] == meta["training_s"] <= meta["elapsed_s"] + 1e-6
    assert meta["val_loss"] == straight["target"] and target["best_loss"] == straight["target"]
    lines = records(run)
    assert max(r["step"] for r in lines) == step  # nothing trained past it
    assert [
        (r["step"], r["target/steps"], r["target/tokens"], r["target/seconds"]) for r in lines if "target/steps" in r
    ] == [(step, step, step * TOKENS_PER_STEP, target["training_seconds"])]
    want = per_step_losses(straight["run"])
    got = per_step_losses(run)
    assert sorted(got) == list(range(1, step + 1))
    np.testing.assert_array_equal([got[s] for s in sorted(got)], [want[s] for s in sorted(got)])
    return meta


def test_not_reached_is_recorded(straight: dict) -> None:
    meta = ckpt.read_meta(ckpt.latest_checkpoint(straight["run"]))
    best = min(straight["vals"].values())  # over every validation, not only the checkpoints'
    assert meta["target"] == {
        "value": 1e-6,
        "reached": False,
        "step": 120,
        "tokens": 120 * TOKENS_PER_STEP,
        "training_seconds": meta["training_s"],
        "best_loss": best,
    }
    assert f"Target validation loss 1e-06 not reached in 120 steps (best {best:.4f})" in straight["out"]
    assert not [r for r in records(straight["run"]) if "target/steps" in r]


def test_reached_stops_there_with_a_checkpoint(tmp_path: Path, data_root: Path, straight: dict) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "target_val_loss": straight["target"]})
    code, out = run_main(run, data_root)
    assert code == 0
    meta = check_reached(run, straight)
    step = straight["step"]
    assert (
        f"Target validation loss {straight['target']:g} reached at step {step}: {step:,} steps, "
        f"{step * TOKENS_PER_STEP:,} tokens, {meta['target']['training_seconds']:,.3f} training seconds"
    ) in out
    # Once reached, a rerun says so in one line and trains nothing.
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    code, out = run_main(run, data_root)
    assert code == 0
    said = [line for line in out.splitlines() if "target_val_loss" in line]
    assert len(said) == 1 and said[0].startswith("Nothing to do") and f"(step {step})" in said[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_reached_after_an_interrupt_and_a_resume(tmp_path: Path, data_root: Path, straight: dict) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "target_val_loss": straight["target"]})
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_step(run, proc, TRAIN["checkpoint_interval"])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    stopped = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert stopped["step"] < straight["step"], "the run reached the target before the signal: make it longer"
    assert stopped["target"]["reached"] is False and stopped["training_s"] > 0

    code, _ = run_main(run, data_root)  # resumed: continues, and stops at the same validation
    assert code == 0
    meta = check_reached(run, straight)
    assert meta["target"]["training_seconds"] > stopped["training_s"]  # the count went on from meta.json
