"""End-to-end: train.py on tiny runs: convergence, exact resume after SIGINT, input errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SLOW, TINY_MODEL, TINY_TRAIN, wait_for_step, write_run
from safetensors.numpy import load_file

import test_a_to_a
import test_generation
import train
from jaxgpt import ops
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ModelConfig
from jaxgpt.tracking.history import read_record

A_TO_A_MODEL = {"architecture": "a-to-a", "vocab_size": 257, "context_length": 64, "emb_dim": 64}
A_TO_A_TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "targets": "same",
    "microbatch_size": 8,
    "gradient_accumulation_steps": 2,
    "train_steps": 300,
    "learning_rate": 0.02,
    "weight_decay": 0.0,
    "checkpoint_interval": 100,
    "validation_batches": 2,
    "keep_last_checkpoints": 2,
    "charts_log_y": True,
}
GPT_MODEL = TINY_MODEL
GPT_TRAIN = TINY_TRAIN


def run_main(run_dir: Path, data_root: Path, *extra: str) -> int:
    return train.main([str(run_dir), "--data-dir", str(data_root), *extra])


def per_step_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    losses.update(zip(*read_record(run_dir).series("train/loss")))
    return losses


def test_a_to_a_converges_and_reproduces_the_stanza(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "a-to-a", A_TO_A_MODEL, A_TO_A_TRAIN)
    assert run_main(run, data_root) == 0
    out = capsys.readouterr().out
    assert "Training complete" in out and "Final train loss" in out
    latest = ckpt.latest_checkpoint(run)
    meta = ckpt.read_meta(latest)
    assert meta["step"] == 300 and meta["tokens_seen"] == 300 * 2 * 8 * 64
    assert meta["train_loss"]["last"] < 0.01, meta["train_loss"]
    assert meta["val_loss"] < 0.01
    # keep_last=2 plus the best; the record keeps every step of the pruned ones for the charts
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(run)] == [200, 300]
    assert sorted(per_step_losses(run)) == list(range(1, 301))
    assert (run / "checkpoints" / "best").is_symlink()
    for chart in ("loss.png", "lr.png", "grad_norm.png"):
        assert (run / "charts" / chart).stat().st_size > 1000
    assert test_a_to_a.main([str(run)]) == 0
    assert "Reproduced exactly." in capsys.readouterr().out
    # Rerunning a finished run trains nothing and changes nothing.
    assert run_main(run, data_root) == 0
    assert ckpt.latest_checkpoint(run) == latest


@pytest.mark.parametrize("pace, drawn_at", [pytest.param(0, [10, 20, 30, 40], marks=SLOW), (10**9, [10, 40])])
def test_charts_are_redrawn_at_a_pace_and_always_at_the_last_checkpoint(
    tmp_path: Path, data_root: Path, monkeypatch, capsys, pace, drawn_at
) -> None:
    """A checkpoint redraws the charts once charts_pace x the last draw's time has passed, and
    always at the session's last checkpoint; the charts it leaves are those of the whole run."""
    import charts
    from jaxgpt.stopping import StopFlag
    from jaxgpt.training import loop
    from jaxgpt.training.run import prepare_run

    steps: list[int] = []
    draw = charts.draw_charts

    def counted(run_dir: Path, **kwargs):
        steps.append(ckpt.step_of(ckpt.latest_checkpoint(run_dir)))
        return draw(run_dir, **kwargs)

    monkeypatch.setattr(loop.charts, "draw_charts", counted)  # the real drawing, counted
    run = write_run(tmp_path / "a-to-a", A_TO_A_MODEL, A_TO_A_TRAIN | {"train_steps": 40, "checkpoint_interval": 10})
    with StopFlag() as stop:
        assert loop.train(prepare_run(run, data_root=data_root, restart=False), stop, charts_pace=pace) == 0
    capsys.readouterr()
    assert steps == drawn_at
    left = {p.name: p.read_bytes() for p in sorted((run / "charts").iterdir())}
    assert left == {p.name: p.read_bytes() for p in draw(run, log_y=True)}  # nothing the last draw missed


