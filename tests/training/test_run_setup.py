"""The run set-up (jaxgpt/training/run.py) runs before JAX: proven in fresh interpreters.
The import graph is test_layout.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, write_run

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax")


def run_fresh(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh interpreter (the repository on its path); it prints one JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "JAXGPT_DATA_DIR": str(tmp_path / "data"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # a Python whose packages it names (a TPU VM's)
        },
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


PROBE = """
import json, sys, time
import train
started = time.perf_counter()
{body}
took = time.perf_counter() - started
print(json.dumps({{"heavy": sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}), "took": took, **out}}))
"""


def test_a_bad_config_errors_in_well_under_a_second_without_jax(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path / "run",
        {"architecture": "gpt2", "emb_dim": 64, "n_heads": 3},
        {"microbatch_size": 2, "train_steps": 1},
    )
    body = f"rc = train.main([{str(run_dir)!r}]); out = {{'rc': rc}}"
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["rc"] == 2 and r["heavy"] == [] and r["took"] < 1.0, r


def test_a_whole_run_is_prepared_and_checked_without_jax(tmp_path: Path) -> None:
    """prepare_run builds the dataset, checks every token id against the model and finds the resume
    point, and JAX has still not been imported: train.py imports it only to train."""
    run_dir = write_run(
        tmp_path / "run",
        {"architecture": "gpt2", "vocab_size": 257, "context_length": 32, "emb_dim": 16, "n_heads": 2, "n_layers": 1},
        {"microbatch_size": 2, "train_steps": 3},
    )
    body = (
        f"from jaxgpt.training import run as run_setup; from pathlib import Path\n"
        f"run = run_setup.prepare_run(Path({str(run_dir)!r}), data_root=Path({str(tmp_path / 'data')!r}), "
        f"restart=False)\nout = {{'steps': run.total_steps, 'windows': run.train_batches.n_windows}}"
    )
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["heavy"] == [] and r["steps"] == 3 and r["windows"] > 0, r


def test_an_out_of_range_token_id_is_refused_before_jax(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path / "run",
        {"architecture": "gpt2", "vocab_size": 100, "context_length": 32, "emb_dim": 16, "n_heads": 2, "n_layers": 1},
        {"microbatch_size": 2, "train_steps": 3},
    )
    body = f"rc = train.main([{str(run_dir)!r}]); out = {{'rc': rc}}"
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["rc"] == 2 and r["heavy"] == [], r
