"""Train a run directory.

    uv run train.py runs/a-to-a             # train, or resume from runs/a-to-a/checkpoints/latest
    uv run train.py runs/a-to-a --restart   # start over; old checkpoints are moved aside, not deleted
    uv run train.py runs/tiny --profile 10:13   # also trace steps 10 -> 13 into runs/tiny/profile/

`runs/<name>/model.json` and `runs/<name>/train.json` describe the run completely (see docs/configs.md).
The first Ctrl-C (or SIGTERM, to the process or its group) finishes the current step, writes a
checkpoint and exits 130; a second Ctrl-C, seconds later, aborts at once. Rerunning resumes from
the latest checkpoint with the same step, learning rate, next batch and dropout keys as if never
interrupted. In a multi-process run a stop request to any process stops all of them at the same
step, and a process that stops answering for --peer-timeout seconds ends the others with one
line and exit code 75 (peers.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from jaxgpt import backend, caches
from jaxgpt.cli import command_parser
from jaxgpt.config import ConfigError, load_run_configs
from jaxgpt.conversations.template import TemplateError
from jaxgpt.preparation.prepare import default_data_root
from jaxgpt.rl.run import RLRun, prepare_rl_run
from jaxgpt.stopping import REPEAT_S, StopFlag
from jaxgpt.training.run import INPUT_ERRORS, Run, TrainingError, prepare_run

if TYPE_CHECKING:
    from jaxgpt.distributed.peers import Peers

# JAX is imported by `train` (and, for a multi-process run, by `_join`), only after prepare_run
# has validated everything: no input error waits for a backend start-up.


def train(run: Run | RLRun, stop: StopFlag, profile: tuple[int, int] | None = None) -> int:
    caches.enable_compile_cache()  # a resume or rerun loads its compiled programs (caches.py)
    if isinstance(run, Run):
        from jaxgpt.training import loop

        return loop.train(run, stop, profile)
    from jaxgpt.rl import loop as rl_loop

    return rl_loop.train(run, stop)


def prepare(args: argparse.Namespace, *, processes: int = 1, main: bool = True) -> Run | RLRun:
    """The run directory checked and set up, no JAX (main: this process prepares and locks): pre-training
    or fine-tuning, or an RL run (train.json holds an "rl" section)."""
    data_root = args.data_dir or default_data_root()
    if load_run_configs(args.run_dir)[1].rl is not None:
        if args.profile is not None:
            raise ConfigError(f"--profile traces pre-training steps; {args.run_dir} is an rl run")
        return prepare_rl_run(args.run_dir, data_root=data_root, restart=args.restart, processes=processes)
    return prepare_run(args.run_dir, data_root=data_root, restart=args.restart and main, lock=main, processes=processes)


def profile_range(text: str) -> tuple[int, int]:
    """--profile START:STOP, the steps that take the run from START to STOP steps done."""
    start, sep, stop = text.partition(":")
    try:
        begin, end = int(start), int(stop)
    except ValueError:
        begin = end = -1
    if not sep or not 0 <= begin < end:
        raise argparse.ArgumentTypeError(f"{text!r}: expected START:STOP with 0 <= START < STOP, e.g. 10:13")
    return begin, end


def check_profile(run: Run, profile: tuple[int, int] | None) -> None:
    if profile is not None and profile[1] > run.total_steps:
        raise ConfigError(f"--profile {profile[0]}:{profile[1]}: {run.run_dir} trains {run.total_steps} steps")


def _cluster(args: argparse.Namespace) -> dict[str, Any] | None:
    """jax.distributed.initialize's arguments for a multi-process run, None for one process.

    Explicit flags win, then JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID;
    --distributed-auto leaves everything to JAX's cluster detection (SLURM, Open MPI, TPU pods).
    """
    if args.distributed_auto:
        return {}
    coordinator = args.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    env_n, env_id = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
    try:
        n = args.num_processes if args.num_processes is not None else (int(env_n) if env_n else None)
        pid = args.process_id if args.process_id is not None else (int(env_id) if env_id else None)
    except ValueError:
        raise ConfigError(f"JAX_NUM_PROCESSES={env_n!r} / JAX_PROCESS_ID={env_id!r} must be integers") from None
    if not coordinator or not n or n <= 1:
        return None
    if pid is None:
        raise ConfigError("multi-process run: give --process-id (or JAX_PROCESS_ID)")
    return {"coordinator_address": coordinator, "num_processes": n, "process_id": pid}


MIN_PEER_TIMEOUT = 5  # seconds: JAX sends heartbeats at a fraction of the timeout; less is noise


def peer_timeout(text: str) -> int:
    """--peer-timeout SECONDS: jax.distributed's heartbeat timeout, whole seconds."""
    try:
        seconds = int(text)
    except ValueError:
        seconds = -1
    if seconds < MIN_PEER_TIMEOUT:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole seconds >= {MIN_PEER_TIMEOUT}")
    return seconds


