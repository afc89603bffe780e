"""fast_malloc: the entry scripts restart once with glibc's huge-page malloc, and it cuts XLA's page faults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fast_malloc

ROOT = Path(__file__).resolve().parent.parent
SHOW = "import fast_malloc, os; fast_malloc.reexec(); print(os.environ.get('GLIBC_TUNABLES'))"

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
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_set_tunables_are_left_alone() -> None:
    assert not fast_malloc.needed({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})  # the documented opt-out
    assert child(SHOW, GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"


def test_restart_sets_the_tunable_where_it_helps() -> None:
    expected = "glibc.malloc.hugetlb=1" if fast_malloc.needed({}) else "None"
    assert child(SHOW) == expected
    if fast_malloc.needed({}):  # other tunables are kept
        assert child(SHOW, GLIBC_TUNABLES="glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.skipif(not fast_malloc.needed({}), reason="needs glibc >= 2.35 and transparent huge pages in madvise mode")
def test_huge_pages_cut_the_page_faults_of_a_large_xla_buffer() -> None:
    plain = float(child(FAULTS, GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))
    huge = float(child(FAULTS, GLIBC_TUNABLES="glibc.malloc.hugetlb=1"))
    assert plain > 8000  # every 4 KiB page of the 64 MiB output faults again on every call ...
    assert huge < plain / 10, (plain, huge)  # ... and 2 MiB pages take far fewer faults
