"""bench gpu (bench/gpu.py), the one-shot accelerator check, end to end on tiny shapes (--cpu-smoke): the same
code paths as on a GPU, so it cannot rot on CPU. Figures are checked for presence and sense only;
timings are never asserted."""

from __future__ import annotations

import json
import math
import os
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

from bench import cli
from bench import gpu as bench_gpu
from bench.train_step import chip_peak_flops

# Not in the fast tier (-m "not slow"): the benchmark smoke test of the accelerator check, end to end.
pytestmark = pytest.mark.slow


def test_cpu_smoke_runs_every_part(tmp_path: Path) -> None:
    out = tmp_path / "check"
    assert cli.main(["gpu", "--cpu-smoke", "--out", str(out)]) == 0
    r = json.loads(Path(f"{out}.json").read_text())
    md = Path(f"{out}.md").read_text()
    # (a) seven train-step variants of the three recipes through bench train, each in its own process
    steps = r["train_step"]
    gpt2, modern, new = "runs/gpt2-small", "runs/gpt2-small-modern", "runs/gpt2-small-2026"
    assert [(s["run"], s["attention"], s["scan_layers"], s["k"]) for s in steps] == [
        (gpt2, "auto", True, 1),
        (modern, "auto", True, 1),
        (new, "auto", True, 1),
        (gpt2, "auto", True, 2),
        (gpt2, "xla", True, 1),
        (gpt2, "auto", False, 1),
        (modern, "auto", True, 2),
    ]
    for s in steps:
        assert s["status"] == "ok", s["status"]
        assert s["tokens_per_s_median"] > 0 and s["step_s_median"] > 0 and s["compile_s"] >= 0
        assert s["mfu"] > 0 and math.isfinite(s["mfu"]) and s["compute_dtype"] == "bfloat16"
        assert s["accumulation_steps"] == s["k"] and s["microbatch_size"] == 2
    for s in steps[:3]:  # where the time goes, one row of each recipe
        assert all(v > 0 for v in s["breakdown"].values())
    assert steps[2]["window_pattern"] == "SSSL" and steps[2]["value_embeds"] and steps[2]["unet_skips"]
    assert steps[1]["positions"] == "rotary" and steps[1]["mlp"] == "relu2" and steps[0]["positions"] == "learned"
    assert steps[1]["optimizer"] == "muon" and steps[0]["optimizer"] == "adamw"
    assert r["chip"]["platform"] == "cpu" and r["chip"]["peak_source"].startswith("measured")
    # (b) train.py to the end, then a second run resumed from the first checkpoint
    t = r["training"]
    assert t["status"] == "ok", t["status"]
    assert t["checkpoints_a"] == [10, 20, 30] and t["checkpoints_b"] == [10, 20, 30] and t["resumed_from"] == 10
    assert t["loss_falls"] and t["loss_last10"] < t["loss_first10"]
    assert t["resume_steps_compared"] == 20 and t["resume_bit_identical"] and t["resume_max_abs_diff"] == 0
    assert t["killed_at"] is not None and t["killed_at"] >= 10  # SIGKILL'd once its step-10 checkpoint was written
    # evaluate.py in fresh processes on the first and last checkpoints: the validation loss training logged
    assert [row["step"] for row in t["round_trip"]] == [10, 30]
    assert all(row["status"] == "ok" and row["diff"] <= 1e-3 for row in t["round_trip"]), t["round_trip"]
    # (c) cached generation at two batch sizes
    assert [g["batch_size"] for g in r["generation"]] == [1, 8]
    assert all(g["status"] == "ok" and g["cached_tok_s"] > 0 and g["burst"] == 16 for g in r["generation"])
    assert (
        md.count("Where the time goes (") == 3 and "gpt2-small-modern attention=auto scan_layers=true k=1, muon" in md
    )
    assert (
        "| variant | tokens/s |" in md
        and "bit-identical" in md
        and "| batch | dtype | steps per dispatch | tokens/s |" in md
    )
    assert md.count("in a fresh process: loss") == 2 and "(|diff|" in md and "NOT EQUAL" not in md
    assert r["chip"]["platform"] == "cpu" and r["chip"]["devices"] >= 1
    assert Path(f"{out}.logs/train-b.log").is_file() and not Path(f"{out}.logs/work").exists()


def test_a_failing_part_is_one_row_and_a_spent_budget_skips(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    row = bench_gpu._bench(
        ["train", "runs/gpt2-small", "--model", "attention=cudnn", "--steps", "1"], logs, "cudnn", timeout=120
    )
    assert row["status"].startswith(
        "failed (exit 2): error: runs/gpt2-small attention=cudnn: model.json: attention='cudnn' needs a GPU"
    ), row["status"]
    r = bench_gpu.bench_gpu(tmp_path / "none", cpu_smoke=True, budget_s=0, log=lambda _: None)
    assert all(s["status"].startswith("skipped") for s in r["train_step"] + r["generation"] + [r["training"]])
    assert "skipped: time budget spent" in Path(f"{tmp_path}/none.md").read_text()


def test_chip_peaks_and_the_cuda13_extra() -> None:
    assert chip_peak_flops("NVIDIA H200")[0] == chip_peak_flops("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert chip_peak_flops("NVIDIA A100-SXM4-80GB")[0] == 312e12
    assert chip_peak_flops("NVIDIA L40S")[0] == 362e12 and chip_peak_flops("NVIDIA L4")[0] == 121e12
    assert chip_peak_flops("cpu") is None and chip_peak_flops("Some Future Chip") is None
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cuda12"] == ["jax[cuda12]>=0.10.2"] and extras["cuda13"] == ["jax[cuda13]>=0.10.2"]
    lock = (ROOT / "uv.lock").read_text()
    assert 'name = "jax-cuda13-plugin"' in lock and 'name = "jax-cuda12-plugin"' in lock  # both resolved


def test_the_kill_waits_for_the_checkpoint_to_be_renamed_into_place(tmp_path: Path) -> None:
    """A checkpoint is written as .tmp-<name>, meta.json last, then renamed: the resume checks kill the run
    only once it is in place (a kill between the two left none, and the TPU pipeline's resume started over)."""
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    writer = (
        "import os, sys, time, pathlib\n"
        f"root = pathlib.Path({str(ckpts)!r})\n"
        "tmp = root / '.tmp-20260101T000000Z-step-2'\n"
        "tmp.mkdir(parents=True)\n"
        "(tmp / 'meta.json').write_text('{\"step\": 2}')\n"
        "time.sleep(2)\n"
        "os.rename(tmp, root / '20260101T000000Z-step-2')\n"
        "time.sleep(60)\n"
    )
    cmd = [sys.executable, "-c", writer]
    bench_gpu._kill_after_checkpoint(cmd, run, 2, tmp_path / "log", dict(os.environ))
    assert (ckpts / "20260101T000000Z-step-2" / "meta.json").is_file()