@SLOW  # a training subprocess stopped by SIGINT and resumed
def test_sigint_then_resume_matches_uninterrupted_run(tmp_path: Path, data_root: Path) -> None:
    interrupted = write_run(tmp_path / "interrupted", GPT_MODEL, GPT_TRAIN)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(interrupted), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_step(interrupted, proc, 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    assert f"Resume with: uv run train.py {interrupted}" in out
    stopped_at = ckpt.step_of(ckpt.latest_checkpoint(interrupted))
    assert 20 <= stopped_at < 120, "the run finished before the signal: make it longer"

    assert run_main(interrupted, data_root) == 0  # resume to the end
    straight = write_run(tmp_path / "straight", GPT_MODEL, GPT_TRAIN)
    assert run_main(straight, data_root) == 0

    a, b = per_step_losses(interrupted), per_step_losses(straight)
    assert sorted(a) == sorted(b) == list(range(1, 121))
    np.testing.assert_array_equal([a[s] for s in sorted(a)], [b[s] for s in sorted(b)])
    wa = load_file(str(ckpt.latest_checkpoint(interrupted) / "model.safetensors"))
    wb = load_file(str(ckpt.latest_checkpoint(straight) / "model.safetensors"))
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)
    meta = ckpt.read_meta(ckpt.latest_checkpoint(interrupted))
    assert meta["data_position"]["next_step"] == 120 and meta["learning_rate"] > 0
    assert test_generation.main([str(interrupted), "--max-new-tokens", "5"]) == 0


@SLOW  # two trainings end to end
def test_restart_moves_old_checkpoints_aside(tmp_path: Path, data_root: Path) -> None:
    run = write_run(tmp_path / "r", A_TO_A_MODEL, {**A_TO_A_TRAIN, "train_steps": 2, "checkpoint_interval": 1})
    assert run_main(run, data_root) == 0
    first = ckpt.latest_checkpoint(run)
    assert run_main(run, data_root, "--restart") == 0
    old = list(tmp_path.joinpath("r").glob("checkpoints.old-*"))
    assert len(old) == 1 and (old[0] / first.name / "model.safetensors").is_file()
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 2


BAD_INPUTS = [
    # (what, model overrides, train overrides, words the one-line error must contain)
    ("unknown key", {}, {"learning_rat": 0.1}, ["train.json", "learning_rat"]),
    ("vocab below tokenizer", {"vocab_size": 100}, {}, ["model.json", "vocab_size=100"]),
    ("unknown source", {}, {"dataset": {"source": "nope"}}, ["nope"]),
    ("dataset too small", {}, {"microbatch_size": 100000}, ["train split", "100000"]),
    ("batch does not divide", {}, {"batch_size": 5}, ["train.json", "batch_size=5"]),
    ("sequence too long", {}, {"sequence_length": 65}, ["train.json", "sequence_length=65"]),
    ("cudnn without a GPU", {"attention": "cudnn", "compute_dtype": "bfloat16"}, {}, ["model.json", "cudnn", "GPU"]),
    ("zero loss chunk", {"loss_chunk": 0}, {}, ["model.json", "loss_chunk=0"]),
    ("muon without matrices", {}, {"optimizer": "muon"}, ["train.json", "optimizer='muon'", "a-to-a"]),
]


