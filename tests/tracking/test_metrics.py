"""Watching a run: TensorBoard event files (read back with TensorBoard's own reader and served
by a real `tensorboard`), metrics.jsonl, clean curves after a kill -9 and a resume, MFU's FLOP
count, and `--profile` traces TensorBoard's profile plugin lists. Real runs, files and servers."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SLOW, wait_for_step, write_run
from tensorboard.backend.event_processing import event_accumulator

import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.config import ModelConfig
from jaxgpt.tracking import metrics
from jaxgpt.tracking.history import read_record
from jaxgpt.training import mfu

MODEL = {
    "architecture": "gpt2",
    "vocab_size": 257,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 2,
    "n_layers": 1,
    "qkv_bias": True,
    "drop_rate": 0.0,
}
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "gradient_accumulation_steps": 2,
    "train_steps": 12,
    "learning_rate": 0.003,
    "checkpoint_interval": 6,
    "validation_interval": 3,
    "validation_batches": 1,
    "keep_last_checkpoints": 3,
}
# Only when asked for: HellaSwag (hellaswag_interval), CORE (core_interval), tokens to target (target_val_loss) and the
# other parts' rates and momentum of optimizer "muon" (test_muon_update.py checks those).
WHEN_ASKED = ("hellaswag/", "core/", "target/", "optim/lr_", "optim/muon_")
PER_STEP = [tag for tag in metrics.TAGS if not tag.startswith(("val/", *WHEN_ASKED))]
ALWAYS = [tag for tag in metrics.TAGS if not tag.startswith(WHEN_ASKED)]


def run_main(run_dir: Path, data_root: Path, *extra: str) -> int:
    return train.main([str(run_dir), "--data-dir", str(data_root), *extra])


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run as TensorBoard's EventAccumulator reads it (purges applied)."""
    acc = event_accumulator.EventAccumulator(
        str(run_dir / metrics.TENSORBOARD_DIR), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def per_step_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    losses.update(zip(*read_record(run_dir).series("train/loss")))
    return losses


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    run = write_run(tmp_path_factory.mktemp("short") / "run", MODEL, TRAIN)
    assert run_main(run, data_root) == 0
    return run


def test_a_run_writes_every_tag_once_a_step_and_the_same_to_metrics_jsonl(short_run: Path) -> None:
    tb = scalars(short_run)
    assert set(tb) == set(ALWAYS)
    for tag in PER_STEP:
        assert [s for s, _ in tb[tag]] == list(range(1, 13)), tag
    assert [s for s, _ in tb["val/loss"]] == [3, 6, 9, 12]
    assert {v for _, v in tb["val/tokens"]} == {1 * 4 * 32}  # validation_batches x B x T targets

    # The values are the loop's: the per-step loss the record keeps, to float32 (TensorBoard's type).
    loss = per_step_losses(short_run)
    np.testing.assert_allclose([v for _, v in tb["train/loss"]], [loss[s] for s in range(1, 13)], rtol=1e-6)
    for ckpt in cf.list_checkpoints(short_run):  # each checkpoint's val_loss is the validation at its step
        meta = cf.read_meta(ckpt)
        assert meta["val_loss"] == pytest.approx(dict(tb["val/loss"])[meta["step"]], rel=1e-6)

    lines = metrics.read_metrics(short_run / metrics.METRICS_FILE)
    steps = [r for r in lines if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    for tag in PER_STEP:
        np.testing.assert_allclose([r[tag] for r in steps], [v for _, v in tb[tag]], rtol=1e-6, err_msg=tag)
    assert [r["step"] for r in lines if "val/loss" in r] == [3, 6, 9, 12]

    # perf/mfu is tokens/s x FLOPs per token / peak, with the peak recorded in meta.json.
    meta = json.loads((cf.latest_checkpoint(short_run) / "meta.json").read_text())
    for r in steps:
        assert r["perf/tokens_per_s"] == pytest.approx(
            TRAIN["gradient_accumulation_steps"] * 4 * 32 / r["perf/step_time_s"]
        )
        assert r["perf/mfu"] == pytest.approx(r["perf/tokens_per_s"] * meta["flops_per_token"] / meta["peak_flops"])
    assert 0 < meta["mfu"] < 1 and meta["peak_flops_source"]
    assert "series" not in meta and meta["format"] == 2  # every step's figures are the record's alone
    # The record names every checkpoint at its step, after that step's lines, and starts with the configs.
    assert [(r["step"], r["checkpoint"]) for r in lines if "checkpoint" in r] == [
        (cf.step_of(c), c.name) for c in cf.list_checkpoints(short_run)
    ]
    assert lines[0]["step"] == 0 and set(lines[0]["configs"]) == {"model.json", "train.json"}
    for r in steps:
        assert r["train/loss_min"] <= r["train/loss"] <= r["train/loss_max"]
        assert r["train/tokens"] == r["step"] * TRAIN["gradient_accumulation_steps"] * 4 * 32


def test_the_resolved_configs_are_in_tensorboard_as_text(short_run: Path) -> None:
    acc = event_accumulator.EventAccumulator(str(short_run / metrics.TENSORBOARD_DIR))
    acc.Reload()
    # tensorboardX's add_text names the text plugin's tag <tag>/text_summary.
    assert {"config/model.json/text_summary", "config/train.json/text_summary"} <= set(acc.Tags()["tensors"])
    (event,) = acc.Tensors("config/train.json/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert json.loads(text.removeprefix("```json\n").removesuffix("\n```"))["validation_interval"] == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, deadline: float):
    """GET url until it answers 200 with a non-empty JSON body (the server loads the logs in the background)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                data = response.read()
                # the profile plugin gzips its answers whatever the request accepts
                body = json.loads(gzip.decompress(data) if response.headers.get("Content-Encoding") == "gzip" else data)
                if body:
                    return body
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} gave no data in time")
        time.sleep(0.5)


def tensorboard_server(logdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "tensorboard"),
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--reload_interval",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def test_a_tensorboard_server_answers_the_scalars_api_with_every_tag_and_step(short_run: Path) -> None:
    proc, url = tensorboard_server(short_run.parent)  # as `tensorboard --logdir runs`
    try:
        deadline = time.monotonic() + 180
        tags = get_json(f"{url}/data/plugin/scalars/tags", deadline)
        assert set(tags["run/tensorboard"]) == set(ALWAYS)
        for tag in [*PER_STEP, "val/loss"]:
            points = get_json(f"{url}/data/plugin/scalars/scalars?run=run/tensorboard&tag={tag}", deadline)
            assert [step for _, step, _ in points] == (list(range(1, 13)) if tag in PER_STEP else [3, 6, 9, 12])
        loss = per_step_losses(short_run)
        points = get_json(f"{url}/data/plugin/scalars/scalars?run=run/tensorboard&tag=train/loss", deadline)
        np.testing.assert_allclose([v for _, _, v in points], [loss[s] for s in range(1, 13)], rtol=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ----------------------------------------------------------------------------- resume

LONG = {**TRAIN, "train_steps": 120, "checkpoint_interval": 10, "validation_interval": 2}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    run = write_run(tmp_path_factory.mktemp("straight") / "run", MODEL, LONG)
    assert run_main(run, data_root) == 0
    return run


def logged_steps(run_dir: Path) -> set[int]:
    """train/loss steps already on disk in the event files (no purging: what a kill leaves)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = set()
    for path in (run_dir / metrics.TENSORBOARD_DIR).glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            if any(v.tag == "train/loss" for v in event.summary.value):
                steps.add(event.step)
    return steps


@SLOW  # a training subprocess killed and resumed
def test_a_run_killed_between_checkpoints_and_resumed_has_one_value_a_step(
    tmp_path: Path, data_root: Path, straight: Path
) -> None:
    run = write_run(tmp_path / "run", MODEL, LONG)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for_step(run, proc, 10)
    deadline = time.monotonic() + 300  # until steps past the latest checkpoint are on disk
    while not logged_steps(run) or max(logged_steps(run)) <= cf.step_of(cf.latest_checkpoint(run)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    resumed_from = cf.step_of(cf.latest_checkpoint(run))
    assert max(logged_steps(run)) > resumed_from < 120  # the kill left steps the resume trains again
    with open(run / metrics.METRICS_FILE, "ab") as f:
        f.write(b'{"step": 999, "train/lo')  # and a line torn mid-write

    assert run_main(run, data_root) == 0
    a, b = scalars(run), scalars(straight)
    assert set(a) == set(b) == set(ALWAYS)
    for tag in [*PER_STEP, "val/loss"]:
        assert [s for s, _ in a[tag]] == [s for s, _ in b[tag]], tag  # each step once, in order
    for tag in ("train/loss", "optim/lr", "optim/grad_norm", "val/loss"):
        assert [v for _, v in a[tag]] == [v for _, v in b[tag]], tag  # exact resume: the same values
    lines = [r for r in metrics.read_metrics(run / metrics.METRICS_FILE) if "train/loss" in r]
    assert [r["step"] for r in lines] == list(range(1, 121))
    assert [r["train/loss"] for r in lines] == [
        r["train/loss"] for r in metrics.read_metrics(straight / metrics.METRICS_FILE) if "train/loss" in r
    ]
    proc, url = tensorboard_server(run)  # and what a user watching the run sees
    try:
        points = get_json(f"{url}/data/plugin/scalars/scalars?run=tensorboard&tag=train/loss", time.monotonic() + 180)
        assert [step for _, step, _ in points] == list(range(1, 121))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_cut_back_keeps_the_resumed_steps_and_drops_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 2, "val/loss": 3}\n{"step": 3, "a": 3}\n{"step": 4, "a"'
    )
    metrics.cut_back(path, 2)
    assert path.read_bytes() == b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 2, "val/loss": 3}\n'
    metrics.cut_back(path, 0)  # a fresh start (or --restart's step 0) keeps nothing
    assert path.read_bytes() == b""


@SLOW  # two trainings end to end
def test_restart_moves_the_old_records_aside_with_the_checkpoints(
    tmp_path: Path, data_root: Path, short_run: Path
) -> None:
    run = tmp_path / "run"
    import shutil

    shutil.copytree(short_run, run, symlinks=True)
    assert run_main(run, data_root, "--restart") == 0
    (old,) = run.glob("checkpoints.old-*")
    assert len(metrics.read_metrics(old / metrics.METRICS_FILE)) == len(
        metrics.read_metrics(run / metrics.METRICS_FILE)
    )
    assert [s for s, _ in scalars(run)["train/loss"]] == list(range(1, 13))  # not 1..12 twice


# ----------------------------------------------------------------------------- MFU


def test_flops_per_token_of_gpt2_124m_is_6n_plus_the_attention_term() -> None:
    """GPT-2 124M at T = 1024, by hand: N = the matmul weights, 12 layers x (qkv 3 + proj 1 + MLP 8)
    x 768^2 = 84,934,656, plus the (tied) head 50,257 x 768 = 38,597,376: N = 123,532,032
    (nanoGPT's get_num_params would also count biases, LayerNorms and wte's lookup, which do no
    matmul FLOPs). Attention: 12 L T C = 12 x 12 x 1024 x 768 = 113,246,208, the full T x T square
    (PaLM / nanoGPT's estimate_mfu: not halved for the causal mask). 6N + 12LTC = 854,438,400."""
    gpt2 = ModelConfig(
        architecture="gpt2", vocab_size=50257, context_length=1024, emb_dim=768, n_heads=12, n_layers=12, qkv_bias=True
    )
    assert mfu.flops_per_token(gpt2, 1024) == 6 * 123_532_032 + 113_246_208 == 854_438_400
    # And N is what the built model holds: all of its parameters less biases, LayerNorms and wpe.
    import jax
    from flax import nnx

    from jaxgpt.model.gpt import build_model

    state = nnx.state(nnx.eval_shape(lambda: build_model(gpt2, seed=0)), nnx.Param)
    sizes = {
        jax.tree_util.keystr(path): int(np.prod(leaf.shape))
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    }
    matmul = sum(n for name, n in sizes.items() if "kernel" in name)  # blocks and the untied head
    assert any("head" in name for name in sizes) and sum(n for name, n in sizes.items() if "bias" in name) > 0
    assert matmul == 123_532_032, sizes.keys()


@SLOW  # the peak measured three times: 3x5 float32 matmuls of 2048^3 each
def test_the_peak_is_measured_once_dated_and_only_ever_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path))
    first, source = mfu.peak_flops("float32")
    assert first > 1e9 and source.startswith("measured: best float32 2048^3 matmul of 3x5")  # no spec sheet: a CPU
    ((key, record),) = json.loads((tmp_path / "peak_flops.json").read_text()).items()
    assert "float32" in key and record["flops"] == first and record["cpu"] and record["date"] in source
    store = tmp_path / "peak_flops.json"
    store.write_text(json.dumps({key: record | {"flops": 4 * first}}))  # a dated figure is what is used
    assert mfu.peak_flops("float32")[0] == 4 * first
    # An older cache's undated figure, measured once on a busy machine, is measured again and raised.
    store.write_text(json.dumps({key: 12345.0}))
    again = mfu.peak_flops("float32")[0]
    assert again > 1e9 and json.loads(store.read_text())[key]["flops"] == again
    # Measuring again (python -m jaxgpt.training.mfu) and a run's achieved rate only ever raise it.
    store.write_text(json.dumps({key: record | {"flops": 12345.0}}))
    assert mfu.peak_flops("float32", measure=True)[0] > 1e9
    assert mfu.raise_peak("float32", 10.0) is None
    raised, source = mfu.raise_peak("float32", 1e15)
    assert raised == 1e15 == json.loads(store.read_text())[key]["flops"] and source.startswith("raised")
    assert mfu.mfu(tokens_per_s=1e9, per_token=1e9, peak=1e15) == 1.0  # a step timed short: at most 100%


