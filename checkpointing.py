"""Checkpoints: safetensors weights + Orbax optimiser state + meta.json, written atomically.

Layout of a run's checkpoints (this is the only module that imports Orbax):

    runs/<name>/checkpoints/
        20261129T101500Z-step-100/      one complete checkpoint
            model.safetensors           parameters, dotted keys (blocks.0.attn.qkv.kernel)
            optimizer/                  Orbax pytree of nnx.state(optimizer)
            model.json, train.json      the resolved configs it was trained with
            meta.json                   step, losses, lr, grad norm, data position, RNG ... (written last)
        latest -> 2026...-step-100      relative symlinks, swapped atomically
        best   -> 2026...-step-80
        history/<checkpoint>.json       meta.json of pruned checkpoints, so charts keep the whole run

A checkpoint is assembled in `.tmp-<name>/` and renamed into place; `latest` is replaced by
rename too. A kill at any instant therefore leaves the previous checkpoint complete and
`latest` pointing at a complete checkpoint. Names starting with "." are never checkpoints.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
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

from model import stack_layer_weights, unstack_layer_weights

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer"
META = "meta.json"
_NAME = re.compile(r"^\d{8}T\d{6}Z-step-(\d+)$")


class CheckpointError(ValueError):
    """A missing, corrupt or mismatched checkpoint; one line naming the path."""


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


# ----------------------------------------------------------------------------- finding checkpoints


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_of(ckpt: Path) -> int:
    m = _NAME.match(Path(ckpt).name)
    if not m:
        raise CheckpointError(f"{ckpt}: not a checkpoint folder name (<UTC time>-step-<N>)")
    return int(m.group(1))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest step first (temp and pruned folders excluded)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if _NAME.match(p.name) and not p.is_symlink() and (p / META).is_file()]
    return sorted(found, key=lambda p: (step_of(p), p.name))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """What `latest` points at; if the link is missing, the highest-step complete checkpoint."""
    link = checkpoints_dir(run_dir) / "latest"
    if link.is_symlink() and (link.resolve() / META).is_file():
        return link.resolve()
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def resolve_checkpoint(path: Path) -> Path:
    """Accept a checkpoint folder, a `latest`/`best` link, or a run directory (-> its latest)."""
    path = Path(path)
    if (path / META).is_file():
        return path.resolve()
    if (path / "model.json").is_file() or checkpoints_dir(path).is_dir():
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise CheckpointError(f"{path}: run directory has no checkpoint yet (train it first)")
        return ckpt
    raise CheckpointError(f"{path}: neither a checkpoint (no {META}) nor a run directory")


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found (incomplete checkpoint?)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: corrupt meta.json (not UTF-8 text)") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None
    if (not isinstance(meta, dict) or not isinstance(meta.get("step"), int)
            or isinstance(meta["step"], bool) or meta["step"] < 0):
        raise CheckpointError(f"{path}: corrupt meta.json (no non-negative integer 'step')")
    return meta


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
        _remove_leftovers(root)
        tmp.mkdir()
    _sync("checkpoint-start")
    weights = weights_to_numpy(model)
    ocp.v1.save((tmp / OPTIMIZER).absolute(), nnx.state(optimizer))  # Orbax wants absolute paths
    if main:
        save_file(weights, str(tmp / WEIGHTS))
        for filename, cfg in configs.items():
            _write_json(tmp / filename, cfg)
        _write_json(tmp / META, meta)  # last: its presence marks the folder complete
        _fsync_tree(tmp)
        if final.exists():  # same step saved twice within one second: keep the newer one
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        _point(root, "latest", name)
        if meta.get("is_best"):
            _point(root, "best", name)
        prune(run_dir, keep_last)
    _sync("checkpoint-done")
    return final


def prune(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints and the best one; keep their meta.json."""
    root = checkpoints_dir(run_dir)
    found = list_checkpoints(run_dir)
    keep = set(found[-keep_last:])
    for link in ("best", "latest"):
        if (root / link).is_symlink():
            keep.add((root / link).resolve())
    history = root / "history"
    removed = []
    for ckpt in found:
        if ckpt.resolve() in {k.resolve() for k in keep}:
            continue
        history.mkdir(exist_ok=True)
        shutil.copyfile(ckpt / META, history / f"{ckpt.name}.json")
        doomed = root / f".pruned-{ckpt.name}"
        os.rename(ckpt, doomed)  # atomic: never a half-deleted folder under a checkpoint name
        shutil.rmtree(doomed)
        removed.append(ckpt)
    return removed


def move_aside(run_dir: Path) -> Path | None:
    """Start a run over: rename checkpoints/ to checkpoints.old-<UTC time>/, deleting nothing."""
    root = checkpoints_dir(run_dir)
    if not root.exists():
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target, n = root.with_name(f"{CHECKPOINTS}.old-{stamp}"), 1
    while target.exists():  # two restarts within one second
        target, n = root.with_name(f"{CHECKPOINTS}.old-{stamp}-{n}"), n + 1
    os.rename(root, target)
    return target


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


def read_configs(ckpt: Path) -> dict[str, dict[str, Any]]:
    """The resolved model.json / train.json saved inside a checkpoint."""
    out = {}
    for filename in ("model.json", "train.json"):
        path = Path(ckpt) / filename
        if path.is_file():
            out[filename] = json.loads(path.read_text())
    return out


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


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _point(root: Path, link_name: str, target: str) -> None:
    """Swap a relative symlink atomically (symlink under a temp name, then rename over)."""
    tmp = root / f".{link_name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, root / link_name)
    _fsync_dir(root)


def _remove_leftovers(root: Path) -> None:
    # A kill mid-save or mid-prune leaves dot-folders behind; they never hold a checkpoint
    # that `latest` could point at, so they are safe to remove.
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".pruned-")) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