@pytest.mark.parametrize("what,model,train_cfg,words", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_error(tmp_path: Path, data_root: Path, capsys, what, model, train_cfg, words) -> None:
    run = write_run(tmp_path / "bad", {**A_TO_A_MODEL, **model}, {**A_TO_A_TRAIN, **train_cfg})
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for word in [str(run), *words]:  # which run's file, then what in it
        assert word in err, (word, err)
    assert not (run / "checkpoints").exists()


@SLOW  # trainings end to end
def test_corrupt_or_mismatched_checkpoint_is_reported_and_kept(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "c", A_TO_A_MODEL, {**A_TO_A_TRAIN, "train_steps": 2, "checkpoint_interval": 1})
    assert run_main(run, data_root) == 0
    latest = ckpt.latest_checkpoint(run)
    capsys.readouterr()
    # model.json changed under an existing checkpoint: refuse, naming the key, touch nothing.
    write_run(run, {**A_TO_A_MODEL, "emb_dim": 96}, {**A_TO_A_TRAIN, "train_steps": 4, "checkpoint_interval": 1})
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err
    assert f"{run}/model.json: emb_dim=96" in err and latest.name in err  # which run's file, which key
    # A corrupt meta.json in the latest checkpoint: it is set aside as it is (one line says so)
    # and the run resumes from the checkpoint before it.
    write_run(run, A_TO_A_MODEL, {**A_TO_A_TRAIN, "train_steps": 4, "checkpoint_interval": 1})
    (latest / "meta.json").write_text("{not json")
    assert run_main(run, data_root) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {latest.name} is damaged" in err and "meta.json" in err
    assert (latest.parent / f"corrupt-{latest.name}" / "meta.json").read_text() == "{not json"
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 4


@SLOW  # several trainings end to end
def test_speed_options_may_change_on_resume_and_old_checkpoints_resume(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "o", A_TO_A_MODEL, {**A_TO_A_TRAIN, "train_steps": 2, "checkpoint_interval": 1})
    assert run_main(run, data_root) == 0
    latest = ckpt.latest_checkpoint(run)
    # A checkpoint written before model.json had the speed options: its model.json lacks them.
    saved = json.loads((latest / "model.json").read_text())
    for key in ("compute_dtype", "attention", "remat", "scan_layers", "loss_chunk"):
        del saved[key]
    (latest / "model.json").write_text(json.dumps(saved))
    write_run(
        run,
        {**A_TO_A_MODEL, "compute_dtype": "bfloat16", "loss_chunk": 8},
        {**A_TO_A_TRAIN, "train_steps": 3, "checkpoint_interval": 1},
    )
    capsys.readouterr()
    assert run_main(run, data_root) == 0
    assert "compute_dtype='bfloat16'" in capsys.readouterr().out
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 3
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["compute_dtype"] == "bfloat16"
    # "auto" resolves once, on this backend, and the run records what it resolved to.
    write_run(
        run, {**A_TO_A_MODEL, "compute_dtype": "auto"}, {**A_TO_A_TRAIN, "train_steps": 4, "checkpoint_interval": 1}
    )
    assert run_main(run, data_root) == 0
    resolved = ops.select(ModelConfig(**A_TO_A_MODEL, compute_dtype="auto")).compute_dtype
    assert resolved in ("float32", "bfloat16") and f"compute_dtype auto -> {resolved} on cpu" in capsys.readouterr().out
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["compute_dtype"] == resolved
    # scan_layers changes the optimiser state's layout: refused, in one line, before compiling.
    write_run(run, {**A_TO_A_MODEL, "scan_layers": True}, {**A_TO_A_TRAIN, "train_steps": 5, "checkpoint_interval": 1})
    assert run_main(run, data_root) == 2
    assert "scan_layers=True" in capsys.readouterr().err


@SLOW  # two trainings end to end
def test_validation_all_scores_the_whole_split(tmp_path: Path, capsys) -> None:
    """validation_batches "all": the validation loss is over every token of the split but the first
    (data.WholeSplit), the count printed beside it and kept in meta.json, and equals evaluate.py's.
    hellaswag_interval: HellaSwag at that validation, in meta.json, charts/hellaswag.png and metrics.jsonl."""
    from test_hellaswag import fixture_records

    from jaxgpt.checkpoints.store import load_model
    from jaxgpt.data.storage.shards import open_dataset
    from jaxgpt.data.tokenizer import BytesTokenizer
    from jaxgpt.evaluation import hellaswag, scoring

    (tmp_path / "data" / "downloads").mkdir(parents=True)  # where train.py looks for the file offline
    (tmp_path / "data" / "downloads" / "hellaswag_val.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in fixture_records())
    )

    text = "".join(f"{i}: the quick brown fox jumps over the lazy dog\n" for i in range(400))
    (tmp_path / "corpus.txt").write_text(text)
    train_cfg = {
        **GPT_TRAIN,
        "dataset": {"source": "text", "options": {"paths": [str(tmp_path / "corpus.txt")]}},
        "train_steps": 2,
        "checkpoint_interval": 2,
        "validation_batches": "all",
        "hellaswag_interval": 2,
        "hellaswag_examples": 5,
    }
    run = write_run(tmp_path / "run", GPT_MODEL, train_cfg)
    assert run_main(run, tmp_path / "data") == 0
    val = open_dataset(tmp_path / "data" / "text-corpus-txt-bytes").val
    assert val.n_tokens % 32 != 1  # the last window is a short one
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["val_tokens"] == val.n_tokens - 1
    assert f"({val.n_tokens - 1:,} tokens)" in capsys.readouterr().out
    model, *_ = load_model(ckpt.latest_checkpoint(run))
    r = scoring.evaluate(model, BytesTokenizer(), val, batch_size=4, seq_len=32, progress=False)
    assert r["tokens"] == meta["val_tokens"] and r["loss"] == pytest.approx(meta["val_loss"], rel=1e-6)
    examples = hellaswag.read_examples(tmp_path / "data" / "downloads" / "hellaswag_val.jsonl", 5)
    h = scoring.hellaswag_score(model, examples, BytesTokenizer(), progress=False)
    assert meta["hellaswag"] == [
        {"step": 2, "acc": h["acc"], "acc_norm": h["acc_norm"], "examples": 5, "tokenizer": "bytes"}
    ]
    assert (run / "charts" / "hellaswag.png").stat().st_size > 1000
    # and in the run's records (metrics.jsonl; TensorBoard carries the same scalars)
    from jaxgpt.tracking import metrics

    lines = metrics.read_metrics(run / metrics.METRICS_FILE)
    assert [(r["hellaswag/acc"], r["hellaswag/acc_norm"]) for r in lines if "hellaswag/acc" in r] == [
        (h["acc"], h["acc_norm"])
    ]
    assert [r["val/tokens"] for r in lines if "val/tokens" in r] == [val.n_tokens - 1]