@SLOW  # a training run
def test_a_run_faster_than_a_stored_low_peak_raises_it_and_mfu_stays_at_most_1(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peak measured while the machine was busy (here 1 MFLOP/s) read MFU 114% and 160%: the run's
    rate over a checkpoint's window becomes the stored peak, and no figure exceeds 1."""
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    low = {"flops": 1e6, "date": "2026-01-01", "cpu": "busy", "how": "measured"}
    keys = [mfu._measured_key(dtype)[0] for dtype in ("float32", "bfloat16")]
    (tmp_path / "cache" / "peak_flops.json").write_text(json.dumps(dict.fromkeys(keys, low)))
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    assert run_main(run, data_root) == 0
    steps = [r for r in metrics.read_metrics(run / metrics.METRICS_FILE) if "perf/mfu" in r]
    assert len(steps) == 12 and max(r["perf/mfu"] for r in steps) <= 1.0
    for ckpt in cf.list_checkpoints(run):
        meta = cf.read_meta(ckpt)
        assert 0 < meta["mfu"] <= 1.0 and meta["peak_flops"] > 1e6 and meta["peak_flops_source"].startswith("raised")
    stored = json.loads((tmp_path / "cache" / "peak_flops.json").read_text())
    assert max(r["flops"] for r in stored.values()) == cf.read_meta(cf.latest_checkpoint(run))["peak_flops"]


# ----------------------------------------------------------------------------- profiler


@SLOW  # a profiled training and the Profile tab
def test_profile_writes_a_trace_the_tensorboard_profile_plugin_lists(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    assert run_main(run, data_root, "--profile", "4:7") == 0
    assert "Profile of steps 4:7 written" in capsys.readouterr().out
    (trace,) = (run / "profile" / "plugins" / "profile").glob("*/*.xplane.pb")
    assert trace.stat().st_size > 0
    proc, url = tensorboard_server(run / "profile")
    try:
        sessions = get_json(f"{url}/data/plugin/profile/runs", time.monotonic() + 180)
        assert sessions == [f"./{trace.parent.name}"] or sessions == [trace.parent.name], sessions
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.parametrize("value", ["7", "5:3", "a:b", "-1:2"])
def test_a_bad_profile_range_is_one_line_before_anything(tmp_path: Path, data_root: Path, capsys, value) -> None:
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    with pytest.raises(SystemExit) as exc:
        run_main(run, data_root, "--profile", value)
    assert exc.value.code == 2 and "START:STOP" in capsys.readouterr().err
    assert not (run / "checkpoints").exists()


def test_a_profile_range_past_the_run_is_refused(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    assert run_main(run, data_root, "--profile", "10:13") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--profile 10:13" in err and "12 steps" in err
