"""Two train.py processes joined over 127.0.0.1 (gloo), stopped every way a cluster stops them:
SIGTERM to both or to one, SIGINT to one, kill -9 of one before its first checkpoint, mid-run and
during a checkpoint save, and the death of process 0, which hosts the coordination service.
Every survivor must stop within the peer timeout, leave nothing half-written under a checkpoint
name, and a rerun of both must end equal, weights and per-step losses, to the uninterrupted
two-process run. Real processes, real signals, real files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TINY_MODEL, write_run
from safetensors.numpy import load_file

import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.tracking.history import read_record

# Not in the fast tier (-m "not slow"): two train.py processes stopped by signals and by a dead peer.
pytestmark = pytest.mark.slow

MODEL = TINY_MODEL
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "gradient_accumulation_steps": 2,
    "train_steps": 30,
    "learning_rate": 0.003,
    "checkpoint_interval": 10,
    "validation_batches": 1,
    "keep_last_checkpoints": 10,
}
PEER_TIMEOUT = 10  # seconds (train.py --peer-timeout)
SLACK = 40  # seconds a loaded 2-core machine may add to any bound
WAIT = 900  # seconds a process may take to get anywhere (start-up and compiling under load)


class Pair:
    """Process 0 and process 1 of one run, each writing its output to a file."""

    def __init__(self, run: Path, data_root: Path, tag: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.run, self.logs = run, [run.parent / f"{tag}-{i}.log" for i in range(2)]
        self.took = 0.0  # seconds from a kill to the survivor's exit
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "train.py"),
                    str(run),
                    "--data-dir",
                    str(data_root),
                    "--coordinator",
                    f"127.0.0.1:{port}",
                    "--num-processes",
                    "2",
                    "--process-id",
                    str(i),
                    "--peer-timeout",
                    str(PEER_TIMEOUT),
                ],
                cwd=ROOT,
                env=env,
                stdout=open(log, "w"),
                stderr=subprocess.STDOUT,
            )
            for i, log in enumerate(self.logs)
        ]

    def output(self, i: int) -> str:
        return self.logs[i].read_text()

    def wait_until(self, ready, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not ready():
            for i, p in enumerate(self.procs):
                assert p.poll() is None, f"process {i} ended ({p.returncode}) before {what}:\n{self.output(i)}"
            assert time.monotonic() < deadline, f"not {what} within {WAIT} s"
            time.sleep(0.005)

    def finish(self, timeout: float = WAIT) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]


def steps_logged(run: Path) -> int:
    """The last step process 0 has logged (metrics.jsonl: one line a step, as it is read)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return max((r["step"] for r in lines if "train/loss" in r), default=0)


def saving(run: Path, step: int) -> bool:
    """The step's checkpoint is being written: its temporary folder exists, with files in it."""
    return (
        any(p.name.endswith(f"-step-{step}") and any(p.iterdir()) for p in (run / "checkpoints").glob(".tmp-*"))
        if (run / "checkpoints").is_dir()
        else False
    )


def per_step_losses(run: Path) -> dict[int, float]:
    losses = {}
    losses.update(zip(*read_record(run).series("train/loss")))
    return losses


def assert_equal_runs(run: Path, reference: Path) -> None:
    a, b = per_step_losses(run), per_step_losses(reference)
    assert sorted(a) == sorted(b) == list(range(1, TRAIN["train_steps"] + 1))
    np.testing.assert_array_equal([a[s] for s in sorted(a)], [b[s] for s in sorted(b)])
    wa = load_file(str(cf.latest_checkpoint(run) / cf.WEIGHTS))
    wb = load_file(str(cf.latest_checkpoint(reference) / cf.WEIGHTS))
    assert sorted(wa) == sorted(wb)
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)


def assert_nothing_half_written(run: Path) -> None:
    """Every folder under a checkpoint name is complete and verifies; `latest` points at one."""
    root = run / "checkpoints"
    if not root.is_dir():
        return
    named = [p for p in root.iterdir() if not p.name.startswith(".") and p.name[:1].isdigit()]
    for ckpt in named:
        assert cf.verify_checkpoint(ckpt) is None, (ckpt, cf.verify_checkpoint(ckpt))
    if (root / "latest").is_symlink():
        assert cf.verify_checkpoint((root / "latest").resolve()) is None


