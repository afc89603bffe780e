"""cpu_kernels' CPU facts and compute_dtype "auto" (deterministic: flag sets fed in, no timing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxgpt.config import ConfigError, ModelConfig, from_dict
from jaxgpt.cpu import kernels as cpu_kernels
from jaxgpt.ops import resolve_compute_dtype, select

ZEN5 = "avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni"  # this development machine's kind
SAPPHIRE_RAPIDS = "avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
SKYLAKE = "avx2 avx512f avx512bw avx512vl"
ZEN3 = "avx2 fma"
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B45
flags\t\t: fpu {flags}

processor\t: 1
model name\t: something else
flags\t\t: fpu
"""


@pytest.mark.parametrize(
    "flags, native",
    [(ZEN5, True), (SAPPHIRE_RAPIDS, True), (SKYLAKE, False), (ZEN3, False), ("amx_bf16", True), ("", False)],
)
def test_auto_compute_dtype_follows_native_bf16_flags(flags: str, native: bool) -> None:
    fs = frozenset(flags.split())
    assert cpu_kernels.native_bf16(fs) is native
    assert resolve_compute_dtype("auto", "cpu", fs) == ("bfloat16" if native else "float32")
    for asked in ("float32", "bfloat16"):  # an explicit choice is never overridden
        assert resolve_compute_dtype(asked, "cpu", fs) == asked


def test_auto_is_bfloat16_on_accelerators_and_resolved_in_ops() -> None:
    assert resolve_compute_dtype("auto", "gpu", frozenset()) == "bfloat16"
    assert resolve_compute_dtype("auto", "tpu") == "bfloat16"
    assert resolve_compute_dtype("float32", "gpu") == "float32"
    cfg = ModelConfig(
        architecture="gpt2", vocab_size=16, context_length=8, emb_dim=8, n_heads=2, n_layers=1, compute_dtype="auto"
    )
    expected = "bfloat16" if cpu_kernels.native_bf16(cpu_kernels.cpu_flags()) else "float32"
    assert select(cfg, "cpu").compute_dtype == expected  # the model's Ops carry the resolved dtype
    assert (
        ModelConfig(
            architecture="gpt2",
            vocab_size=16,
            context_length=8,
            emb_dim=8,
            n_heads=2,
            n_layers=1,
            compute_dtype="auto",
            attention="cudnn",
        ).compute_dtype
        == "auto"
    )  # bfloat16 where cuDNN runs
    with pytest.raises(ConfigError, match="compute_dtype"):  # model.json's values are checked on load
        from_dict(
            ModelConfig,
            {
                "architecture": "gpt2",
                "vocab_size": 16,
                "context_length": 8,
                "emb_dim": 8,
                "n_layers": 1,
                "compute_dtype": "float16",
            },
            "model.json",
        )


def test_cpu_info_reads_the_first_processor() -> None:
    info = cpu_kernels.cpu_info(CPUINFO.format(flags=ZEN5))
    assert info == {
        "model": "AMD EPYC 9B45",
        "avx512f": True,
        "avx512_bf16": True,
        "amx_bf16": False,
        "amx_tile": False,
        "native_bf16": True,
    }
    assert cpu_kernels.cpu_flags(CPUINFO.format(flags=SAPPHIRE_RAPIDS)) >= {"amx_bf16", "amx_tile", "fpu"}
    assert cpu_kernels.cpu_info("") == {
        "model": None,
        "avx512f": False,
        "avx512_bf16": False,
        "amx_bf16": False,
        "amx_tile": False,
        "native_bf16": False,
    }


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo here")
def test_cpu_info_on_this_machine() -> None:
    text = Path("/proc/cpuinfo").read_text()
    models = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    flag_lines = [line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")]
    info = cpu_kernels.cpu_info()
    assert info["model"] == (models[0] if models else None)
    if flag_lines:
        flags = set(flag_lines[0])
        assert cpu_kernels.cpu_flags() == flags
        assert info["avx512f"] == ("avx512f" in flags) and info["amx_bf16"] == ("amx_bf16" in flags)
        assert info["native_bf16"] == bool(flags & {"avx512_bf16", "amx_bf16"})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vecmat_is_the_vector_matrix_product_of_the_dtypes_values(dtype: str) -> None:
    """cpu_kernels.vecmat against numpy in float64 on the same (rounded) values; ops.vecmat elsewhere is an einsum."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 40)).astype(np.float32), rng.standard_normal((2, 3, 40, 7)).astype(np.float32)
    got = np.asarray(cpu_kernels.vecmat(jnp.asarray(a), jnp.asarray(b), dtype))
    ra, rb = (np.asarray(jnp.asarray(t).astype(dtype).astype(jnp.float32), np.float64) for t in (a, b))
    np.testing.assert_allclose(got, np.einsum("hik,hikn->hin", ra, rb), rtol=0, atol=1e-5)
    assert got.dtype == np.float32 and got.shape == (2, 3, 7)
    if dtype == "bfloat16":  # the rounding is really there
        assert np.abs(np.einsum("hik,hikn->hin", a.astype(np.float64), b) - got).max() > 1e-3
    gpu = select(
        ModelConfig(
            architecture="gpt2", vocab_size=8, context_length=8, emb_dim=8, n_heads=1, n_layers=1, compute_dtype=dtype
        ),
        "gpu",
    )
    np.testing.assert_allclose(np.asarray(gpu.vecmat(jnp.asarray(a), jnp.asarray(b))), got, rtol=0, atol=1e-5)
