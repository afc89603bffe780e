"""cpu_matvec: the native bfloat16 kernel against float64 products, built for real with the machine's
compiler (both its AVX2 and its generic-vector forms), its cache, and its one-line failures."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, SLOW

from jaxgpt.cpu import matvec as cpu_matvec

# (N, K, M): one to nine rows (tiles of 4 and every remainder), K with and without a tail past the
# 16 values a step takes (7: no vector at all), M from one output to more than a chunk per thread.
SHAPES = [
    (1, 7, 3),
    (1, 8, 1),
    (2, 24, 5),
    (3, 40, 13),
    (4, 768, 300),
    (5, 100, 33),
    (8, 3072, 64),
    (9, 771, 1030),
    (16, 64, 4099),
]


def operands(N: int, K: int, M: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((N, K)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((M, K)) / np.sqrt(K), jnp.bfloat16)
    return x, w


def assert_is_the_product(got: jax.Array, x: jax.Array, w: jax.Array) -> None:
    """Within float32 summation's error bound of the float64 product of the same values: K terms of
    the same signs' magnitudes at most K * 2^-24 * sum |x w| apart; and not a zero or a transpose."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w.astype(jnp.float32), np.float64)
    ref, scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
    got = np.asarray(got)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert (np.abs(got - ref) <= x.shape[1] * 2.0**-24 * scale + 1e-30).all(), np.abs(got - ref).max()
    assert np.abs(ref).max() > 0.1


def test_the_kernel_builds_here() -> None:
    """Wherever there is a C++ compiler (CI, this project's machines), the kernel builds and registers:
    the decoding tests rely on it, and a broken build must not pass as a quiet fallback."""
    assert cpu_matvec.compiler() is not None, "no C++ compiler on this machine"
    assert cpu_matvec.available(), cpu_matvec.unavailable_reason()
    assert cpu_matvec.unavailable_reason() is None


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matvec_is_the_float32_product_of_the_bfloat16_weights(shape: tuple[int, int, int]) -> None:
    assert cpu_matvec.available(), cpu_matvec.unavailable_reason()
    x, w = operands(*shape)
    got = jax.jit(cpu_matvec.matvec)(x, w)
    assert_is_the_product(got, x, w)
    assert np.array_equal(np.asarray(jax.jit(cpu_matvec.matvec)(x, w)), np.asarray(got))  # deterministic


def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it() -> None:
    """Batch-invariant: row b of a batched call equals the same row decoded alone, bit for bit (every
    row's sums are the same sequence of operations, whatever tile it lands in)."""
    x, w = operands(7, 771, 300, seed=4)
    batched = np.asarray(cpu_matvec.matvec(x, w))
    for b in range(7):
        assert np.array_equal(np.asarray(cpu_matvec.matvec(x[b : b + 1], w))[0], batched[b]), b


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the AVX2 form is x86-64's")
def test_the_generic_vector_form_computes_the_same_product(tmp_path: Path) -> None:
    """The form other CPUs compile (the compiler's generic vectors; NEON on ARM), built here for x86-64
    without AVX2 and FMA, registered beside the native one under its own name."""
    flags = [f for f in cpu_matvec.FLAGS if f != "-march=native"] + ["-march=x86-64", "-mno-avx2", "-mno-fma"]
    path = cpu_matvec.build(tmp_path, flags=flags)
    if shutil.which("objdump"):  # no 256-bit register in it: not the AVX2 form
        assert "ymm" not in subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True).stdout
    cpu_matvec.register(path, "jaxgpt_bf16_matvec_generic")
    for shape in SHAPES:
        x, w = operands(*shape, seed=1)
        assert_is_the_product(cpu_matvec.matvec(x, w, target="jaxgpt_bf16_matvec_generic"), x, w)


def test_a_failed_build_is_one_line_naming_the_compiler(tmp_path: Path) -> None:
    with pytest.raises(cpu_matvec.BuildError, match=r"^/nonexistent/c\+\+: .*No such file") as e:
        cpu_matvec.build(tmp_path, cxx=["/nonexistent/c++"])
    assert "\n" not in str(e.value)
    with pytest.raises(cpu_matvec.BuildError, match=r"failed on jaxgpt/cpu/matvec\.cc: .*error") as e:
        cpu_matvec.build(tmp_path, flags=[*cpu_matvec.FLAGS, "-fno-such-option"])
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def _fresh_process(env: dict[str, str], cache: Path) -> subprocess.CompletedProcess:
    code = (
        "from jaxgpt.cpu import matvec as cpu_matvec; ok = cpu_matvec.available(); "
        "print(ok, cpu_matvec.unavailable_reason()); "
        "ok or print(cpu_matvec.available())"
    )  # asked twice, noted once
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "JAXGPT_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"},
    )


def test_without_a_compiler_or_switched_off_it_says_why_once(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("CXX", cpu_matvec.SWITCH)}
    done = _fresh_process({**env, "CXX": "/nonexistent/c++"}, tmp_path / "a")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False /nonexistent/c++: [Errno 2] No such file or directory: '/nonexistent/c++'",
        "False",
    ]
    notes = [line for line in done.stderr.splitlines() if "unavailable" in line]
    assert notes == [
        f"note: jaxgpt/cpu/matvec.cc unavailable ({done.stdout.splitlines()[0].split(' ', 1)[1]}): bfloat16 models "
        f"decode through XLA's float32 kernels, slower on the CPU ({cpu_matvec.SWITCH}=0 silences this)"
    ]
    done = _fresh_process({**env, cpu_matvec.SWITCH: "0"}, tmp_path / "b")
    assert done.stdout.splitlines()[0] == f"False switched off ({cpu_matvec.SWITCH}=0)"
    assert "note:" not in done.stderr and not (tmp_path / "b").exists()  # nothing built


@SLOW  # the C++ kernel compiled twice by the machine's compiler
def test_the_library_is_built_once_per_machine_and_rebuilt_when_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path))
    path = cpu_matvec.library()
    assert path.is_file() and path.is_relative_to(tmp_path / "native")
    built = path.stat().st_mtime_ns
    assert cpu_matvec.library() == path and path.stat().st_mtime_ns == built  # found, not built again
    path.write_bytes(b"not a library")
    monkeypatch.setattr(cpu_matvec, "_state", {})
    monkeypatch.setattr(cpu_matvec, "register", _register_once_loadable := _Recorder(cpu_matvec.register))
    assert cpu_matvec.available(), cpu_matvec.unavailable_reason()
    assert _register_once_loadable.failures == 1 and path.stat().st_size > 1000  # loaded after a rebuild


class _Recorder:
    """register as it is, counting the libraries ctypes refused (OSError) on the way."""

    def __init__(self, register) -> None:
        self.register, self.failures = register, 0

    def __call__(self, path: Path, target: str = cpu_matvec.TARGET) -> None:
        try:
            self.register(path, target + "_test" if target == cpu_matvec.TARGET else target)
        except OSError:
            self.failures += 1
            raise
