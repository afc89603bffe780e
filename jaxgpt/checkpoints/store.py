"""Checkpoints: safetensors weights + Orbax optimiser state + meta.json, written atomically.

This is the only module that imports Orbax. The layout, and everything that reads a checkpoint
without JAX (finding, resolving, meta.json, archiving, pruning), is layout.py; its names are
re-exported here, so `store` is the one module a caller with JAX needs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import SafetensorError
from safetensors.numpy import load_file

from jaxgpt.checkpoints.layout import (  # noqa: F401 - re-exported: the JAX-free half of this module's interface
    CHECKPOINTS,
    META,
    OPTIMIZER,
    WEIGHTS,
    CheckpointError,
    archive_checkpoints,
    checkpoint_configs,
    checkpoint_tokenizer,
    checkpoints_dir,
    file_records,
    fsync,
    fsync_tree,
    latest_checkpoint,
    list_checkpoints,
    lowest_val_loss,
    point,
    prune,
    quarantine,
    read_configs,
    read_meta,
    remove_leftovers,
    repair_best,
    resolve_checkpoint,
    resolve_weights,
    step_of,
    verify_checkpoint,
    write_json,
)
from jaxgpt.config import ModelConfig, default_tokenizer
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.files import write_tensors
from jaxgpt.model.gpt import build_model, stack_layer_weights, unstack_layer_weights

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
    """x as a host array of its own, in row-major order: a device's host copy may be laid out its
    own way, which a writer of raw bytes (safetensors) would scramble, or be a view of memory the
    runtime reuses, which the Orbax save that follows would overwrite."""
    if getattr(x, "is_fully_addressable", True):
        return np.array(jax.device_get(x), order="C", copy=True)
    return np.array(multihost_utils.process_allgather(x, tiled=True), order="C", copy=True)


def save_weights(model: nnx.Module, path: Path) -> None:
    write_tensors(weights_to_numpy(model), path)


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
            f"{where}: weights do not match model.json (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
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


def save_checkpoint(
    run_dir: Path,
    model: nnx.Module,
    optimizer: nnx.Optimizer,
    meta: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    *,
    keep_last: int,
    now: dt.datetime | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """Write one checkpoint atomically, move `latest` (and `best` if meta["is_best"]), prune.

    meta.json records every file's size and sha256 (`files`), so a damaged checkpoint is found on
    resume. Raises on any failure: a run must stop loudly rather than train on without
    checkpoints; a file system error (no space, read-only) is a one-line CheckpointError, with
    the half-written folder removed and the previous checkpoint and `latest` untouched. `files`:
    other files to write into the checkpoint by name (a trained tokenizer's tokenizer.json).
    """
    root = checkpoints_dir(run_dir)
    name = f"{_agreed_time(now).strftime('%Y%m%dT%H%M%SZ')}-step-{meta['step']}"
    final, tmp = root / name, root / f".tmp-{name}"
    # Every process takes part in the Orbax save and the weight gather; process 0 alone
    # writes the other files and moves the pointers.
    main = jax.process_index() == 0
    try:
        if main:
            root.mkdir(parents=True, exist_ok=True)
            remove_leftovers(root)
            tmp.mkdir()
        _sync("checkpoint-start")
        weights = weights_to_numpy(model)
        with _orbax_errors_held():
            ocp.v1.save((tmp / OPTIMIZER).absolute(), nnx.state(optimizer))  # Orbax wants absolute paths
        if main:
            _write_files(tmp, weights, configs, meta, files or {})
            if final.exists():  # same step saved twice within one second: keep the newer one
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync(root)
    except Exception as e:
        os_error = _os_error(e)
        if os_error is None:
            raise
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(root, meta["step"], os_error)) from None
    if main:
        point(root, "latest", name)
        if meta.get("is_best"):
            point(root, "best", name)
        prune(run_dir, keep_last)
    _sync("checkpoint-done")
    return final


def _write_files(
    tmp: Path,
    weights: dict[str, np.ndarray],
    configs: dict[str, dict[str, Any]],
    meta: dict[str, Any],
    files: dict[str, bytes],
) -> None:
    write_tensors(weights, tmp / WEIGHTS)
    for filename, cfg in configs.items():
        write_json(tmp / filename, cfg)
    for filename, data in files.items():  # byte for byte: its sha256 is the one datasets record
        (tmp / filename).write_bytes(data)
    write_json(tmp / META, meta | {"files": file_records(tmp)})  # last: its presence marks the folder complete
    fsync_tree(tmp)


@contextlib.contextmanager
def _orbax_errors_held() -> Iterator[None]:
    """Hold back the error records Orbax's threads log (with a traceback each) while it saves:
    if the save then raises, the one-line CheckpointError says it all (and the run ends); if
    not, they are logged."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            held.append(record)
            return False
        return True

    logger = logging.getLogger("absl")
    logger.addFilter(hold)
    yield  # a failed save raises here and leaves the filter on: Orbax's threads may go on logging
    # errors of that save while the process ends, after the one line that says it all
    logger.removeFilter(hold)
    for record in held:  # reached only when the save succeeded
        logger.handle(record)


def _os_error(e: Exception) -> OSError | None:
    """The file system error behind a failed save: an OSError, or one that Orbax (tensorstore:
    "[os_error_code='28']") or safetensors ("(os error 28)") reports inside its own exception."""
    if isinstance(e, OSError):
        return e
    found = re.search(r"os_error_code='(\d+)'|os error (\d+)", str(e))
    if found is None:
        return None
    code = int(found.group(1) or found.group(2))
    path = re.search(r'"(/[^"]+)"', str(e))
    return OSError(code, os.strerror(code), path.group(1) if path else None)


def _write_failure(root: Path, step: int, e: OSError) -> str:
    latest = latest_checkpoint(root.parent)
    kept = f"checkpoints/latest is still {latest.name}" if latest is not None else "no checkpoint was written yet"
    what = {
        errno.ENOSPC: "the disk is full: free space there",
        errno.EDQUOT: "the disk quota is full",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "no permission to write there",
        errno.EFBIG: "a file grew past the size limit (ulimit -f)",
    }.get(e.errno, e.strerror or type(e).__name__)
    return (
        f"{root}: cannot write the step {step} checkpoint ({what}; {e.filename or root}); {kept}: fix that "
        f"and rerun to resume"
    )


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
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), nnx.state(optimizer)
        )
        try:
            restored = ocp.v1.load(target.absolute(), abstract)
        except Exception as e:  # Orbax raises many types for a damaged folder; name it once
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(
                f"{target}: cannot restore optimizer state ({first[:200]}); if it was "
                f"written by an older version or another optimiser, use --restart"
            ) from e
        nnx.update(optimizer, restored)
    return meta


def load_model(path: Path) -> tuple[nnx.Module, ModelConfig, Tokenizer, Path]:
    """Model, its config and tokenizer from a checkpoint folder, `latest`/`best` link or run dir."""
    ckpt_dir, model_cfg, train = checkpoint_configs(path)
    tokenizer_name = train.get("tokenizer", default_tokenizer(train.get("dataset", {}).get("source", "builtin")))
    tokenizer = checkpoint_tokenizer(ckpt_dir, tokenizer_name)  # before the weights: a missing one fails fast
    model = build_model(model_cfg)
    load_weights(model, ckpt_dir / WEIGHTS)
    return model, model_cfg, tokenizer, ckpt_dir


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