def rerun_to_the_end(run: Path, data_root: Path, reference: Path) -> None:
    again = Pair(run, data_root, "rerun")
    assert again.finish() == [0, 0], (again.output(0), again.output(1))
    assert "Training complete" in again.output(0)
    assert_equal_runs(run, reference)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """The uninterrupted two-process run every interrupted one must equal."""
    run = write_run(tmp_path_factory.mktemp("straight") / "run", MODEL, TRAIN)
    pair = Pair(run, data_root, "straight")
    assert pair.finish() == [0, 0], (pair.output(0), pair.output(1))
    for i in range(2):  # a run that ends well leaves jax.distributed in order: no abort on the way out
        assert "Check failure" not in pair.output(i) and "Traceback" not in pair.output(i), pair.output(i)
    return run


# ----------------------------------------------------------------------------- stop requests
# Each test is one run stopped several times, every way in turn, then finished: one start of two
# processes (and their compile) per way, plus one to finish.


def stop_by_signal(run: Path, data_root: Path, sig: signal.Signals, targets: tuple[int, ...]) -> int:
    """Start both processes, send `sig` to `targets` a few steps in: both stop at one step with a
    checkpoint and exit 130. Returns that step."""
    start = cf.step_of(cf.latest_checkpoint(run)) if cf.latest_checkpoint(run) is not None else 0
    pair = Pair(run, data_root, f"{sig.name}-{start}")
    pair.wait_until(lambda: steps_logged(run) >= start + 3, f"step {start + 3}")
    for i in targets:
        pair.procs[i].send_signal(sig)
    assert pair.finish() == [130, 130], (sig, targets, pair.output(0), pair.output(1))
    stopped_at = cf.step_of(cf.latest_checkpoint(run))
    assert start + 3 <= stopped_at < TRAIN["train_steps"], (start, stopped_at)
    assert f"Interrupted after step {stopped_at}/{TRAIN['train_steps']}; checkpoint saved." in pair.output(0)
    assert "Resume with: the same command on all 2 processes" in pair.output(0)
    for i in range(2):
        out = pair.output(i)
        assert "Traceback" not in out and "SIGTERM caught" not in out and "Check failure" not in out, out
        assert (f"Stopping ({sig.name})" in out) == (i in targets), out
    logged = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]
    assert logged[-1] == stopped_at  # no step was trained past the checkpoint
    assert_nothing_half_written(run)
    return stopped_at


def test_a_stop_request_to_either_or_both_processes_stops_both_at_one_step(
    tmp_path: Path, data_root: Path, reference: Path
) -> None:
    """SIGTERM to both (a scheduler's preemption), SIGTERM to process 1 alone, SIGINT to process 1
    alone: each stops both processes at the same step with a checkpoint, exit 130. JAX's runtime
    installs its own SIGTERM handler, which ignored the request; ours stays in force."""
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    steps = [
        stop_by_signal(run, data_root, signal.SIGTERM, (0, 1)),
        stop_by_signal(run, data_root, signal.SIGTERM, (1,)),
        stop_by_signal(run, data_root, signal.SIGINT, (1,)),
    ]
    assert steps == sorted(steps)
    rerun_to_the_end(run, data_root, reference)


# ----------------------------------------------------------------------------- a dead peer


def kill_one(run: Path, data_root: Path, victim: int, ready, what: str) -> Pair:
    """Start both processes, kill -9 `victim` once `ready()`; return when the survivor has ended."""
    pair = Pair(run, data_root, f"kill-{victim}-{what.replace(' ', '-')}")
    pair.wait_until(ready, what)
    pair.procs[victim].kill()
    killed = time.monotonic()
    pair.procs[1 - victim].wait(timeout=PEER_TIMEOUT + SLACK)
    pair.took = time.monotonic() - killed
    pair.finish()
    assert_nothing_half_written(run)
    return pair


def assert_one_line_stop(pair: Pair, run: Path) -> None:
    """Process 0 outlived process 1: it ended within the timeout, exit 75, in one line naming
    process 1, `latest` and the command to resume; no traceback, no C++ check failure."""
    out, latest = pair.output(0), cf.latest_checkpoint(run)
    lines = [line for line in out.splitlines() if line.strip()]
    assert pair.procs[0].returncode == 75, out
    assert pair.took < PEER_TIMEOUT + SLACK, pair.took
    kept = (
        f"checkpoints/latest is {latest.name} (step {cf.step_of(latest)})"
        if latest is not None
        else "no checkpoint was written yet"
    )
    assert lines[-1].startswith("error: process 1 of 2 stopped answering (no heartbeat for 10 s)"), out
    assert kept in lines[-1] and "Resume: start all 2 processes again (this one: uv run train.py" in lines[-1], out
    assert "Traceback" not in out and "Check failure" not in out, out


