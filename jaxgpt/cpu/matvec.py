"""A decode step's bfloat16 dense layers on the CPU: the native kernel of jaxgpt/cpu/matvec.cc, built here.

    from jaxgpt.cpu import matvec as cpu_matvec
    if cpu_matvec.available():            # built (once per machine) and registered with XLA
        y = cpu_matvec.matvec(x, w)       # x (N, K) float32, w (M, K) bfloat16 -> (N, M) float32
    else:
        print(cpu_matvec.unavailable_reason())

XLA:CPU has no bfloat16 matrix-vector product; why this kernel: docs/performance.md "Sampling".
The first process that needs it compiles matvec.cc against jaxlib's XLA FFI headers with the
machine's C++ compiler ($CXX, else c++, g++ or clang++; -O3 -march=native) into
$JAXGPT_CACHE_DIR/native/<cpu>/<key>/, keyed by the source, compiler, flags and jax and jaxlib
versions; later processes load that file. Without a compiler, or when the build fails,
`available()` is False, `unavailable_reason()` says why in one line, and decoding keeps XLA's
float32 kernels (slower for bfloat16, the same results). JAXGPT_NATIVE_MATVEC=0 switches it off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

from jaxgpt import caches

SOURCE = Path(__file__).with_name("matvec.cc")
SHOWN = "jaxgpt/cpu/matvec.cc"  # how messages name it
TARGET = "jaxgpt_bf16_matvec"  # the FFI target name, and the handler's symbol in the library
SWITCH = "JAXGPT_NATIVE_MATVEC"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
LIBRARY = "libjaxgpt_matvec.so"
# Rows of x up to which the kernel beats XLA's dots (docs/performance.md "Sampling"): each weight is
# read once per call, so a few rows cost little more than one; past this, the dots' blocking wins.
MAX_ROWS = 16

_state: dict[str, object] = {}  # "reason": why unavailable (None: available); "libs": loaded libraries


class BuildError(RuntimeError):
    """jaxgpt/cpu/matvec.cc could not be built; the message is one line."""


def compiler() -> list[str] | None:
    """The C++ compiler's command: $CXX (may carry flags), else the first of c++, g++, clang++."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    found = next((shutil.which(name) for name in ("c++", "g++", "clang++") if shutil.which(name)), None)
    return [found] if found else None


def build(dest: Path, flags: Sequence[str] = FLAGS, cxx: Sequence[str] | None = None) -> Path:
    """Compile jaxgpt/cpu/matvec.cc into dest/LIBRARY (written atomically: processes that build at once
    each rename a whole file into place). Raises BuildError with the compiler's first error."""
    cxx = list(cxx) if cxx is not None else compiler()
    if not cxx:
        raise BuildError("no C++ compiler found (set CXX, or install g++ or clang++)")
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY}-", dir=dest)
    os.close(fd)
    command = [*cxx, *flags, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(f"{shlex.join(cxx)}: {e}") from None
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or ["?"]
        raise BuildError(f"{shlex.join(cxx)} failed on {SHOWN}: {errors[0].strip()}")
    os.replace(tmp, dest / LIBRARY)
    return dest / LIBRARY


def _build_key(cxx: Sequence[str]) -> str:
    """What the built library depends on: its source, the compiler (and its version), the flags, and
    the jax and jaxlib versions (the FFI headers and the runtime that calls the handler)."""
    try:
        version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    digest = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        shlex.join(cxx).encode(),
        version.encode(),
        " ".join(FLAGS).encode(),
        jax.__version__.encode(),
        jaxlib.__version__.encode(),
    ):
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def library() -> Path:
    """This machine's built library: from the cache, or built into it now (once per machine and
    key; a few seconds). An unwritable cache builds into a temporary folder instead."""
    cxx = compiler()
    if not cxx:
        raise BuildError("no C++ compiler found (set CXX, or install g++ or clang++)")
    cpu = re.sub(r"[^A-Za-z0-9]+", "-", caches.cpu_model()).strip("-") or "unknown-cpu"
    dest = caches.cache_root() / "native" / cpu / _build_key(cxx)
    if (dest / LIBRARY).is_file():
        return dest / LIBRARY
    print(
        f"note: building {SHOWN} (the CPU's bfloat16 decode kernel; once per machine and JAX version)",
        file=sys.stderr,
        flush=True,
    )
    try:
        return build(dest, cxx=cxx)
    except OSError:  # the cache folder is not writable
        return build(Path(tempfile.mkdtemp(prefix="jaxgpt-native-")), cxx=cxx)


def register(path: Path, target: str = TARGET) -> None:
    """Load a built library and register its handler as the FFI target `target` on the CPU."""
    lib = ctypes.cdll.LoadLibrary(str(path))
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, TARGET)), platform="cpu")
    _state.setdefault("libs", []).append(lib)  # type: ignore[union-attr]  # kept loaded for the process


def available() -> bool:
    """Whether matvec can run in this process: built (or found built) and registered, once per
    process. False when switched off (JAXGPT_NATIVE_MATVEC=0) or when it cannot be built."""
    if "reason" not in _state:
        if os.environ.get(SWITCH, "1") == "0":
            _state["reason"] = f"switched off ({SWITCH}=0)"
        else:
            try:
                path = library()
                try:
                    register(path)
                except OSError:  # a damaged file in the cache (ctypes cannot load it): build it again
                    path.unlink(missing_ok=True)
                    register(library())
                _state["reason"] = None
            except (BuildError, OSError, AttributeError) as e:
                _state["reason"] = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(
                    f"note: {SHOWN} unavailable ({_state['reason']}): bfloat16 models decode through "
                    f"XLA's float32 kernels, slower on the CPU ({SWITCH}=0 silences this)",
                    file=sys.stderr,
                    flush=True,
                )
    return _state["reason"] is None


def unavailable_reason() -> str | None:
    """Why matvec cannot run here (one line), or None when it can."""
    available()
    return _state["reason"]  # type: ignore[return-value]


def matvec(x: jax.Array, w: jax.Array, target: str = TARGET) -> jax.Array:
    """x (N, K) float32 times w (M, K) bfloat16, transposed -> (N, M) float32: every product of
    x's values with w's, summed in float32. Traceable (an XLA custom call); CPU only."""
    assert x.ndim == 2 and w.ndim == 2 and x.shape[1] == w.shape[1], (x.shape, w.shape)
    assert x.dtype == jnp.float32 and w.dtype == jnp.bfloat16, (x.dtype, w.dtype)
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32))(x, w)
