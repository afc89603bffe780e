"""Train a run directory.

    uv run train.py runs/a-to-a             # train, or resume from runs/a-to-a/checkpoints/latest
    uv run train.py runs/a-to-a --restart   # start over; old checkpoints are moved aside, not deleted
    uv run train.py runs/tiny --profile 10:13   # also trace steps 10 -> 13 into runs/tiny/profile/

`runs/<name>/model.json` and `runs/<name>/train.json` describe the run completely (see README).
The first Ctrl-C (or SIGTERM, to the process or its group) finishes the current step, writes a
checkpoint and exits 130; a second Ctrl-C, seconds later, aborts at once. Rerunning resumes from
the latest checkpoint with the same step, learning rate, next batch and dropout keys as if never
interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import fast_malloc
from config import ConfigError
from download_dataset import default_data_root
from run_setup import INPUT_ERRORS, Run, StopFlag, TrainingError, prepare_run

# JAX is imported by `train` (and, for a multi-process run, by `_join_cluster`), only after
# prepare_run has validated everything: no input error waits for a backend start-up.


def train(run: Run, stop: StopFlag, profile: tuple[int, int] | None = None) -> int:
    from trainer import Trainer

    return Trainer(run, stop, profile).fit()


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
    return dict(coordinator_address=coordinator, num_processes=n, process_id=pid)


def _prepare_in_cluster(args: argparse.Namespace, cluster: dict[str, Any]) -> Run:
    """Join the cluster, then process 0 alone prepares the dataset and moves old checkpoints
    aside; the others then find both ready."""
    import sharding  # JAX

    sharding.initialize_distributed(cluster)
    with sharding.main_process_first():
        main = sharding.is_main_process()
        return prepare_run(args.run_dir, data_root=args.data_dir or default_data_root(),
                           restart=args.restart and main, lock=main)


# ----------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    parser.add_argument("--restart", action="store_true",
                        help="start over: move checkpoints/ aside to checkpoints.old-<time>/")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where datasets live (default: $JAXGPT_DATA_DIR or ./data)")
    parser.add_argument("--profile", type=profile_range, default=None, metavar="START:STOP",
                        help="record a jax.profiler trace of the steps from START to STOP steps done "
                             "into <run>/profile/ (view: uv run tensorboard --logdir <run>/profile)")
    group = parser.add_argument_group("several processes (jax.distributed); see README")
    group.add_argument("--coordinator", default=None,
                       help="host:port of process 0 (or $JAX_COORDINATOR_ADDRESS)")
    group.add_argument("--num-processes", type=int, default=None, help="(or $JAX_NUM_PROCESSES)")
    group.add_argument("--process-id", type=int, default=None, help="(or $JAX_PROCESS_ID)")
    group.add_argument("--distributed-auto", action="store_true",
                       help="let JAX detect the cluster (SLURM, Open MPI, TPU pods, ...)")
    args = parser.parse_args(argv)
    with StopFlag() as stop:  # from the start: a stop request during set-up or compiling counts
        try:
            cluster = _cluster(args)
            if cluster is None:
                run = prepare_run(args.run_dir, data_root=args.data_dir or default_data_root(), restart=args.restart)
            else:
                run = _prepare_in_cluster(args, cluster)
            check_profile(run, args.profile)
            return train(run, stop, args.profile)  # may still raise CheckpointError while loading, before compiling
        except INPUT_ERRORS as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except TrainingError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, Exception) as e:  # a deliberate second Ctrl-C, possibly re-wrapped by native code
            if not (isinstance(e, KeyboardInterrupt) or stop.aborted):
                raise
            global aborted
            aborted = True
            print(f"Aborted without saving; {args.run_dir}/checkpoints/latest is the last checkpoint.",
                  file=sys.stderr, flush=True)
            return 130


aborted = False  # set when a second Ctrl-C aborted the run


if __name__ == "__main__":
    fast_malloc.reexec()  # restarts once with huge-page malloc where that helps (fast_malloc.py)
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run is over: a late Ctrl-C must not print a traceback
    if aborted:  # leave at once: Orbax's and XLA's threads would each print a traceback on the way out
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
