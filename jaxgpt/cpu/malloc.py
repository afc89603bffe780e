"""Huge-page malloc for XLA:CPU, switched on before JAX starts (the CPU backend only).

XLA:CPU allocates each compiled call's scratch memory as one block per call, which glibc serves
over 32 MiB with a fresh mmap: every call page-faults through it again. With the glibc tunable
`glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc uses transparent huge pages instead (the effect:
docs/performance.md "The CPU code, lever by lever").

Tunables are read when a process starts, so jaxgpt.backend.prepare_process(), called first thing by
the entry scripts, imports this module where the process will run on JAX's CPU backend and calls
`reexec()`: it restarts the same command line once with the tunable set. It does nothing when the
tunable is set already (opt out: GLIBC_TUNABLES=glibc.malloc.hugetlb=0), the C library is not
glibc >= 2.35, or transparent huge pages are not in "madvise" mode.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _glibc_version() -> tuple[int, int] | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None  # not glibc (musl, macOS, Windows)


def _thp_mode() -> str | None:
    try:
        text = THP_MODE.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def needed(environ: dict[str, str] | None = None) -> bool:
    """Whether a process on JAX's CPU backend would gain from restarting with the tunable (whether it
    runs on the CPU is jaxgpt.backend.runs_on_cpu's question, asked before this module is imported)."""
    environ = os.environ if environ is None else environ
    if TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        return False
    version = _glibc_version()
    return version is not None and version >= (2, 35) and _thp_mode() == "madvise"


def reexec() -> None:
    """Restart this command line with the tunable set, if `needed()`; else return at once."""
    if not needed():
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    env = dict(os.environ, GLIBC_TUNABLES=f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return  # cannot restart (odd launcher): run on with the default malloc
