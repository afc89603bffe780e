"""What the Muon tests share: a tiny GPT-2 (and a grouped-query one), a train.json for optimizer
"muon" with every part at its own rate, the routing written from the parameter names, and the
(in, out) matrices Muon sees in a leaf.

Each optimiser is the real one (make_transform) on the tiny model, updated with synthetic gradients
through one small jitted wrapper (a loss gradient would cost a compile of its own).
"""

from __future__ import annotations

import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgpt.config import ModelConfig, MuonConfig, TrainConfig
from jaxgpt.model.gpt import build_model
from jaxgpt.training import muon
from jaxgpt.training.optimizer import make_transform

MODEL = ModelConfig(
    architecture="gpt2", vocab_size=50, context_length=8, emb_dim=16, n_heads=2, n_layers=2, qkv_bias=True
)
GQA = replace(MODEL, n_heads=4, n_kv_heads=2, emb_dim=16, qkv_bias=False)
TOTAL = 10
# Every part its own rate, so that an update applied with another part's rate shows.
MUON = MuonConfig(
    momentum_warmup_steps=4,
    weight_decay=0.05,
    embed_learning_rate=0.03,
    head_learning_rate=0.005,
    scalar_learning_rate=0.007,
)


def train_cfg(**kw) -> TrainConfig:
    base = {
        "microbatch_size": 2,
        "gradient_accumulation_steps": 2,
        "train_steps": TOTAL,
        "optimizer": "muon",
        "learning_rate": 0.02,
        "warmup_percent": 20.0,
        "lr_init_factor": 0.1,
        "lr_end_factor": 0.1,
        "weight_decay": 0.1,
        "clipping_max_norm": 1e9,
        "muon": MUON,
    }
    return TrainConfig(**(base | kw))


def expected_part(name: str) -> str:
    """The routing the issue asks for, written from the parameter names (muon.py uses the axes)."""
    if name in ("tok_emb.embedding", "pos_emb.embedding"):
        return "embed"
    if name == "head.kernel":
        return "head"
    if re.fullmatch(r"blocks(\.\d+)?\.(attn\.(qkv|proj)|mlp\.(fc|out))\.kernel", name):
        return "muon"
    assert name.endswith((".bias", ".scale")), name
    return "scalar"


def flat_names(state) -> dict[str, object]:
    return {".".join(map(str, p)): v for p, v in nnx.to_flat_state(state)}


def routed(model: nnx.Module) -> dict[str, muon.Route]:
    return flat_names(muon.routes(model))


def params_np(model: nnx.Module) -> dict[str, np.ndarray]:
    return {n: np.array(v.get_value()) for n, v in flat_names(nnx.state(model, nnx.Param)).items()}


def random_grads(model: nnx.Module, seed: int) -> nnx.State:
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), nnx.state(model, nnx.Param))


def abstract_optimizer(train: TrainConfig) -> nnx.Optimizer:
    """For nnx.eval_shape: what make_optimizer builds (muon routing included)."""
    model = build_model(MODEL)
    routing = muon.routes(model) if train.optimizer == "muon" else None
    return nnx.Optimizer(model, make_transform(train, TOTAL, routing), wrt=nnx.Param)


def _fused(name: str) -> int:
    return 3 if name.endswith("qkv.kernel") else 2 if name.endswith(".kv.kernel") else 1


def matrices(name: str, x: np.ndarray) -> list[np.ndarray]:
    """The (in, out) matrices Muon sees in a leaf: one per layer if stacked, fused ones (q, k, v; k, v) apart."""
    layers = list(x) if x.ndim == 3 else [x]
    return [m for layer in layers for m in np.split(layer, _fused(name), axis=-1)]


def join(name: str, like: np.ndarray, mats: list[np.ndarray]) -> np.ndarray:
    """The inverse of `matrices`."""
    fused = _fused(name)
    per_layer = [np.concatenate(mats[i : i + fused], axis=-1) for i in range(0, len(mats), fused)]
    return np.stack(per_layer) if like.ndim == 3 else per_layer[0]
