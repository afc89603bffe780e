"""Where a run's checkpoints live and what they say, without JAX: run set-up reads them first.

Layout of a run's checkpoints (written by jaxgpt/checkpoints/store.py, the only module that imports Orbax):

    runs/<name>/checkpoints/
        20261129T101500Z-step-100/      one complete checkpoint
            model.safetensors           parameters, dotted keys (blocks.0.attn.qkv.kernel)
            optimizer/                  Orbax pytree of nnx.state(optimizer)
            model.json, train.json      the resolved configs it was trained with
            tokenizer.json              a trained tokenizer's file (train.json "tokenizer" names one)
            meta.json                   step, losses, lr, grad norm, data position, RNG ... (written last)
        latest -> 2026...-step-100      relative symlinks, swapped atomically
        best   -> 2026...-step-80

A checkpoint is assembled in `.tmp-<name>/` and renamed into place; `latest` is replaced by
rename too. A kill at any instant therefore leaves the previous checkpoint complete and
`latest` pointing at a complete checkpoint. Names starting with "." are never checkpoints.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from jaxgpt.config import MODEL_FILE, TRAIN_FILE, ModelConfig, TrainConfig, from_dict, from_json
from jaxgpt.data.tokenizer import TOKENIZER_FILE, Tokenizer, get_tokenizer
from jaxgpt.files import fsync, sha256  # noqa: F401 (store.py uses them from here)

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer"
META = "meta.json"
# A run's record (metrics.jsonl) and its TensorBoard events (jaxgpt/tracking/metrics.py) describe the
# checkpoints' history, so --restart moves them aside together with the checkpoints.
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
# train.json "wandb": the W&B run id a resumed run logs into again (jaxgpt/tracking/wandb_log.py); moved
# aside with the record, so a --restart starts a new W&B run.
WANDB_FILE = "wandb.json"
_NAME = re.compile(r"^\d{8}T\d{6}Z-step-(\d+)$")


class CheckpointError(ValueError):
    """A missing, corrupt or mismatched checkpoint; one line naming the path."""


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
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:  # gone since is_dir: a starting trainer's write probe removes the folder it made
        return []
    found = [p for p in entries if _NAME.match(p.name) and not p.is_symlink() and (p / META).is_file()]
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


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file, or CheckpointError in one line naming it (missing, malformed, unreadable)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found (incomplete checkpoint?)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: corrupt {Path(path).name} (not UTF-8 text)") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / META
    meta = read_json(path)
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get("step"), int)
        or isinstance(meta["step"], bool)
        or meta["step"] < 0
    ):
        raise CheckpointError(f"{path}: corrupt meta.json (no non-negative integer 'step')")
    return meta


def read_configs(ckpt: Path) -> dict[str, dict[str, Any]]:
    """The resolved model.json / train.json saved inside a checkpoint."""
    out = {}
    for filename in ("model.json", "train.json"):
        path = Path(ckpt) / filename
        if path.is_file():
            out[filename] = read_json(path)
            if not isinstance(out[filename], dict):
                raise CheckpointError(f"{path}: expected a JSON object, got {type(out[filename]).__name__}")
    return out


def resolve_weights(path: Path) -> Path:
    """The checkpoint folder behind `path`: a checkpoint, a latest/best link, a run dir's latest
    checkpoint, or, for a run that has none yet, the weights its train.json `init_from` names
    (an imported GPT-2, see import_gpt2.py)."""
    path = Path(path)
    try:
        return resolve_checkpoint(path)
    except CheckpointError:
        if not (path / MODEL_FILE).is_file() or not (path / TRAIN_FILE).is_file():
            raise
        init_from = from_json(TrainConfig, path / TRAIN_FILE).init_from
        if init_from is None:
            raise
        return resolve_checkpoint(path / init_from)


def train_config(train: dict[str, Any], where: str) -> TrainConfig:
    """A checkpoint's train.json (a checkpoint without one: the defaults, builtin corpus and bytes)."""
    if not train:
        return TrainConfig(microbatch_size=8, train_steps=1)
    return from_dict(TrainConfig, train, where)


