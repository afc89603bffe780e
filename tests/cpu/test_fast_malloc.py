"""jaxgpt/cpu/malloc.py (and jaxgpt/backend.py, which decides to use it): the entry scripts restart once
with glibc's huge-page malloc, and it cuts XLA's page faults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from jaxgpt import backend
from jaxgpt.cpu import malloc as fast_malloc

SHOW = "import os; from jaxgpt import backend; backend.prepare_process(); print(os.environ.get('GLIBC_TUNABLES'))"

# Minor page faults per call of a jitted op writing a fresh 64 MiB buffer (printed by the child).
FAULTS = """
import resource, jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32)
f = jax.jit(lambda x: x * 2.0)
f(x).block_until_ready()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    f(x).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5)
"""


def child(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_set_tunables_are_left_alone() -> None:
    assert not fast_malloc.needed({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})  # the documented opt-out
    assert child(SHOW, GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"


def test_restart_sets_the_tunable_where_it_helps() -> None:
    expected = "glibc.malloc.hugetlb=1" if fast_malloc.needed({}) else "None"
    assert child(SHOW) == expected
    if fast_malloc.needed({}):  # other tunables are kept
        assert (
            child(SHOW, GLIBC_TUNABLES="glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
        )


@pytest.mark.skipif(not fast_malloc.needed({}), reason="needs glibc >= 2.35 and transparent huge pages in madvise mode")
def test_huge_pages_cut_the_page_faults_of_a_large_xla_buffer() -> None:
    plain = float(child(FAULTS, GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))
    huge = float(child(FAULTS, GLIBC_TUNABLES="glibc.malloc.hugetlb=1"))
    assert plain > 8000  # every 4 KiB page of the 64 MiB output faults again on every call ...
    assert huge < plain / 10, (plain, huge)  # ... and 2 MiB pages take far fewer faults


def base_needed() -> bool:
    """needed() on this machine for a CPU process, whatever is installed."""
    return fast_malloc.needed({})


def test_this_venv_runs_on_the_cpu() -> None:
    assert backend.accelerator_plugins() == []  # the project's CPU-only jax
    assert backend.runs_on_cpu({}) and fast_malloc.needed({}) == base_needed()


@pytest.mark.parametrize(
    "platforms, on_cpu",
    [("cuda", False), ("tpu", False), ("rocm,cpu", False), ("cpu", True), ("cpu,cuda", True), ("", True)],
)
def test_jax_platforms_decides_first(platforms: str, on_cpu: bool) -> None:
    assert backend.runs_on_cpu({"JAX_PLATFORMS": platforms}) is on_cpu
    expected = "glibc.malloc.hugetlb=1" if on_cpu and base_needed() else "None"
    assert child(SHOW, JAX_PLATFORMS=platforms) == expected  # prepare_process restarts on the CPU only


@pytest.mark.parametrize("kind", ["namespace", "entry-point", "libtpu"])
def test_no_restart_where_an_accelerator_plugin_is_installed(tmp_path: Path, kind: str) -> None:
    """A plugin installed the way each real one is (jax-cuda13-plugin's jax_plugins.xla_cuda13,
    an entry point in the jax_plugins group, libtpu), as real files on the child's path."""
    if kind == "namespace":
        (tmp_path / "jax_plugins" / "xla_cuda13").mkdir(parents=True)
        (tmp_path / "jax_plugins" / "xla_cuda13" / "__init__.py").write_text("")
    elif kind == "entry-point":
        info = tmp_path / "fake_jax_plugin-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-jax-plugin\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[jax_plugins]\nfake_gpu = fake_jax_plugin\n")
    else:
        (tmp_path / "libtpu").mkdir()
        (tmp_path / "libtpu" / "__init__.py").write_text("")
    path = f"{tmp_path}{os.pathsep}{ROOT}"
    code = "from jaxgpt import backend; print(backend.accelerator_plugins())"
    assert child(code, PYTHONPATH=path) != "[]"
    assert child(SHOW, PYTHONPATH=path) == "None"  # an accelerator machine: no restart
    # ... unless this process is told to run on the CPU
    assert child(SHOW, PYTHONPATH=path, JAX_PLATFORMS="cpu") == ("glibc.malloc.hugetlb=1" if base_needed() else "None")
