"""The GPU program, audited from this CPU: the real train step exported for CUDA.

`jax.export` lowers for platforms=["cuda"] without a GPU. The step is StepRunner's (the trainer's
own: the full optimiser chain, k = 2 microbatches in a lax.scan, donated state) on a small GPT-2
whose operations were selected for the GPU (ops.select(cfg, "gpu")), in bfloat16. What a GPU
would run must be the standard mixed-precision program: every dot_general multiplies bfloat16
operands into a float32 result (forward and both backward products), none of the XLA:CPU layout
forms (optimization barriers) is in it, and every donated buffer is aliased to an output.
cuDNN's attention cannot be lowered without cuDNN, so these use XLA's ("xla"). (An unrolled
`remat` model does carry barriers: jax.checkpoint's own, which keep XLA from merging the
recomputation back into the forward pass; scanned, it needs none.)
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import ops
from config import ModelConfig, TrainConfig
from model import build_model
from optim import make_optimizer
from step import StepRunner, step_key

L, T, K, B = 2, 32, 2, 2
CFG = ModelConfig(architecture="gpt2", vocab_size=96, context_length=T, emb_dim=64, n_heads=4, n_layers=L,
                  qkv_bias=True, tie_embeddings=True, compute_dtype="bfloat16", attention="xla")
TRAIN = TrainConfig(microbatch_size=B, gradient_accumulation_steps=K, train_steps=10, weight_decay=0.1)
VARIANTS = {
    "unrolled": {},
    "scan-remat-chunked": {"scan_layers": True, "remat": True, "loss_chunk": 24},
    "untied-dropout": {"tie_embeddings": False, "drop_rate": 0.1},
}
# (lhs, rhs) -> result element types of a StableHLO dot_general
_TYPE = r"tensor<(?:[0-9?]+x)*(\w+)>"  # tensor<2x32x64xbf16> -> bf16
DOT = re.compile(rf"stablehlo\.dot_general .*?: \({_TYPE}, {_TYPE}\) -> {_TYPE}")


def exported_step(cfg: ModelConfig, backend: str, platform: str) -> tuple[str, int]:
    """(StableHLO text of the train step with `backend`'s ops, exported for `platform`; number of state arrays)."""
    model = build_model(cfg, ops=ops.select(cfg, backend))
    runner = StepRunner(model, make_optimizer(model, TRAIN, 10))
    batch = jax.ShapeDtypeStruct((K, B, T), jnp.int32)
    return runner.export(batch, batch, step_key(0, 0), platforms=[platform]).mlir_module(), len(runner.leaves)


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def cuda_step(request) -> tuple[str, int, ModelConfig]:
    cfg = dataclasses.replace(CFG, **VARIANTS[request.param])
    return (*exported_step(cfg, "gpu", "cuda"), cfg)


def test_every_cuda_dot_is_bfloat16_into_float32(cuda_step) -> None:
    text, _, cfg = cuda_step
    dots = DOT.findall(text)
    assert len(dots) == text.count("stablehlo.dot_general"), "a dot_general the pattern did not read"
    # 6 matmuls a block (qkv, proj, fc, out, scores, values) x 3 products (forward, two backward),
    # per traced block (one when scanned), and the head's 3; remat adds forward recomputations.
    blocks = 1 if cfg.scan_layers else cfg.n_layers
    assert len(dots) >= 18 * blocks + 3, len(dots)
    assert set(dots) == {("bf16", "bf16", "f32")}, sorted(set(dots))


def test_cuda_step_has_none_of_the_cpu_forms(cuda_step) -> None:
    text, _, _ = cuda_step
    assert "optimization_barrier" not in text


def test_cuda_step_aliases_every_donated_buffer(cuda_step) -> None:
    text, n_leaves, _ = cuda_step
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    # main's arguments: the model + optimiser arrays (donated), then inputs, targets, key
    assert main.count("tf.aliasing_output") == n_leaves > 50, (main.count("tf.aliasing_output"), n_leaves)


def test_cpu_forms_run_on_the_cpu_only() -> None:
    """The same model with the CPU's operations: its program does carry the XLA:CPU layout
    copies (so the CUDA test above is not blind to them), and the GPU selection does not."""
    cpu_text, _ = exported_step(CFG, "cpu", "cpu")
    assert "optimization_barrier" in cpu_text
    assert ops.select(CFG, "cpu").product is not ops.select(CFG, "gpu").product
    assert ops.select(CFG, "gpu").product is ops.plain_product and not ops.select(CFG, "gpu").rows_dense
