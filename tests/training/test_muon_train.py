"""optimizer "muon" end to end through train.py: the routing table printed and recorded, every
part's rate logged (on a warmup-stable-decay schedule), exact resume (weights, optimiser state, per-step
losses), restoring onto other
mesh shapes (data, model, FSDP), and a changed optimizer refused on resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from checkpoint_helpers import flat, same_bits
from conftest import write_run
from test_mesh import losses

import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import load_run_configs
from jaxgpt.model.gpt import build_model
from jaxgpt.tracking import metrics
from jaxgpt.training.optimizer import make_optimizer, make_schedule, peak_rates

# Not in the fast tier (-m "not slow"): Muon runs end to end through train.py (test_muon_update.py checks the update).
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
    "checkpoint_interval": 3,
    "validation_batches": 1,
    "keep_last_checkpoints": 10,
    "optimizer": "muon",
    "warmup_percent": 34,
    "schedule": "wsd",
    "cooldown_percent": 50,
    "muon": {
        "momentum_warmup_steps": 4,
        "embed_learning_rate": 0.02,
        "head_learning_rate": 0.005,
        "scalar_learning_rate": 0.004,
    },
}


def run_main(run_dir: Path, data_root: Path) -> int:
    return train.main([str(run_dir), "--data-dir", str(data_root)])


def restored(ckpt_dir: Path, run_dir: Path) -> tuple[dict, dict]:
    """Weights and optimiser state of a checkpoint, restored into a fresh muon optimiser."""
    model_cfg, train_cfg = load_run_configs(run_dir)
    model = build_model(model_cfg, seed=99)
    optimizer = make_optimizer(model, train_cfg, train_cfg.total_steps(model_cfg))
    ckpt.load_checkpoint(ckpt_dir, model, optimizer)
    return flat(model), flat(optimizer)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, str]:
    """The single-device muon run everything else must match, and what it printed."""
    import contextlib
    import io

    run = write_run(tmp_path_factory.mktemp("muon") / "run", MODEL, TRAIN)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_main(run, data_root) == 0
    return run, out.getvalue()


def test_the_run_prints_records_and_logs_every_part(reference: tuple[Path, str]) -> None:
    run, out = reference
    assert "optimizer muon: parameters by part" in out and "qkv.kernel (as 3 matrices)" in out
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["optimizer"] == "muon"
    assert {p: e["tensors"] for p, e in meta["routing"].items()} == {"muon": 8, "embed": 2, "head": 1, "scalar": 18}
    _, cfg = load_run_configs(run)
    peaks = peak_rates(cfg)
    assert peaks == {"muon": 0.02, "embed": 0.02, "head": 0.005, "scalar": 0.004}  # muon's rate resolved
    saved = json.loads((ckpt.latest_checkpoint(run) / "train.json").read_text())
    assert (saved["learning_rate"], saved["weight_decay"], saved["muon"]["momentum"]) == (0.02, 0.0, 0.95)
    lines = [r for r in metrics.read_metrics(run / metrics.METRICS_FILE) if "train/loss" in r]
    assert [r["step"] for r in lines] == list(range(1, 7))
    tags = {"muon": "optim/lr", "embed": "optim/lr_embed", "head": "optim/lr_head", "scalar": "optim/lr_scalar"}
    for r in lines:  # the rate the update of step r["step"] used: the schedule at step - 1
        for part, tag in tags.items():
            assert r[tag] == pytest.approx(float(make_schedule(cfg, 6, peaks[part])(r["step"] - 1)), rel=1e-6), (tag, r)
        assert r["optim/muon_momentum"] == pytest.approx(0.85 + 0.1 * min(r["step"] - 1, 4) / 4, rel=1e-6)
    # warm-up (steps 1, 2), peak (3, 4), cool-down (5, 6): the check above can tell the steps apart
    assert (
        lines[0]["optim/lr"] < lines[1]["optim/lr"] < lines[2]["optim/lr"] > lines[4]["optim/lr"] > lines[5]["optim/lr"]
    )
    assert meta["learning_rates"]["embed"] == pytest.approx(lines[-1]["optim/lr_embed"])


def test_resume_from_a_checkpoint_is_exact(tmp_path: Path, data_root: Path, reference: tuple[Path, str]) -> None:
    """From the step-3 checkpoint, the rest of the run is the uninterrupted one to the bit:
    per-step losses, weights and Muon's (viewed) momentum alike."""
    straight = reference[0]
    step3 = next(p for p in ckpt.list_checkpoints(straight) if ckpt.step_of(p) == 3)
    run = write_run(tmp_path / "resumed", MODEL, TRAIN)
    shutil.copytree(step3, run / "checkpoints" / step3.name)
    assert run_main(run, data_root) == 0
    np.testing.assert_array_equal(losses(run), losses(straight, after=3))
    assert len(losses(run)) == 3
    weights_a, state_a = restored(ckpt.latest_checkpoint(run), run)
    weights_b, state_b = restored(ckpt.latest_checkpoint(straight), straight)
    assert weights_a.keys() == weights_b.keys() and state_a.keys() == state_b.keys()
    for a, b in ((weights_a, weights_b), (state_a, state_b)):
        for key in a:
            assert same_bits(a[key], b[key]), key
    (mu,) = [k for k in state_a if k.endswith("muon/inner_state/0/mu/blocks/0/attn/qkv/kernel")]
    assert state_a[mu].shape == (32, 3, 32) and np.any(state_a[mu] != 0)


def test_a_changed_optimizer_is_refused_on_resume(
    tmp_path: Path, data_root: Path, reference: tuple[Path, str], capsys
) -> None:
    run = tmp_path / "changed"
    shutil.copytree(reference[0], run, symlinks=True)
    write_run(run, MODEL, {k: v for k, v in TRAIN.items() if k != "muon"} | {"optimizer": "adamw", "train_steps": 8})
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "optimizer='adamw'" in err and "optimizer='muon'" in err and "--restart" in err


# Muon on meshes (4 x 2 FSDP, resumed on 8 x 1 and one device): tests/distributed/test_mesh.py, with the modern model.
