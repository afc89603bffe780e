"""Never lose an interval: stop requests however delivered, one trainer per run directory, an
unwritable run found before compiling, bounded NaN storms with honest counters, damaged
checkpoints set aside, a stale `best` repaired. Real processes, real signals, real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np
import pytest
from conftest import ROOT, TINY_MODEL, TINY_TRAIN, wait_for_step, write_run
from safetensors.numpy import load_file

import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.data.errors import DataError
from jaxgpt.stopping import REPEAT_S, StopFlag
from jaxgpt.tracking.history import read_record
from jaxgpt.training import run as run_setup

# Not in the fast tier (-m "not slow"): real train.py processes stopped by real signals, killed, resumed.
pytestmark = pytest.mark.slow

MODEL = TINY_MODEL
TRAIN = {**TINY_TRAIN, "keep_last_checkpoints": 3}
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run_main(run_dir: Path, data_root: Path, *extra: str) -> int:
    return train.main([str(run_dir), "--data-dir", str(data_root), *extra])


def trainer(
    run_dir: Path, data_root: Path, *, uv: bool = False, stop_repeat_s: float | None = None, **kw
) -> subprocess.Popen:
    """train.py on run_dir in a process group of its own (as a scheduler or a service starts it);
    stop_repeat_s: what `python train.py` runs (train.script), with StopFlag's repeat_s set."""
    cmd = [sys.executable, str(ROOT / "train.py")]
    if stop_repeat_s is not None:
        cmd = [sys.executable, "-c", f"import train; train.script({stop_repeat_s!r})"]
    if uv:
        uv_bin = shutil.which("uv")
        assert uv_bin, "uv must be on PATH: the README's train command is `uv run train.py`"
        cmd = [uv_bin, "run", "--frozen", "train.py"]
    return subprocess.Popen(
        [*cmd, str(run_dir), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=kw.pop("env", ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )


def per_step_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    losses.update(zip(*read_record(run_dir).series("train/loss")))
    return losses


def final_weights(run_dir: Path) -> dict[str, np.ndarray]:
    return load_file(str(cf.latest_checkpoint(run_dir) / cf.WEIGHTS))


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """The uninterrupted 120-step run every interrupted one must equal."""
    run = write_run(tmp_path_factory.mktemp("straight") / "run", MODEL, TRAIN)
    assert run_main(run, data_root) == 0
    return run


# ----------------------------------------------------------------------------- 1. stop requests


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_saves_and_resumes_exactly(
    tmp_path: Path, data_root: Path, straight: Path, sig: signal.Signals
) -> None:
    """`kill -SIG -- -PGID` on `uv run train.py`: uv and python both get it, uv forwards its copy
    as well; all of it is one stop request: finish the step, save, exit 130."""
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    proc = trainer(run, data_root, uv=True)
    wait_for_step(run, proc, 20)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    stopped_at = cf.step_of(cf.latest_checkpoint(run))
    assert f"Interrupted after step {stopped_at}/120; checkpoint saved." in out, (out, err)
    assert 20 <= stopped_at < 120 and "Aborted" not in err and "Traceback" not in err, err

    assert run_main(run, data_root) == 0  # resume to the end
    a, b = per_step_losses(run), per_step_losses(straight)
    assert sorted(a) == sorted(b) == list(range(1, 121))
    np.testing.assert_array_equal([a[s] for s in sorted(a)], [b[s] for s in sorted(b)])
    wa, wb = final_weights(run), final_weights(straight)
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)


def test_repeats_of_one_request_never_abort_and_a_later_ctrl_c_does() -> None:
    now = [100.0]  # the flag's clock, moved by hand: no sleeping
    with StopFlag(clock=lambda: now[0]) as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the request ...
        os.kill(os.getpid(), signal.SIGINT)  # ... and its forwarded copy
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested  # (a handler runs before the next bytecode after os.kill)
        now[0] += REPEAT_S + 1
        os.kill(os.getpid(), signal.SIGTERM)  # SIGTERM never aborts (SIGKILL follows, if anything)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a distinct, later Ctrl-C


def read_lines(stream: IO[str], lines: list[str], seen: threading.Event, prefix: str) -> None:
    """Append each line of `stream` to `lines`; set `seen` at the first one starting with `prefix` (or at the end)."""
    for line in stream:
        lines.append(line)
        if line.startswith(prefix):
            seen.set()
    seen.set()


def test_a_deliberate_second_ctrl_c_aborts_in_one_line(tmp_path: Path, data_root: Path) -> None:
    """The second Ctrl-C, sent once the trainer has said it got the first, lands while the stop's
    validation runs: 4,000 batches, seconds against the milliseconds between the two (more would
    only lengthen the first checkpoint's validation). The StopFlag counts any later Ctrl-C as
    distinct (repeat_s 0)."""
    run = write_run(
        tmp_path / "run", MODEL, {**TRAIN, "train_steps": 100000, "checkpoint_interval": 5, "validation_batches": 4000}
    )
    proc = trainer(run, data_root, stop_repeat_s=0.0)
    wait_for_step(run, proc, 5)
    stderr: list[str] = []
    seen = threading.Event()
    reader = threading.Thread(target=read_lines, args=(proc.stderr, stderr, seen, "Stopping (SIGINT)"), daemon=True)
    reader.start()
    os.killpg(proc.pid, signal.SIGINT)
    assert seen.wait(timeout=300) and any(line.startswith("Stopping (SIGINT)") for line in stderr), stderr
    os.killpg(proc.pid, signal.SIGINT)  # the first was handled: this one is a second, deliberate Ctrl-C
    proc.wait(timeout=300)
    reader.join(timeout=60)
    out, err = proc.stdout.read(), "".join(stderr)
    assert proc.returncode == 130, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == f"Aborted without saving; {run}/checkpoints/latest is the last checkpoint.", err
    assert "Traceback" not in err and len(lines) <= 3, err  # the stop notice, the abort line
    assert cf.step_of(cf.latest_checkpoint(run)) == 5


# ----------------------------------------------------------------------------- 2. one trainer per run


def test_a_second_trainer_on_a_run_in_use_is_refused(tmp_path: Path, data_root: Path) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "train_steps": 60})
    first = trainer(run, data_root)
    wait_for_step(run, first, 10)
    second = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    err = second.stderr.strip()
    assert second.returncode == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "already being trained" in err and f"pid {first.pid}" in err and str(run) in err, err
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, (out, err)
    assert cf.step_of(cf.latest_checkpoint(run)) == 60
    assert sorted(per_step_losses(run)) == list(range(1, 61))