def test_a_killed_process_stops_the_other_in_one_line_and_nothing_is_lost(
    tmp_path: Path, data_root: Path, reference: Path
) -> None:
    """kill -9 of process 1 before the first checkpoint, mid-run, and during a checkpoint save;
    then of process 0, which hosts the coordination service: JAX's client ends the other at once
    and in its own words (Python cannot tell it otherwise). Each rerun resumes from the last
    complete checkpoint; the last one ends equal to the uninterrupted run."""
    run = write_run(tmp_path / "run", MODEL, TRAIN)

    pair = kill_one(run, data_root, 1, lambda: steps_logged(run) >= 3, "step 3")
    assert_one_line_stop(pair, run)
    assert cf.latest_checkpoint(run) is None

    pair = kill_one(run, data_root, 1, lambda: steps_logged(run) >= 14, "step 14")
    assert_one_line_stop(pair, run)
    assert cf.step_of(cf.latest_checkpoint(run)) == 10

    pair = kill_one(run, data_root, 1, lambda: saving(run, 20), "saving step 20")
    assert_one_line_stop(pair, run)
    assert cf.step_of(cf.latest_checkpoint(run)) in (10, 20)  # 20 only if its save was already complete

    pair = kill_one(run, data_root, 0, lambda: steps_logged(run) >= 24, "step 24")
    assert pair.took < SLACK and pair.procs[1].returncode == -signal.SIGABRT, pair.output(1)
    assert "Terminating process because the JAX distributed service detected fatal errors" in pair.output(1)

    rerun_to_the_end(run, data_root, reference)


# ----------------------------------------------------------------------------- leaving in order


def test_an_input_error_after_joining_ends_both_in_one_line(tmp_path: Path, data_root: Path) -> None:
    """Both processes refuse the mesh (3 data ways, 2 devices) and leave jax.distributed in order."""
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "mesh": {"data": 3}})
    pair = Pair(run, data_root, "refused")
    assert pair.finish() == [2, 2], (pair.output(0), pair.output(1))
    for i in range(2):
        out = pair.output(i)
        assert out.strip().splitlines()[-1].startswith(f"error: {run}/train.json: mesh data=3"), out  # the run's file
        assert "Traceback" not in out and "Check failure" not in out, out


def test_a_peer_timeout_below_five_seconds_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        train.main(["runs/a-to-a", "--peer-timeout", "2"])
    assert exit_.value.code == 2
    assert "--peer-timeout: '2': expected whole seconds >= 5" in capsys.readouterr().err


# ----------------------------------------------------------------------------- stop votes

VOTES = """
import json, os, signal, sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from jaxgpt.distributed import peers
from jaxgpt.stopping import StopFlag
from jaxgpt.distributed.sharding import DATA, MODEL

me = int(sys.argv[1])
with StopFlag() as stop:
    watch = peers.join(dict(coordinator_address=sys.argv[2], num_processes=2, process_id=me),
                       peer_timeout=10, run_dir=Path(sys.argv[3]), command="votes")
    mesh = jax.make_mesh((2, 1), (DATA, MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    votes = peers.StopVotes(stop, mesh)
    x = jax.device_put(np.eye(512, dtype=np.float32), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    # A step the host must not wait for: long enough that its result is not ready when the vote is cast.
    step = jax.jit(lambda a: jax.lax.fori_loop(0, 300, lambda i, b: jnp.tanh(b @ a + 1.0), a))
    step(x).block_until_ready()  # both compiled before the loop, as the trainer does (votes.now())
    assert not votes.now()
    seen, pending = [], None
    for s in range(8):
        if s == 3 and me == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a stop request to this process only
        out = step(x)
        vote = votes.cast()
        ready_at_cast = out.is_ready()
        votes.count(pending)
        pending = vote
        seen.append({"step": s, "agreed": votes.agreed, "requested": stop.requested, "ready": ready_at_cast})
        out.block_until_ready()
    print(json.dumps(seen), flush=True)
    watch.leave()
os._exit(0)
"""


def test_stop_votes_agree_across_processes_without_waiting_for_the_step(tmp_path: Path) -> None:
    """One process gets a stop request: both read the same votes, step for step, and both agree
    to stop from the same step on; casting a vote never waits for the step before it (its result
    is not ready yet), where the all-gather it replaces waited for every step."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", VOTES, str(i), address, str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=WAIT) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["requested"] for r in seen[0]] == [False] * 8  # process 0 was never asked ...
    assert [r["requested"] for r in seen[1]] == [False] * 3 + [True] * 5
    agreed = [[r["agreed"] for r in rows] for rows in seen]
    assert agreed[0] == agreed[1]  # ... and agrees with process 1 step for step
    assert agreed[0] == [False] * 4 + [True] * 4  # step 3's vote, read with step 4's dispatch
    assert not any(r["ready"] for rows in seen for r in rows), seen