def checkpoint_run(path: Path, data_root: Path | None = None) -> tuple[Path, ModelConfig, TrainConfig, Tokenizer]:
    """What a command needs of a checkpoint before JAX starts: its folder, model config, train.json and
    tokenizer (checkpoint_configs, then each checked; one-line errors)."""
    ckpt_dir, model_cfg, train = checkpoint_configs(path)
    cfg = train_config(train, str(ckpt_dir / TRAIN_FILE))
    return ckpt_dir, model_cfg, cfg, checkpoint_tokenizer(ckpt_dir, cfg.tokenizer, data_root)


def checkpoint_configs(path: Path) -> tuple[Path, ModelConfig, dict[str, Any]]:
    """(checkpoint folder, model config, train.json as a dict) for a checkpoint or run dir.

    The architecture comes from the run's model.json (the checkpoint's own copy when the folder
    was moved out of its run); train.json from the run directory when `path` is one, else the
    copy saved with the checkpoint.
    """
    path = Path(path)
    ckpt_dir = resolve_weights(path)
    saved = read_configs(ckpt_dir)
    run_model_json = ckpt_dir.parent.parent / MODEL_FILE
    if run_model_json.is_file():
        model_cfg = from_json(ModelConfig, run_model_json)
    elif "model.json" in saved:
        model_cfg = from_dict(ModelConfig, saved["model.json"], str(ckpt_dir / MODEL_FILE))
    else:
        raise CheckpointError(f"{ckpt_dir}: no model.json beside the checkpoint or in its run")
    if not (path / META).is_file() and (path / TRAIN_FILE).is_file() and (path / MODEL_FILE).is_file():
        train = read_json(path / TRAIN_FILE)
        from_dict(TrainConfig, train, str(path / TRAIN_FILE))  # validate: one-line errors
    else:
        train = saved.get("train.json", {})
    return ckpt_dir, model_cfg, train


def checkpoint_tokenizer(ckpt_dir: Path, name: str, data_root: Path | None = None) -> Tokenizer:
    """The tokenizer a checkpoint was trained with: a trained one from the copy saved in the
    checkpoint (so a checkpoint moved away from its data root still decodes), else by name."""
    saved = Path(ckpt_dir) / TOKENIZER_FILE
    return get_tokenizer(name, data_root, file=saved if saved.is_file() else None)


# ----------------------------------------------------------------------------- moving and pruning


