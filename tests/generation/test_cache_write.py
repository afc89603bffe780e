"""How a decode step writes its KV cache (kv_cache.KVCache.write): the TPU's "select" decodes exactly
as the CPU's and the GPU's "scatter", and the TPU's decode programs scatter nothing into the cache.

A TPU lays a scatter's operand out anew: around every decode program XLA copied the whole cache to
another layout and back (1.5 GB of temporaries at 16 rows of GPT-2 124M, 9 GB and 459 ms a step at
96; docs/log.md "The KV cache's write on the TPU"). XLA:CPU keeps its layouts, so this CPU cannot
show the copies; it shows what causes them, a scatter into a cache-shaped array in the compiled
program, which the TPU's operations must not emit, and that the write replacing it is exact."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import F32_SLACK, ON_ACCELERATOR
from flax import nnx
from test_generate import MODERN, NEW_2026, tiny

from jaxgpt.generation import decoder as g
from jaxgpt.model.gpt import build_model
from jaxgpt.ops import neutral, select
from jaxgpt.ops.tpu import TpuOps

CASES = {
    "gpt2-float32": {},
    "gpt2-bfloat16": {"compute_dtype": "bfloat16"},
    "2026-bfloat16": {**MODERN, **NEW_2026, "compute_dtype": "bfloat16"},  # grouped heads, a short window
}


def decoder(source: nnx.Module, ops: neutral.Ops, rows: int) -> g.KVDecoder:
    """A decoder of `source`'s weights run by `ops`."""
    model = build_model(source.cfg, ops=ops)
    nnx.update(model, nnx.state(source, nnx.Param))
    return g.KVDecoder(model, rows)


def decode(dec: g.KVDecoder) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Prefills of three lengths, steps where a row now and then holds still, then a greedy burst:
    every logit, the burst's ids and each row's cache slots below its length."""
    logits = [dec.prefill([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]])]
    for t in range(6):
        logits.append(dec.step([11 + t, 12 + t, 13 + t], advance=np.array([True, t % 2 == 0, t < 3])))
    ids, last = dec.steps([20, 21, 22], 4)
    logits.append(last)
    k, v = (np.asarray(c) for c in dec._cache)
    held = [a for b, n in enumerate(dec.lengths) for a in (k[:, b, ..., :n], v[:, b, :, :n])]
    return np.stack(logits), ids, held


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_the_select_write_decodes_as_the_scatter_bit_for_bit(kw: dict) -> None:
    source = tiny(31, **kw)
    ops = neutral.Ops("cpu", source.cfg.compute_dtype, "xla")
    got = {how: decode(decoder(source, dataclasses.replace(ops, cache_write=how), 3)) for how in ("select", "scatter")}
    (logits, ids, held), (ref_logits, ref_ids, ref_held) = got["select"], got["scatter"]
    assert len(held) == len(ref_held) == 6
    for a, b in zip(held, ref_held):  # the same keys and values in the same slots
        if ON_ACCELERATOR:  # projected in two programs, fused and summed differently: within float32 rounding
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * F32_SLACK * np.abs(b).max())
        else:
            np.testing.assert_array_equal(a, b)
    if ON_ACCELERATOR:
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-5 * F32_SLACK * np.abs(ref_logits).max())
    else:
        np.testing.assert_array_equal(logits, ref_logits)
        np.testing.assert_array_equal(ids, ref_ids)
    assert np.abs(ref_logits).max() > 1 and held[0].size > 0  # a real model and real slots compared


def cache_scatters(dec: g.KVDecoder) -> dict[str, int]:
    """Scatters into a cache-shaped array in the compiled step and burst programs."""
    shapes = [",".join(map(str, c.shape)) for c in dec._cache]
    found = {}
    for kind, size in (("step", dec.span_for(1)), ("steps", (dec.span_for(4), 4))):
        text = dec._compiled(kind, size).as_text()
        lines = [line for line in text.splitlines() if re.search(r"\bscatter\(", line)]
        found[kind] = sum(any(f"[{s}]" in line for s in shapes) for line in lines)
    return found


def test_the_tpus_decode_programs_scatter_nothing_into_the_cache() -> None:
    """The TPU's operations (their decode path is XLA's, compiled here for this CPU) write by the select;
    the search finds the others' in-place scatter, so it would find the TPU's."""
    source = tiny(32, compute_dtype="bfloat16")
    tpu = TpuOps("tpu", "bfloat16", "splash", interpret=True)
    assert tpu.cache_write == "select"
    assert cache_scatters(decoder(source, tpu, 3)) == {"step": 0, "steps": 0}
    others = [neutral.Ops("gpu", "bfloat16", "xla"), select(source.cfg, "cpu")]  # a GPU's, the CPU's
    assert [ops.cache_write for ops in others] == ["scatter", "scatter"]
    for ops in others[: 1 if ON_ACCELERATOR else 2]:  # the CPU's run only on a CPU (its native decode kernel)
        assert all(n >= 2 for n in cache_scatters(decoder(source, ops, 3)).values()), type(ops).__name__
