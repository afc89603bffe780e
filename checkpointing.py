"""Checkpoints: safetensors weights + Orbax optimiser state + meta.json, written atomically.

This is the only module that imports Orbax. The layout, and everything that reads a checkpoint
without JAX (finding, resolving, meta.json, moving aside, pruning), is checkpoint_files.py; its
names are re-exported here, so `checkpointing` is the one module a caller needs.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from checkpoint_files import (  # noqa: F401 - re-exported: the JAX-free half of this module's interface
    CHECKPOINTS, META, OPTIMIZER, WEIGHTS, CheckpointError, checkpoint_configs, checkpoints_dir,
    fsync_dir, fsync_tree, latest_checkpoint, list_checkpoints, move_aside, point, prune, read_configs,
    read_meta, remove_leftovers, resolve_checkpoint, resolve_weights, step_of, write_json)
from config import ModelConfig, TrainConfig
from model import build_model, stack_layer_weights, unstack_layer_weights
from tokenizer import Tokenizer, get_tokenizer

# ----------------------------------------------------------------------------- weights


def weights_to_numpy(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as a flat {dotted key: host array} dict.

    Sharded parameters are gathered first; across processes every process must call this.
    """
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    tensors = {".".join(map(str, path)): _to_host(var.get_value()) for path, var in flat}
    # Files always hold per-layer keys (blocks.3.attn.qkv.kernel), whatever scan_layers says.
    return unstack_layer_weights(tensors) if model.cfg.scan_layers else tensors


def _to_host(x: jax.Array) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_weights(model: nnx.Module, path: Path) -> None:
    save_file(weights_to_numpy(model), str(path))


def load_weights(model: nnx.Module, path: Path) -> None:
    """Load a safetensors file into `model` in place; keys and shapes must match exactly."""
    path = Path(path)
    try:
        tensors = load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: weights file not found") from None
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from None
    assign_weights(model, tensors, str(path))


def assign_weights(model: nnx.Module, tensors: dict[str, np.ndarray], where: str) -> None:
    if model.cfg.scan_layers:
        tensors = stack_layer_weights(tensors, model.cfg.n_layers)
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    expected = {".".join(map(str, p)) for p, _ in flat}
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: weights do not match model.json (missing {missing[:3]}, unexpected {unexpected[:3]})")
    new = []
    for path, var in flat:
        key = ".".join(map(str, path))
        old, arr = var.get_value(), tensors[key]
        if tuple(arr.shape) != tuple(old.shape):
            raise CheckpointError(f"{where}: {key} has shape {arr.shape}, model.json needs {old.shape}")
        # Keep each parameter's placement (sharding), whatever mesh the file was written from;
        # each device takes just its slice (make_array_from_callback also works across processes).
        host = np.asarray(arr, dtype=old.dtype)
        new.append((path, var.replace(jax.make_array_from_callback(host.shape, old.sharding, lambda i, h=host: h[i]))))
    nnx.update(model, nnx.from_flat_state(new))


# ----------------------------------------------------------------------------- save


def save_checkpoint(run_dir: Path, model: nnx.Module, optimizer: nnx.Optimizer,
                    meta: dict[str, Any], configs: dict[str, dict[str, Any]], *,
                    keep_last: int, now: dt.datetime | None = None) -> Path:
    """Write one checkpoint atomically, move `latest` (and `best` if meta["is_best"]), prune.

    Raises on any failure: a run must stop loudly rather than train on without checkpoints.
    """
    root = checkpoints_dir(run_dir)
    name = f"{_agreed_time(now).strftime('%Y%m%dT%H%M%SZ')}-step-{meta['step']}"
    final, tmp = root / name, root / f".tmp-{name}"
    # Every process takes part in the Orbax save and the weight gather; process 0 alone
    # writes the other files and moves the pointers.
    main = jax.process_index() == 0
    if main:
        root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(root)
        tmp.mkdir()
    _sync("checkpoint-start")
    weights = weights_to_numpy(model)
    ocp.v1.save((tmp / OPTIMIZER).absolute(), nnx.state(optimizer))  # Orbax wants absolute paths
    if main:
        save_file(weights, str(tmp / WEIGHTS))
        for filename, cfg in configs.items():
            write_json(tmp / filename, cfg)
        write_json(tmp / META, meta)  # last: its presence marks the folder complete
        fsync_tree(tmp)
        if final.exists():  # same step saved twice within one second: keep the newer one
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
        point(root, "latest", name)
        if meta.get("is_best"):
            point(root, "best", name)
        prune(run_dir, keep_last)
    _sync("checkpoint-done")
    return final


# ----------------------------------------------------------------------------- load


def load_checkpoint(ckpt: Path, model: nnx.Module, optimizer: nnx.Optimizer | None = None) -> dict[str, Any]:
    """Restore weights (and optimiser state) in place; return the checkpoint's meta.json."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt)
    load_weights(model, ckpt / WEIGHTS)
    if optimizer is not None:
        target = ckpt / OPTIMIZER
        if not target.is_dir():
            raise CheckpointError(f"{target}: optimizer state not found")
        # Orbax needs the target structure (an abstract pytree) to rebuild optax's state
        # objects; without it, it returns plain dicts that the optimiser cannot take.
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            nnx.state(optimizer))
        try:
            restored = ocp.v1.load(target.absolute(), abstract)
        except Exception as e:  # Orbax raises many types for a damaged folder; name it once
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{target}: cannot restore optimizer state ({first[:200]}); if it was "
                                  f"written by an older version or another optimiser, use --restart") from e
        nnx.update(optimizer, restored)
    return meta


def load_model(path: Path) -> tuple[nnx.Module, ModelConfig, Tokenizer, Path]:
    """Model, its config and tokenizer from a checkpoint folder, `latest`/`best` link or run dir."""
    ckpt_dir, model_cfg, train = checkpoint_configs(path)
    tokenizer_name = train.get("tokenizer", TrainConfig.__dataclass_fields__["tokenizer"].default)
    model = build_model(model_cfg)
    load_weights(model, ckpt_dir / WEIGHTS)
    return model, model_cfg, get_tokenizer(tokenizer_name), ckpt_dir


# ----------------------------------------------------------------------------- helpers


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _agreed_time(now: dt.datetime | None) -> dt.datetime:
    """One timestamp for all processes (they name the same folder): process 0's."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if jax.process_count() == 1:
        return now
    stamp = multihost_utils.broadcast_one_to_all(np.int64(now.timestamp()))
    return dt.datetime.fromtimestamp(int(stamp), dt.timezone.utc)


