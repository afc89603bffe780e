"""What this harness keeps per user and machine, in $JAXGPT_CACHE_DIR (default ~/.cache/jaxgpt):
XLA's compiled programs (xla/<cpu>), the measured matmul peak (peak_flops.json), the built-in
corpus's fingerprint (builtin_fingerprint.json) and the CPU's bfloat16 decode kernel (native/).
Any of it may be deleted at any time: it is measured, computed or built again.

    caches.enable_compile_cache()   # before the first compile: train.py, evaluate.py, the smoke tests
    caches.recall("peak_flops.json", key) / caches.remember("peak_flops.json", key, value)

The compile cache is JAX's own; this module only gives it defaults (every program kept, at most
COMPILE_CACHE_BYTES, least recently used evicted first), and a JAX_COMPILATION_CACHE_* or
JAX_ENABLE_COMPILATION_CACHE setting of the user's wins. It is trusted code: keep it where only
you can write. Why each default: docs/how-it-works.md "The per-user caches".
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from pathlib import Path
from typing import Any

COMPILE_CACHE_BYTES = 2 * 1024**3


def cache_root() -> Path:
    return Path(os.environ.get("JAXGPT_CACHE_DIR") or Path.home() / ".cache" / "jaxgpt")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: computed again
    return data if isinstance(data, dict) else {}


def recall(name: str, key: str) -> Any:
    """The value remembered under `key` in cache_root()/name, or None."""
    return _read(cache_root() / name).get(key)


def remember(name: str, key: str, value: Any) -> None:
    """Add `key` to cache_root()/name, atomically: two processes starting together must not
    tear the file. A read-only home just remembers nothing."""
    path = cache_root() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path) | {key: value}
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{name}-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), for cache keys and records."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compile_cache_dir() -> Path:
    cpu = re.sub(r"[^A-Za-z0-9]+", "-", cpu_model()).strip("-") or "unknown-cpu"
    return cache_root() / "xla" / cpu


def enable_compile_cache() -> Path | None:
    """Turn XLA's compile cache on with this module's defaults; the folder it uses, or None when
    it is off. Must run before the process's first compile (JAX reads the settings then)."""
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    try:  # JAX's lock (a size limit needs it); huggingface_hub brings it, a foreign Python may not
        import filelock  # noqa: F401
    except ImportError:
        return None
    if jax.config.jax_compilation_cache_dir is None:
        path = compile_cache_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # a read-only home: compile every time, as without the cache, and say nothing
        jax.config.update("jax_compilation_cache_dir", str(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_BYTES)
    return Path(jax.config.jax_compilation_cache_dir)