# ----------------------------------------------------------------------------- 3. unwritable runs


def unwritable_checkpoints(run: Path) -> None:
    """Make <run>/checkpoints a folder nobody may write: by mode, or, for root (whom modes do not
    stop), a link to sysfs, where not even root creates files."""
    if os.geteuid() != 0:
        run.chmod(0o555)
        return
    os.symlink("/sys/kernel", run / "checkpoints")
    try:
        (run / "checkpoints" / "probe").write_bytes(b"x")
    except OSError:
        return
    pytest.fail("/sys/kernel accepted a file: no unwritable folder to test with here")


def test_an_unwritable_run_directory_errors_before_any_compile(tmp_path: Path, data_root: Path) -> None:
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    unwritable_checkpoints(run)
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
            cwd=ROOT,
            env={**ENV, "JAX_LOG_COMPILES": "1"},
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    finally:
        run.chmod(0o755)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.startswith("error: ") and "\n" not in err, err  # no compile log line
    assert "cannot write" in err and str(run) in err, err


def test_no_room_for_one_checkpoint_is_refused_before_anything(tmp_path: Path, data_root: Path, capsys) -> None:
    """A model whose checkpoint (about 16 bytes a parameter) is larger than the free disk."""
    big = {**MODEL, "emb_dim": 16384, "n_heads": 128, "n_layers": 400}  # ~1.3T parameters: ~20 TB
    run = write_run(tmp_path / "run", big, TRAIN)
    assert run_setup.checkpoint_bytes(run_setup.load_run_configs(run)[0]) > shutil.disk_usage(tmp_path).free
    assert run_main(run, data_root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "MiB free, one checkpoint" in err, err
    assert not (run / "checkpoints").exists()


def test_a_failed_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path: Path, data_root: Path) -> None:
    """A real write failure: files may not grow past 40 kB (RLIMIT_FSIZE; python ignores
    SIGXFSZ, so the write fails with EFBIG), after a checkpoint saved without the limit."""
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "train_steps": 40})
    proc = trainer(run, data_root)
    wait_for_step(run, proc, 10)
    while not (run / "checkpoints" / "best").exists():  # latest is pointed first, best just after
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    good = cf.latest_checkpoint(run)
    before = sorted(p.name for p in (run / "checkpoints").iterdir())

    limited = ["bash", "-c", 'ulimit -f 40 && exec "$0" "$@"']  # 40 KiB per file (RLIMIT_FSIZE)
    done = subprocess.run(
        [*limited, sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    err = done.stderr.strip()
    assert done.returncode == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "cannot write the step 20 checkpoint" in err and f"checkpoints/latest is still {good.name}" in err, err
    assert cf.latest_checkpoint(run) == good and cf.verify_checkpoint(good) is None
    # The half-written folder is removed (Orbax's threads may still add to it as the process
    # ends: the next start removes what they left).
    left = {p.name for p in (run / "checkpoints").iterdir()} - set(before)
    assert all(name.startswith(".tmp-") for name in left), left
    assert run_main(run, data_root) == 0 and cf.step_of(cf.latest_checkpoint(run)) == 40
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())


# ----------------------------------------------------------------------------- 4. NaN storms


def test_a_nan_storm_stops_at_the_bound_with_latest_on_the_last_good_checkpoint(
    tmp_path: Path, data_root: Path
) -> None:
    run = write_run(
        tmp_path / "run", MODEL, {**TRAIN, "learning_rate": 1e6, "checkpoint_interval": 1, "max_dropped_steps": 5}
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    err = done.stderr.strip()
    assert done.returncode == 1 and err.startswith("error: ") and "\n" not in err, err
    latest = cf.latest_checkpoint(run)
    assert "the last 5 optimiser steps" in err and f"checkpoints/latest is {latest.name}" in err, err
    stopped = int(err.split("(to step ")[1].split(")")[0])
    recorded = [r["step"] for r in read_record(run).lines if "train/loss" in r]  # (a NaN loss is null)
    assert recorded[-1] == stopped  # the step that stopped the run is the record's last
    meta = cf.read_meta(latest)
    skipped = dict(zip(*read_record(run).series("optim/skipped")))
    assert skipped[meta["step"]] == 0  # saved on an applied step: the last good one
    since = [s for s, _ in read_record(run).checkpoints if s < meta["step"]]
    assert meta["skipped_updates"]["dropped_steps"] == sum(
        v for s, v in skipped.items() if (since[-1] if since else 0) < s <= meta["step"]
    )
    assert "checkpoint postponed" in done.stdout  # the storm's steps wrote none
    postponed = [int(line.split()[1].rstrip(":")) for line in done.stdout.splitlines() if "postponed" in line]
    assert min(postponed) > cf.step_of(latest) or max(postponed) < cf.step_of(latest), postponed


def test_dropped_steps_are_counted_and_have_no_grad_norm(tmp_path: Path, data_root: Path) -> None:
    run = write_run(
        tmp_path / "run",
        MODEL,
        {**TRAIN, "learning_rate": 1e6, "train_steps": 12, "checkpoint_interval": 12, "max_dropped_steps": 1000},
    )
    assert run_main(run, data_root) == 0
    meta = cf.read_meta(cf.latest_checkpoint(run))
    lines = [r for r in read_record(run).lines if "train/loss" in r]  # each step's line
    norms, flags = [r["optim/grad_norm"] for r in lines], [r["optim/skipped"] == 1 for r in lines]
    dropped = sum(flags)
    assert dropped >= 6, (norms, flags)  # lr 1e6: the weights blow up after the first steps
    assert all(g is None for g, d in zip(norms, flags) if d)  # no stale norm for a dropped step
    assert meta["skipped_updates"]["dropped_steps"] == meta["skipped_updates"]["dropped_steps_total"] == dropped
    assert meta["optimizer_steps_applied"] == 12 - dropped
    assert meta["clipped_steps"] == sum(g is not None and g > meta["clip_max_norm"] for g in norms)
    # The schedule counts applied steps: the next rate follows the optimiser, not the step index.
    from jaxgpt.training.optimizer import make_schedule

    schedule = make_schedule(run_setup.load_run_configs(run)[1], 12)
    assert meta["next_learning_rate"] == pytest.approx(float(schedule(12 - dropped)))


# ----------------------------------------------------------------------------- 5, 6. damaged checkpoints, stale best


def damage(ckpt: Path, how: str) -> None:
    if how == "truncated-weights":
        weights = ckpt / cf.WEIGHTS
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "missing-optimizer":
        shutil.rmtree(ckpt / cf.OPTIMIZER)
    elif how == "flipped-weights":
        data = bytearray((ckpt / cf.WEIGHTS).read_bytes())
        data[-1] ^= 0xFF
        (ckpt / cf.WEIGHTS).write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated-weights", "missing-optimizer", "flipped-weights"])
def test_a_damaged_latest_is_set_aside_and_the_run_resumes_from_the_one_before(
    tmp_path: Path, data_root: Path, capsys, how: str
) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "train_steps": 30})
    assert run_main(run, data_root) == 0
    uninterrupted = final_weights(run)
    latest = cf.latest_checkpoint(run)
    damage(latest, how)
    capsys.readouterr()
    assert run_main(run, data_root) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {latest.name} is damaged" in err and f"corrupt-{latest.name}" in err, err
    assert (latest.parent / f"corrupt-{latest.name}").is_dir()  # kept, never deleted
    assert cf.step_of(cf.latest_checkpoint(run)) == 30
    resumed = final_weights(run)
    for key in uninterrupted:  # steps 21..30 trained again from step 20: the same weights
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


