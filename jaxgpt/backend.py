"""Which backend JAX will run on, told before JAX starts; what an entry point does about it first.

backend.prepare_process()   # first thing in train.py, evaluate.py and bench: on the CPU only,
                            # restarts once with huge-page malloc (jaxgpt/cpu/malloc.py)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil


def accelerator_plugins() -> list[str]:
    """The JAX accelerator plugins installed, found the ways JAX finds them (the `jax_plugins`
    namespace package and entry point group, and libtpu), without importing JAX."""
    found = []
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        found += [f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations)]
    found += [f"entry point {ep.name}" for ep in importlib.metadata.entry_points(group="jax_plugins")]
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    return found


def runs_on_cpu(environ: dict[str, str] | None = None) -> bool:
    """Whether JAX's default backend will be the CPU: JAX_PLATFORMS names "cpu" first, or it is
    unset and no accelerator plugin is installed."""
    environ = os.environ if environ is None else environ
    platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return platforms[0] == "cpu"  # JAX's default backend is the first platform listed
    return not accelerator_plugins()


def prepare_process() -> None:
    """What a process that will run JAX does before importing it: where JAX's backend will be the
    CPU, jaxgpt.cpu.malloc.reexec() (imported here, and only then)."""
    if runs_on_cpu():
        from jaxgpt.cpu import malloc

        malloc.reexec()