def prune(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints and the best one (the run's record,
    metrics.jsonl, keeps every step of the pruned ones)."""
    root = checkpoints_dir(run_dir)
    found = list_checkpoints(run_dir)
    keep = set(found[-keep_last:])
    lowest = lowest_val_loss(found)
    if lowest is not None:  # whatever `best` says: a stale link must not cost the real best
        keep.add(lowest)
    for link in ("best", "latest"):
        if (root / link).is_symlink():
            keep.add((root / link).resolve())
    removed = []
    for ckpt in found:
        if ckpt.resolve() in {k.resolve() for k in keep}:
            continue
        doomed = root / f".pruned-{ckpt.name}"
        os.rename(ckpt, doomed)  # atomic: never a half-deleted folder under a checkpoint name
        shutil.rmtree(doomed)
        removed.append(ckpt)
    return removed


def archive_checkpoints(run_dir: Path) -> Path | None:
    """Start a run over: rename checkpoints/ to checkpoints.old-<UTC time>/ and move the run's
    metrics.jsonl, tensorboard/ and wandb.json into it, deleting nothing."""
    root = checkpoints_dir(run_dir)
    records = [
        Path(run_dir) / name for name in (METRICS_FILE, TENSORBOARD_DIR, WANDB_FILE) if (Path(run_dir) / name).exists()
    ]
    if not root.exists() and not records:
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target, n = root.with_name(f"{CHECKPOINTS}.old-{stamp}"), 1
    while target.exists():  # two restarts within one second
        target, n = root.with_name(f"{CHECKPOINTS}.old-{stamp}-{n}"), n + 1
    if root.exists():
        os.rename(root, target)
    else:  # killed before its first checkpoint: only records to keep
        target.mkdir()
    for path in records:
        os.rename(path, target / path.name)
    return target


# ----------------------------------------------------------------------------- integrity


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256"}} of every file under a checkpoint folder being written:
    meta.json keeps them, so a resume can tell a damaged checkpoint from a good one."""
    folder = Path(folder)
    records = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        records[str(path.relative_to(folder))] = {"size": path.stat().st_size, "sha256": sha256(path)}
    return records


# Hashed on every resume (the weights, and the small files); the optimiser state, three times the
# weights' size, is checked by size only.
_HASHED_ON_RESUME = (WEIGHTS, MODEL_FILE, TRAIN_FILE)


def verify_checkpoint(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (a missing, resized or changed file), or None.

    Checkpoints written before meta.json recorded its files are checked for the weights file
    and the optimizer folder only.
    """
    ckpt = Path(ckpt)
    try:
        meta = read_meta(ckpt)
    except CheckpointError as e:
        return str(e)
    records = meta.get("files")
    if not isinstance(records, dict):
        for name in (WEIGHTS, OPTIMIZER):
            if not (ckpt / name).exists():
                return f"{ckpt / name} is missing"
        return None
    if not (ckpt / OPTIMIZER).is_dir():
        return f"{ckpt / OPTIMIZER} is missing"
    for rel, record in records.items():
        path = ckpt / rel
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != record.get("size"):
            return f"{path} has {path.stat().st_size} bytes, {record.get('size')} when saved"
        if rel in _HASHED_ON_RESUME and sha256(path) != record.get("sha256"):
            return f"{path} changed since it was saved (sha256 differs)"
    return None


def quarantine(ckpt: Path) -> Path:
    """Rename a damaged checkpoint out of the way (never delete it): checkpoints/corrupt-<name>."""
    ckpt = Path(ckpt)
    target, n = ckpt.with_name(f"corrupt-{ckpt.name}"), 1
    while target.exists():
        target, n = ckpt.with_name(f"corrupt-{ckpt.name}-{n}"), n + 1
    os.rename(ckpt, target)
    return target


def lowest_val_loss(checkpoints: list[Path]) -> Path | None:
    """The checkpoint with the lowest validation loss in its meta.json (the earliest on a tie); the
    figure is meta["best_key"] where a run names another (an RL run's held-out error)."""
    scored = []
    for c in checkpoints:
        try:
            meta = read_meta(c)
        except CheckpointError:
            continue
        val = meta.get(meta.get("best_key", "val_loss"))
        if isinstance(val, (int, float)) and math.isfinite(val):
            scored.append((val, step_of(c), c))
    return min(scored)[2] if scored else None


def repair_best(run_dir: Path) -> str | None:
    """Point `best` at the kept checkpoint with the lowest validation loss; a line saying what
    changed, or None. (A kill between the `latest` and `best` swaps leaves `best` behind.)"""
    root = checkpoints_dir(run_dir)
    lowest = lowest_val_loss(list_checkpoints(run_dir))
    if lowest is None:
        return None
    link = root / "best"
    current = link.resolve() if link.is_symlink() else None
    if current == lowest.resolve():
        return None
    point(root, "best", lowest.name)
    was = current.name if current is not None else "nothing"
    return f"{link} pointed at {was}; now at {lowest.name}, the lowest validation loss kept"


# ----------------------------------------------------------------------------- helpers


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def point(root: Path, link_name: str, target: str) -> None:
    """Swap a relative symlink atomically (symlink under a temp name, then rename over)."""
    tmp = root / f".{link_name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, root / link_name)
    fsync(root)


def remove_leftovers(root: Path) -> None:
    # A kill mid-save or mid-prune leaves dot-folders behind; they never hold a checkpoint
    # that `latest` could point at, so they are safe to remove.
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".pruned-")) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)


def fsync_tree(path: Path) -> None:
    """Every file and folder under path, so a checkpoint is on disk before `latest` points at it."""
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            fsync(Path(dirpath) / f)
        fsync(Path(dirpath))