def _join(args: argparse.Namespace, cluster: dict[str, Any], argv: list[str]) -> Peers:
    """Join the other processes (jax.distributed) and watch them from here on (peers.py)."""
    from jaxgpt.distributed import peers  # JAX

    command = " ".join(["uv run train.py", *map(shlex.quote, argv)])
    return peers.join(cluster, peer_timeout=args.peer_timeout, run_dir=args.run_dir, command=command)


def _prepare_in_cluster(args: argparse.Namespace) -> Run | RLRun:
    """Process 0 alone prepares the dataset and moves old checkpoints aside; the others then
    find both ready."""
    import jax

    from jaxgpt.distributed import sharding  # JAX

    with sharding.main_process_first():
        return prepare(args, processes=jax.process_count(), main=sharding.is_main_process())


# ----------------------------------------------------------------------------- entry point


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    parser.add_argument(
        "--restart", action="store_true", help="start over: move checkpoints/ aside to checkpoints.old-<time>/"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where datasets live (default: $JAXGPT_DATA_DIR, else the repository's data/)",
    )
    parser.add_argument(
        "--profile",
        type=profile_range,
        default=None,
        metavar="START:STOP",
        help="record a jax.profiler trace of the steps from START to STOP steps done "
        "into <run>/profile/ (view: uv run tensorboard --logdir <run>/profile)",
    )
    group = parser.add_argument_group("several processes (jax.distributed); see docs/multi-device.md")
    group.add_argument("--coordinator", default=None, help="host:port of process 0 (or $JAX_COORDINATOR_ADDRESS)")
    group.add_argument("--num-processes", type=int, default=None, help="(or $JAX_NUM_PROCESSES)")
    group.add_argument("--process-id", type=int, default=None, help="(or $JAX_PROCESS_ID)")
    group.add_argument(
        "--distributed-auto", action="store_true", help="let JAX detect the cluster (SLURM, Open MPI, TPU pods, ...)"
    )
    group.add_argument(
        "--peer-timeout",
        type=peer_timeout,
        default=30,
        metavar="SECONDS",
        help="a process silent this long (no heartbeat) is dead: every other one stops "
        "with one line naming it and exit code 75 (default 30)",
    )
    return parser


def main(argv: list[str] | None = None, *, stop_repeat_s: float = REPEAT_S) -> int:
    """argv: the command line's arguments; stop_repeat_s: StopFlag's repeat_s (signals that soon are one request)."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    peers: Peers | None = None
    with StopFlag(repeat_s=stop_repeat_s) as stop:  # from the start: a stop request during set-up or compiling counts
        try:
            cluster = _cluster(args)
            if cluster is None:
                run = prepare(args)
            else:
                peers = _join(args, cluster, argv)
                run = _prepare_in_cluster(args)
            check_profile(run, args.profile)
            code = train(run, stop, args.profile)  # may still raise CheckpointError while loading, before compiling
        except (*INPUT_ERRORS, TemplateError) as e:
            print(f"error: {e}", file=sys.stderr)
            code = 2
        except TrainingError as e:
            print(f"error: {e}", file=sys.stderr)
            code = 1
        except (KeyboardInterrupt, Exception) as e:  # a deliberate second Ctrl-C, possibly re-wrapped by native code
            global exit_at_once
            if not (isinstance(e, KeyboardInterrupt) or stop.aborted):
                if peers is None:
                    raise
                peers.settle(e)  # a dead peer explains most errors here: then this ends with its line
                traceback.print_exc()
                exit_at_once = True
                return 1
            exit_at_once = True
            print(
                f"Aborted without saving; {args.run_dir}/checkpoints/latest is the last checkpoint.",
                file=sys.stderr,
                flush=True,
            )
            return 130
        if peers is not None:
            peers.leave()
            exit_at_once = True
        return code


# Set after a second Ctrl-C (Orbax's and XLA's threads would each print a traceback on the way
# out) and after a multi-process run (its peer watch may sit in a C++ call, which the
# interpreter's shutdown would unwind into an abort): then the process ends with os._exit.
exit_at_once = False


def script(stop_repeat_s: float = REPEAT_S) -> NoReturn:
    """What `python train.py` runs: main() on sys.argv, then the exit (os._exit where exit_at_once).
    stop_repeat_s: main's (a test starts `python -c "import train; train.script(0)" ...`)."""
    backend.prepare_process()  # on the CPU: restarts once with huge-page malloc where that helps
    code = main(stop_repeat_s=stop_repeat_s)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run is over: a late Ctrl-C must not print a traceback
    if exit_at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    script()
