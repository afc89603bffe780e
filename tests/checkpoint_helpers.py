"""Shared parts of the checkpoint tests: one tiny GPT-2 trained once, a run with a real
checkpoint, and small helpers. Everything on real files (safetensors, Orbax), no mocks."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgpt.config import ModelConfig, TrainConfig, to_dict
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_transform, optimizer_stats

MCFG = ModelConfig(
    architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.1
)
TCFG = TrainConfig(microbatch_size=2, gradient_accumulation_steps=2, train_steps=10, warmup_percent=20.0, seed=7)
MICRO = TCFG.gradient_accumulation_steps  # microbatches per train_step call
TOTAL_STEPS = 10
CONFIGS = {"model.json": to_dict(MCFG), "train.json": to_dict(TCFG)}
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
NAME_RE = re.compile(r"^\d{8}T\d{6}Z-step-\d+$")


# ----------------------------------------------------------------------------- helpers


def batch(i: int, k: int = MICRO) -> tuple[jax.Array, jax.Array]:
    """A deterministic (k, B, T) next-token batch; i picks it."""
    x = np.random.default_rng(100 + i).integers(0, MCFG.vocab_size, (k, TCFG.microbatch_size, 16), dtype=np.int32)
    return jnp.asarray(x), jnp.asarray(np.roll(x, -1, axis=-1))


# make_optimizer(model, TCFG, TOTAL_STEPS) is exactly nnx.Optimizer(model, make_transform(...)); the
# transform is built once here because a new one (new schedule closures) means a new graphdef,
# and so a fresh ~10 s compile of train_step for every optimiser.
TX = make_transform(TCFG, TOTAL_STEPS)


def fresh(seed: int = 1, cfg: ModelConfig = MCFG) -> tuple[nnx.Module, nnx.Optimizer]:
    """A newly initialised model and optimiser (zero moments, empty accumulation window)."""
    model = build_model(cfg, seed=seed)
    optimizer = nnx.Optimizer(model, TX, wrt=nnx.Param)
    # Commit every array to the device, as restored arrays are (load_checkpoint places them on
    # the old sharding): jit specialises on committed-ness, and the continued-training check
    # would otherwise pay a second compile of train_step.
    device = jax.devices()[0]
    for obj in (model, optimizer):
        nnx.update(obj, jax.tree.map(lambda a: jax.device_put(a, device), nnx.state(obj)))
    return model, optimizer


@nnx.jit
def apply_update(model: nnx.Module, optimizer: nnx.Optimizer, grads: nnx.State) -> None:
    """One microbatch through the optimiser by hand (train_step always closes its window)."""
    optimizer.update(model, grads)


def flat(obj) -> dict[str, np.ndarray]:
    """Every leaf of nnx.state(obj) as a host copy (a copy: train_step donates its inputs)."""
    return {
        "/".join(map(str, path)): np.array(jax.device_get(var.get_value()))
        for path, var in nnx.to_flat_state(nnx.state(obj))
    }


def same_bits(a, b) -> bool:
    """Bit-identical arrays: dtype, shape and bytes (NaN == NaN, 0.0 != -0.0)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert same_bits(a[key], b[key]), key


def deep_clone(obj):
    """A copy with its own buffers (nnx.clone shares them, and train_step donates them)."""
    graphdef, state = nnx.split(obj)
    device = jax.devices()[0]
    return nnx.merge(graphdef, jax.tree.map(lambda a: jax.device_put(jnp.array(a, copy=True), device), state))


def host_stats(optimizer: nnx.Optimizer) -> dict[str, np.ndarray]:
    return {k: np.asarray(jax.device_get(v)) for k, v in optimizer_stats(optimizer).items()}


def make_meta(step: int, *, is_best: bool = False, **extra) -> dict:
    meta = {
        "format": 1,
        "step": step,
        "train_loss": {"min": 3.25, "max": 4.5, "mean": 4.0, "last": 3.875},
        "is_best": is_best,
        "data_position": {"next_step": step, "microbatches_consumed": 2 * step, "epoch": 0},
        "rng": {"seed": TCFG.seed, "next_step": step, "scheme": "fold_in(key(seed), step)"},
    }
    meta.update(extra)
    return meta


def ckpt_name(step: int, now: dt.datetime = T0) -> str:
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-step-{step}"


def fake_ckpt(run: Path, name: str, step: int | None = None) -> Path:
    """A folder that only looks complete (meta.json): enough for listing and resolution."""
    path = run / "checkpoints" / name
    path.mkdir(parents=True)
    step = int(name.rsplit("-", 1)[1]) if step is None else step
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return path


def entries(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def assert_one_line_error(err: pytest.ExceptionInfo, path: Path) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg


def without_files(meta: dict) -> dict:
    """meta.json as the trainer gave it: save_checkpoint adds the `files` records."""
    return {k: v for k, v in meta.items() if k != "files"}