def test_a_stale_best_is_repaired_and_pruning_keeps_the_lowest_validation_loss(
    tmp_path: Path, data_root: Path, capsys
) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "train_steps": 30})
    assert run_main(run, data_root) == 0
    root = run / "checkpoints"
    first, _, last = cf.list_checkpoints(run)
    meta = cf.read_meta(first)
    (first / cf.META).write_text(json.dumps(meta | {"val_loss": 1e-3}))  # the oldest is the best
    os.remove(root / "best")
    os.symlink(last.name, root / "best")  # stale, as a kill between the latest and best swaps leaves it
    capsys.readouterr()
    assert run_main(run, data_root) == 0  # nothing to train; the set-up repairs the link
    assert (root / "best").resolve() == first.resolve() and "lowest validation loss" in capsys.readouterr().err
    os.remove(root / "best")
    os.symlink(last.name, root / "best")
    cf.prune(run, keep_last=1)
    assert cf.list_checkpoints(run) == [first, last]  # the lowest validation loss, whatever `best` says


# ----------------------------------------------------------------------------- 7. validation ids


def test_an_out_of_range_id_in_the_validation_split_is_refused_before_training(tmp_path: Path, data_root: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(data_root, data)
    folder = next(p for p in data.iterdir() if (p / "manifest.json").is_file())
    manifest = json.loads((folder / "manifest.json").read_text())
    shard = folder / manifest["splits"]["val"]["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-2:] = (300).to_bytes(2, "little")  # the last uint16 token: an id the bytes model cannot have
    shard.write_bytes(bytes(raw))
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    with pytest.raises(DataError, match="token id 300") as err:
        run_setup.prepare_run(run, data_root=data, restart=False)
    assert str(shard) in str(err.value) and "\n" not in str(err.value)
