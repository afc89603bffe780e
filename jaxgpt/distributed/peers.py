"""The other processes of a multi-process run: joining them, watching them, agreeing on stops, leaving.

- `join` starts jax.distributed with the user's heartbeat timeout (train.py --peer-timeout), in
  JAX's recoverable mode and without JAX's preemption notifier, so train.py's StopFlag keeps
  SIGTERM.
- `Peers` watches, from a thread, which processes are alive; when one is lost every survivor
  prints one line naming it, `latest` and the command to resume, and exits PEER_LOST at once.
- `StopVotes` agrees on stop requests through the devices without stalling the loop.
- `Peers.leave` ends a finished run in order: process 0, which hosts the coordination service,
  last.

When process 0 dies, JAX's client ends every other process (exit 134); Python cannot intercept it.
What each event does: docs/multi-device.md "When a process is stopped or dies".
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgpt.checkpoints import layout as cf

if TYPE_CHECKING:
    from jaxgpt.stopping import StopFlag

PEER_LOST = 75  # sysexits' EX_TEMPFAIL: a temporary failure; rerunning every process resumes
ROUND_S = 1.0  # pause between two liveness rounds
LEFT = "jaxgpt/left/"  # key in the coordination service: this process ended its run (not a death)


def join(cluster: dict[str, Any], *, peer_timeout: int, run_dir: Path, command: str) -> Peers:
    """jax.distributed.initialize(**cluster) as a run needs it; then watch the other processes.

    Before any device is touched. An option this JAX lacks is skipped: without recoverability a
    dead process is still found within peer_timeout, but JAX then aborts the survivors itself.
    """
    for option, value in (("jax_enable_recoverability", True), ("jax_enable_preemption_service", False)):
        try:
            jax.config.update(option, value)
        except AttributeError:
            pass
    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    jax.distributed.initialize(**cluster, heartbeat_timeout_seconds=peer_timeout)
    for sig, handler in ours.items():  # whatever the runtime installed (a C++ SIGTERM notifier), ours again
        if callable(handler):
            signal.signal(sig, handler)
    return Peers(peer_timeout, Path(run_dir), command)


def _state() -> Any:
    # jax.distributed keeps its client here (multihost_utils reads it the same way); the client is
    # what answers "which processes are alive" and holds the run's keys.
    from jax._src import distributed

    return distributed.global_state


class Peers:
    """The liveness watch of one process of a multi-process run (see the module docstring)."""

    def __init__(self, timeout: int, run_dir: Path, command: str) -> None:
        state = _state()
        self.client, self.me, self.n = state.client, state.process_id, state.num_processes
        self.timeout, self.run_dir, self.command = timeout, run_dir, command
        self.rounds, self.live, self.closing = 0, set(range(self.n)), False
        self.changed = threading.Condition()
        self.watch = threading.Thread(target=self._watch, name="peers-watch", daemon=True)
        self.watch.start()

    def _watch(self) -> None:
        everyone, failing_since = list(range(self.n)), None
        while True:
            try:
                live = set(self.client.get_live_nodes(everyone))
            except Exception:  # jaxlib's own error type: we are leaving, or the service is unreachable
                if self.closing:
                    return
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self.timeout:  # (JAX's client usually ends us first)
                    self.lost([0], "the coordination service it hosts stopped answering")
                time.sleep(ROUND_S)
                continue
            failing_since = None
            gone = [i for i in everyone if i not in live and not self._left(i)]
            if gone and not self.closing:  # before counting the round: settle() never sees it pass
                self.lost(gone, f"no heartbeat for {self.timeout} s")
            with self.changed:
                self.rounds, self.live = self.rounds + 1, live
                self.changed.notify_all()
            if self.closing and (self.me != 0 or live <= {0}):
                return
            time.sleep(ROUND_S)

    def _left(self, i: int) -> bool:
        try:
            self.client.key_value_try_get(f"{LEFT}{i}")
            return True
        except Exception:  # not found: it did not leave, it died
            return False

    def lost(self, gone: list[int], why: str) -> None:
        """One line on stderr, then end this process at once (no shutdown barrier) with PEER_LOST.
        Called by the watch only: whatever the main thread is doing (waiting in a collective that
        will never complete, saving) ends with it; a half-written checkpoint is a dot-folder."""
        names = ", ".join(map(str, gone))
        latest = cf.latest_checkpoint(self.run_dir)
        kept = (
            f"{self.run_dir}/checkpoints/latest is {latest.name} (step {cf.step_of(latest)})"
            if latest is not None
            else "no checkpoint was written yet (a rerun starts at step 0)"
        )
        lead = "\n" if sys.stderr.isatty() else ""  # off a progress bar's line
        print(
            f"{lead}error: process {names} of {self.n} stopped answering ({why}); process {self.me} stops too. "
            f"{kept}. Resume: start all {self.n} processes again (this one: {self.command})",
            file=sys.stderr,
            flush=True,
        )
        self._let_others_go_first(gone)
        os._exit(PEER_LOST)

    def _let_others_go_first(self, gone: list[int]) -> None:
        """The other survivors must not find the service gone: they disconnect (at once, in
        recoverable mode), and process 0, which hosts it, waits for that (bounded) before exiting."""

        def disconnect() -> None:
            try:
                if self.me != 0:
                    self.client.shutdown()
                    return
                survivors = [i for i in range(self.n) if i not in gone]
                while set(self.client.get_live_nodes(survivors)) - {0}:  # returns as they disconnect
                    time.sleep(0.1)
            except Exception:
                pass  # nothing more to do for the others: this process ends either way

        helper = threading.Thread(target=disconnect, daemon=True)
        helper.start()
        helper.join(self.timeout + 5)

    def settle(self, error: BaseException) -> None:
        """`error` ended this process's run: if a peer's death explains it (a collective fails the
        moment its peer is gone, before the service knows), end with the peer-lost line instead.

        Waits for a liveness round that began after the error: a dead process is declared within
        peer_timeout, and the watch then ends this process; if every process answers, returns
        and the caller lets the error through."""
        with self.changed:
            target = self.rounds + 2
            self.changed.wait_for(lambda: self.rounds >= target, timeout=self.timeout + 10 * ROUND_S)

    def leave(self) -> None:
        """This process's run is over (trained, stopped, or failed alike everywhere): leave
        jax.distributed in order. The others say so in a key and disconnect; process 0 waits for
        them (bounded), then stops the service with its own disconnect."""
        self.closing = True
        if self.me != 0:
            self.client.key_value_set(f"{LEFT}{self.me}", "1")
        else:
            with self.changed:
                self.changed.wait_for(lambda: self.live <= {0}, timeout=max(60, 2 * self.timeout))
        jax.distributed.shutdown()
        self.watch.join(self.timeout)  # its last round returns once this process has disconnected


class StopVotes:
    """Whether any process has a stop request, agreed without stalling the loop.

    One process reads its own flag. Several vote through the devices: `cast`, right after a step,
    dispatches a max over one flag per device, and `count` reads that vote one step later, with the
    step's results. Every process reads the same value for the same step, so they all stop at the
    same step, and no host waits for a step to finish before dispatching the next.
    """

    def __init__(self, stop: StopFlag, mesh: Mesh) -> None:
        self.stop, self.several, self.any = stop, jax.process_count() > 1, False
        if self.several:
            flat = NamedSharding(mesh, P(mesh.axis_names))  # (devices,): one flag on each device
            self.flags = [
                jax.make_array_from_callback((mesh.size,), flat, lambda _, v=v: np.array([v], np.int32)) for v in (0, 1)
            ]
            self.vote = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))

    def cast(self) -> jax.Array | None:
        """This process's vote on the step just dispatched (None for one process)."""
        return self.vote(self.flags[int(self.stop.requested)]) if self.several else None

    def count(self, vote: jax.Array | None) -> None:
        """Read a vote cast earlier (waits for it; it ran right after its step)."""
        if vote is not None:
            self.any = self.any or bool(np.asarray(vote.addressable_data(0)))

    @property
    def agreed(self) -> bool:
        """Stop after the step just dispatched: the votes counted so far say so (all processes
        have counted the same ones), or, for one process, its own flag."""
        return self.any if self.several else self.stop.requested

    def now(self) -> bool:
        """Vote and wait for the result: once, before the first step."""
        self.count(self.cast())
        return self.agreed
