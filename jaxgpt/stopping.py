"""Ctrl-C and SIGTERM as a request to stop at the end of the step, with a checkpoint (train.py installs it)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Self

REPEAT_S = 2.0  # signals this soon after the first stop request are copies of it (StopFlag)


class StopFlag:
    """SIGINT and SIGTERM ask the run to finish its step, write a checkpoint and exit 130.

    Every signal within repeat_s (2 s) of the first is the same request (a signal to the process
    group reaches both `uv` and python, and uv forwards its copy); SIGTERM never aborts. Only a later,
    distinct SIGINT (a second Ctrl-C) aborts at once, raising KeyboardInterrupt. train.py installs it
    first thing, so a request during set-up or compilation is kept for the loop.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, repeat_s: float = REPEAT_S) -> None:
        """clock: seconds (monotonic); repeat_s: how long after the first request a signal is still a
        copy of it (a test passes its own clock, or 0 to abort on any second Ctrl-C)."""
        self.requested = self.aborted = False
        self._clock = clock
        self._repeat_s = repeat_s
        self._first: float | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def check_abort(self) -> None:
        """Raise KeyboardInterrupt if an abort was asked for and some library swallowed it."""
        if self.aborted:
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: Any) -> None:
        now = self._clock()
        if self._first is None:
            self._first, self.requested = now, True
            print(
                f"\nStopping ({signal.Signals(signum).name}): finishing this step and writing a checkpoint "
                f"(Ctrl-C again to abort without saving).",
                file=sys.stderr,
                flush=True,
            )
        elif signum == signal.SIGINT and now - self._first > self._repeat_s:
            self.aborted = True  # whatever becomes of the KeyboardInterrupt in native code on its way up
            raise KeyboardInterrupt
