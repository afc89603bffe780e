"""The accelerator programs, audited from this CPU: the real train step exported for CUDA and TPU.

`jax.export` lowers for platforms=["cuda"] and ["tpu"] without such a device (the seeds'
walkthrough trains on Colab TPUs). The step is StepRunner's (the trainer's
own: the full optimiser chain, k = 2 microbatches in a lax.scan, donated state) on a small GPT-2
whose operations were selected for that backend (ops.select(cfg, "gpu" | "tpu")), in bfloat16,
for the three recipes: GPT-2's (AdamW), the modern one (every model.json option of layers.py, Muon)
and the 2026 one on top (grouped-query attention, windows, value embeddings, embedding and U-net skips).
What an accelerator would run must be the standard mixed-precision program: every dot_general of
the model multiplies bfloat16 operands into a float32 result (forward and both backward
products), none of the XLA:CPU layout forms (optimization barriers) is in it, and every donated
buffer is aliased to an output. Muon's Newton-Schulz products are the optimiser's, on float32
momenta: audited apart, exactly 3 float32 dots (X Xᵀ, A A, B X, in the loop's body) per
orthogonalised leaf.
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
from conftest import SLOW

from jaxgpt import ops
from jaxgpt.config import ModelConfig, TrainConfig
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.model.gpt import build_model
from jaxgpt.training import muon
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.train_step import StepRunner, step_key

L, T, K, B = 2, 32, 2, 2
CFG = ModelConfig(
    architecture="gpt2",
    vocab_size=96,
    context_length=T,
    emb_dim=64,
    n_heads=4,
    n_layers=L,
    qkv_bias=True,
    tie_embeddings=True,
    compute_dtype="bfloat16",
    attention="xla",
)
TRAIN = TrainConfig(microbatch_size=B, gradient_accumulation_steps=K, train_steps=10, weight_decay=0.1)
MODERN = {
    "positions": "rotary",
    "norm": "rmsnorm",
    "norm_scale": False,
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "zero_init_proj": True,
    "logit_softcap": 15.0,
    "tie_embeddings": False,
    "bias": False,
    "qkv_bias": False,
}
MUON = {"optimizer": "muon", "weight_decay": 0.0}
# The 2026 options: grouped-query attention, a per-layer window (traced in a scan), value embeddings,
# embedding and U-net skips (three scans when scanned).
NEW_2026 = {
    "n_kv_heads": 2,
    "window_pattern": "SL",
    "short_window": 8,
    "value_embeds": True,
    "embed_skips": True,
    "unet_skips": True,
}
VARIANTS = {  # (model.json, train.json) overrides
    "unrolled": ({}, {}),
    "scan-remat-chunked": ({"scan_layers": True, "remat": True, "loss_chunk": 24}, {}),
    "untied-dropout": ({"tie_embeddings": False, "drop_rate": 0.1}, {}),
    "modern-muon": (MODERN, MUON),
    "modern-muon-scan-chunked": ({**MODERN, "norm_scale": True, "scan_layers": True, "loss_chunk": 24}, MUON),
    "2026-muon": ({**MODERN, **NEW_2026}, MUON),
    "2026-muon-scan-remat": ({**MODERN, **NEW_2026, "scan_layers": True, "remat": True}, MUON),
}
PLATFORMS = {"cuda": "gpu", "tpu": "tpu"}  # export platform -> ops.select backend
# (lhs, rhs) -> result element types of a StableHLO dot_general
_TYPE = r"tensor<(?:[0-9?]+x)*(\w+)>"  # tensor<2x32x64xbf16> -> bf16
DOT = re.compile(rf"stablehlo\.dot_general .*?: \({_TYPE}, {_TYPE}\) -> {_TYPE}")


def exported_step(cfg: ModelConfig, backend: str, platform: str, train: TrainConfig = TRAIN) -> tuple[str, int, int]:
    """(StableHLO text of the train step with `backend`'s ops, exported for `platform`; number of
    state arrays; number of leaves Muon orthogonalises)."""
    model = build_model(cfg, ops=ops.select(cfg, backend))
    runner = StepRunner(model, make_optimizer(model, train, 10))
    batch = jax.ShapeDtypeStruct((K, B, T), jnp.int32)
    routed = jax.tree.leaves(muon.routes(model), is_leaf=lambda r: isinstance(r, muon.Route))
    n_muon = sum(r.part == "muon" for r in routed) if train.optimizer == "muon" else 0
    text = runner.export(Batch(batch, batch), step_key(0, 0), platforms=[platform]).mlir_module()
    return text, len(runner.leaves), n_muon


STEPS = [(v, p) for v in VARIANTS for p in PLATFORMS]
FAST = {("modern-muon-scan-chunked", "tpu"), ("2026-muon-scan-remat", "cuda")}  # the fast tier's


@pytest.fixture(
    scope="module", params=[pytest.param(s, id=f"{s[0]}-{s[1]}", marks=() if s in FAST else SLOW) for s in STEPS]
)
def accel_step(request) -> tuple[str, int, int, ModelConfig, str]:
    variant, platform = request.param
    model_kw, train_kw = VARIANTS[variant]
    cfg = dataclasses.replace(CFG, **model_kw)
    return (*exported_step(cfg, PLATFORMS[platform], platform, dataclasses.replace(TRAIN, **train_kw)), cfg, variant)


def test_every_model_dot_is_bfloat16_into_float32(accel_step) -> None:
    text, _, n_muon, cfg, variant = accel_step
    dots = DOT.findall(text)
    assert len(dots) == text.count("stablehlo.dot_general"), "a dot_general the pattern did not read"
    model_dots = [d for d in dots if d != ("f32", "f32", "f32")]
    # 6 matmuls a block (qkv, proj, fc, out, scores, values) x 3 products (forward, two backward),
    # per traced block (one when scanned), and the head's 3; remat adds forward recomputations.
    blocks = 1 if cfg.scan_layers else cfg.n_layers
    assert len(model_dots) >= 18 * blocks + 3, len(model_dots)
    assert set(model_dots) == {("bf16", "bf16", "f32")}, sorted(set(dots))
    # The rest are Muon's, on float32 momenta, and nothing else: 3 per orthogonalised leaf.
    assert len(dots) - len(model_dots) == 3 * n_muon, (len(dots) - len(model_dots), n_muon)
    muon_run = VARIANTS[variant][1].get("optimizer") == "muon"
    per_block = 4 if cfg.n_kv_heads in (None, cfg.n_heads) else 5  # qkv (as 3) or q and kv (as 2); proj, fc, out
    assert n_muon == (per_block * (1 if cfg.scan_layers else cfg.n_layers) if muon_run else 0), n_muon


def test_step_has_none_of_the_cpu_forms(accel_step) -> None:
    text, *_ = accel_step
    assert "optimization_barrier" not in text


def test_step_aliases_every_donated_buffer(accel_step) -> None:
    text, n_leaves, *_ = accel_step
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    # main's arguments: the model + optimiser arrays (donated), then inputs, targets, key
    assert main.count("tf.aliasing_output") == n_leaves > 50, (main.count("tf.aliasing_output"), n_leaves)


def test_cpu_forms_run_on_the_cpu_only() -> None:
    """The same model with the CPU's operations: its program does carry the XLA:CPU layout
    copies (so the CUDA test above is not blind to them), and the GPU selection does not."""
    cpu_text, *_ = exported_step(CFG, "cpu", "cpu")
    assert "optimization_barrier" in cpu_text
    assert ops.select(CFG, "cpu").product is not ops.select(CFG, "gpu").product
    assert ops.select(CFG, "gpu").product is ops.plain_product and type(ops.select(CFG, "gpu")) is ops.Ops
