"""Scale-out on JAX's own runtime: data x model meshes on forced host devices, FSDP, resuming on
another mesh shape, and two processes joined by jax.distributed (gloo collectives on CPU).

Each multi-device run is a train.py subprocess, because the device count is fixed when JAX
starts (XLA_FLAGS=--xla_force_host_platform_device_count=N).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, write_run

import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.tracking.history import read_record

# Not in the fast tier (-m "not slow"): several train.py processes on forced host devices, and two joined over gloo.
pytestmark = pytest.mark.slow

MODEL = {
    "architecture": "gpt2",
    "vocab_size": 258,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "qkv_bias": True,
    "drop_rate": 0.1,
}
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 8,
    "gradient_accumulation_steps": 2,
    "train_steps": 6,
    "learning_rate": 0.003,
    "checkpoint_interval": 3,
    "validation_batches": 1,
    "keep_last_checkpoints": 10,
}


def losses(run_dir: Path, after: int = 0) -> list[float]:
    """The run's per-step training losses from its record, of the steps past `after` (a run
    resumed from a copied step-`after` checkpoint records only the steps it trained)."""
    steps, values = read_record(run_dir).series("train/loss")
    return [v for s, v in zip(steps, values) if s > after]


def run_subprocess(
    run_dir: Path, data_root: Path, devices: int, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run_dir), "--data-dir", str(data_root), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def train_on(run_dir: Path, data_root: Path, devices: int) -> str:
    proc = run_subprocess(run_dir, data_root, devices)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def resume_from(ckpt_dir: Path, run: Path, data_root: Path, devices: int, capsys: pytest.CaptureFixture) -> None:
    """Train `run` from a copy of another run's checkpoint on `devices` forced host devices (one:
    in this process, which has one) and check it said it resumed from there."""
    shutil.copytree(ckpt_dir, run / "checkpoints" / ckpt_dir.name)
    if devices == 1:
        capsys.readouterr()
        assert train.main([str(run), "--data-dir", str(data_root)]) == 0
        out = capsys.readouterr().out
    else:
        out = train_on(run, data_root, devices=devices)
    assert f"Resuming {run} from {ckpt_dir.name} (step {ckpt.step_of(ckpt_dir)})" in out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """The single-device run everything else must match."""
    run = write_run(tmp_path_factory.mktemp("single") / "run", MODEL, TRAIN)
    assert train.main([str(run), "--data-dir", str(data_root)]) == 0
    return run


@pytest.mark.parametrize(
    "mesh",
    [{"data": 8, "model": 1}, {"data": 4, "model": 2}, {"data": 8, "model": 1, "fsdp": True}],
    ids=["8x1", "4x2", "8x1-fsdp"],
)
def test_mesh_matches_single_device(tmp_path: Path, data_root: Path, reference: Path, mesh: dict) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "mesh": mesh})
    train_on(run, data_root, devices=8)
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["mesh"] == {"data": mesh["data"], "model": mesh["model"], "processes": 1}
    np.testing.assert_allclose(losses(run), losses(reference), rtol=0, atol=1e-5)
    assert len(losses(run)) == 6


def test_save_on_4x2_resume_on_8x1_and_on_one_device(
    tmp_path: Path, data_root: Path, reference: Path, capsys: pytest.CaptureFixture
) -> None:
    saved = write_run(tmp_path / "saved", MODEL, {**TRAIN, "mesh": {"data": 4, "model": 2}})
    train_on(saved, data_root, devices=8)
    step3 = next(p for p in ckpt.list_checkpoints(saved) if ckpt.step_of(p) == 3)
    for name, devices, mesh in [("on8x1", 8, {"data": 8, "model": 1}), ("on1", 1, {})]:
        run = write_run(tmp_path / name, MODEL, {**TRAIN, "mesh": mesh})
        resume_from(step3, run, data_root, devices, capsys)
        np.testing.assert_allclose(losses(run), losses(reference, after=3), rtol=0, atol=1e-5)
        assert len(losses(run)) == 3


# The modern recipe: every model option of layers.py, Muon (its momenta sharded as the kernels are,
# the qkv one as its (C, 3, C) view) and warmup-stable-decay.
MODERN = {
    **MODEL,
    "qkv_bias": False,
    "bias": False,
    "tie_embeddings": False,
    "positions": "rotary",
    "norm": "rmsnorm",
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "zero_init_proj": True,
    "logit_softcap": 15.0,
}
MODERN_TRAIN = {**TRAIN, "optimizer": "muon", "schedule": "wsd", "learning_rate": 0.02}


def test_modern_recipe_on_4x2_fsdp_matches_and_resumes_on_8x1_and_one_device(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture
) -> None:
    """Data x model parallel with FSDP matches the single device; its step-3 checkpoint (Muon's
    momenta sharded over both axes) resumes on (8, 1) FSDP and on one device, to the same losses."""
    reference = write_run(tmp_path / "single", MODERN, MODERN_TRAIN)
    assert train.main([str(reference), "--data-dir", str(data_root)]) == 0
    saved = write_run(tmp_path / "saved", MODERN, {**MODERN_TRAIN, "mesh": {"data": 4, "model": 2, "fsdp": True}})
    train_on(saved, data_root, devices=8)
    np.testing.assert_allclose(losses(saved), losses(reference), rtol=0, atol=1e-5)
    step3 = next(p for p in ckpt.list_checkpoints(saved) if ckpt.step_of(p) == 3)
    for name, devices, mesh in [("on8x1", 8, {"data": 8, "model": 1, "fsdp": True}), ("on1", 1, {})]:
        run = write_run(tmp_path / name, MODERN, {**MODERN_TRAIN, "mesh": mesh})
        resume_from(step3, run, data_root, devices, capsys)  # Muon's state restored onto another mesh
        np.testing.assert_allclose(losses(run), losses(reference, after=3), rtol=0, atol=1e-5)
        assert len(losses(run)) == 3


# The 2026 recipe on top: grouped-query attention (the kv kernel sharded by key/value heads), windows,
# value embeddings (tables sharded by vocabulary and, with FSDP, width), embedding and U-net skips;
# Muon with Polar Express and NorMuon (its per-neuron moments); rows packed from whole documents.
NEW_2026 = {
    **MODERN,
    "n_kv_heads": 2,
    "window_pattern": "SL",
    "short_window": 6,
    "value_embeds": True,
    "embed_skips": True,
    "unet_skips": True,
}
NEW_2026_TRAIN = {**MODERN_TRAIN, "packing": "documents", "muon": {"coefficients": "polar_express", "normuon": True}}


def test_2026_recipe_on_4x2_fsdp_matches_and_resumes_on_one_device(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture
) -> None:
    reference = write_run(tmp_path / "single", NEW_2026, NEW_2026_TRAIN)
    assert train.main([str(reference), "--data-dir", str(data_root)]) == 0
    saved = write_run(tmp_path / "saved", NEW_2026, {**NEW_2026_TRAIN, "mesh": {"data": 4, "model": 2, "fsdp": True}})
    train_on(saved, data_root, devices=8)
    np.testing.assert_allclose(losses(saved), losses(reference), rtol=0, atol=1e-5)
    step3 = next(p for p in ckpt.list_checkpoints(saved) if ckpt.step_of(p) == 3)
    run = write_run(tmp_path / "on1", NEW_2026, NEW_2026_TRAIN)
    resume_from(step3, run, data_root, 1, capsys)  # the new parameters and NorMuon's moments onto one device
    np.testing.assert_allclose(losses(run), losses(reference, after=3), rtol=0, atol=1e-5)
    assert len(losses(run)) == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_single_process(tmp_path: Path, data_root: Path, reference: Path) -> None:
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    flags = ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    procs = [run_subprocess(run, data_root, 2, *flags, "--process-id", str(i)) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "Training complete" in outs[0] and "Training complete" not in outs[1]  # one log
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["mesh"] == {"data": 4, "model": 1, "processes": 2}
    np.testing.assert_allclose(losses(run), losses(reference), rtol=0, atol=1e-5)
    # One set of checkpoints and charts, whole and loadable.
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(run)] == [3, 6]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in (run / "charts").iterdir()) == [
        "grad_norm.png",
        "loss.png",
        "lr.png",
        "throughput.png",
    ]
    json.loads((ckpt.latest_checkpoint(run) / "meta.json").read_text())
    # One record of the run, written by process 0: one event file, one line a step.
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "train/loss" in r] == list(range(1, 7))


def _slurm_job_port() -> tuple[int, int]:
    """(SLURM_JOB_ID, port) with the port free: JAX's SLURM detection takes the coordinator's port from the
    job id, 61440 + id % 4096 (jax/_src/clusters/slurm_cluster.py)."""
    for offset in range(_free_port() % 4096, _free_port() % 4096 + 4096):
        port = 61440 + offset % 4096
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 1000 * 4096 + offset % 4096, port
    raise AssertionError("no free port in 61440-65535")


def test_distributed_auto_under_slurm_matches_single_process(tmp_path: Path, data_root: Path, reference: Path) -> None:
    """--distributed-auto as `srun -n 2 uv run train.py ...` starts it on one node: JAX's cluster
    detection reads the coordinator (first node of SLURM_STEP_NODELIST, port from SLURM_JOB_ID), the
    process count (SLURM_NTASKS) and this process's id (SLURM_PROCID, SLURM_LOCALID)."""
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    job, _port = _slurm_job_port()
    slurm = {"SLURM_JOB_ID": str(job), "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NTASKS": "2"}
    slurm |= {"SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "1"}
    procs = [
        run_subprocess(run, data_root, 2, "--distributed-auto", env=slurm | {"SLURM_PROCID": i, "SLURM_LOCALID": i})
        for i in ("0", "1")
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "Training complete" in outs[0] and "Training complete" not in outs[1]
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["mesh"] == {"data": 4, "model": 1, "processes": 2}
    np.testing.assert_allclose(losses(run), losses(reference), rtol=0, atol=1e-5)


def test_a_microbatch_the_data_axis_does_not_divide_names_the_run(tmp_path: Path, data_root: Path) -> None:
    run = write_run(tmp_path / "odd", MODEL, {**TRAIN, "microbatch_size": 7})
    out, _ = run_subprocess(run, data_root, 2).communicate(timeout=600)
    (line,) = [x for x in out.splitlines() if x.startswith("error: ")]
    assert line == (f"error: {run}/train.json: microbatch_size=7 does not divide by the mesh data axis (2 devices)"), (
        out
    )


def test_mesh_errors_before_compiling(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "bad", MODEL, {**TRAIN, "mesh": {"data": 3}})
    assert train.main([str(run), "--data-dir", str(data_root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "mesh data=3" in err and "\n" not in err
