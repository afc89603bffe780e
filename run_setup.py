"""Run set-up: load and cross-check a run directory's configs, dataset and checkpoints, without JAX.

train.py calls `prepare_run` before anything imports JAX, so a malformed config, a missing or
mismatched dataset, a corrupt checkpoint or a resume that would change the data order is one
line on stderr within a second, never after a backend start-up or a compile. This module, and
everything it imports (config, data, download_dataset, tokenizer, checkpoint_files), must stay
free of JAX, Flax and Orbax: tests/test_run_setup.py checks that in a fresh interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import checkpoint_files as ckpt
from config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from data import BatchSampler, Dataset, DataError, open_dataset
from download_dataset import prepare_dataset
from tokenizer import TokenizerError

INPUT_ERRORS = (ConfigError, DataError, TokenizerError, ckpt.CheckpointError)


@dataclass
class Run:
    """Everything validated before any compile: configs, dataset, samplers, resume point."""

    run_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    dataset: Dataset
    train_batches: BatchSampler
    val_batches: BatchSampler
    total_steps: int
    resume_from: Path | None
    init_from: Path | None = None  # weights to fine-tune from (train.json init_from), when not resuming


def prepare_run(run_dir: Path, *, data_root: Path, restart: bool) -> Run:
    """Load and cross-check configs, dataset and checkpoint. Raises INPUT_ERRORS, one line each."""
    model_cfg, train_cfg = load_run_configs(run_dir)
    ds_path = prepare_dataset(train_cfg.dataset.source, train_cfg.tokenizer, data_root,
                              options=train_cfg.dataset.options,  # the length decides how many FineWeb files
                              train_tokens=train_cfg.total_steps(model_cfg) * train_cfg.tokens_per_step(model_cfg))
    dataset = open_dataset(ds_path)
    _check_dataset(run_dir, model_cfg, train_cfg, dataset)
    seq_len = train_cfg.seq_len(model_cfg)
    common = dict(microbatch_size=train_cfg.microbatch_size, seq_len=seq_len,
                  seed=train_cfg.seed, targets=train_cfg.targets)
    train_batches = BatchSampler(dataset.train, shuffle=True, **common)
    val_batches = BatchSampler(dataset.val, shuffle=False, **common)
    if train_batches.n_windows < train_cfg.sequences_per_step:
        raise DataError(
            f"{ds_path}: train split has {train_batches.n_windows} sequences of {seq_len} tokens, "
            f"fewer than one optimiser step needs ({train_cfg.sequences_per_step})")
    if restart:
        moved = ckpt.move_aside(run_dir)
        if moved:
            print(f"Moved old checkpoints aside to {moved}")
    resume_from = ckpt.latest_checkpoint(run_dir)
    if resume_from is not None:
        meta = ckpt.read_meta(resume_from)  # a corrupt checkpoint is reported now, not after JAX starts
        _check_resume(resume_from, model_cfg, train_cfg)
        saved = meta.get("data_position", {}).get("fingerprint")
        if saved is not None and saved != dataset.manifest.get("fingerprint"):
            raise DataError(f"{dataset.path}/manifest.json: dataset differs from the one checkpoint "
                            f"{resume_from.name} was trained on (fingerprint {saved!r}), so the batches "
                            f"would not continue where they stopped; use --restart, or restore that dataset")
    init_from = _init_checkpoint(run_dir, model_cfg, train_cfg) if resume_from is None else None
    return Run(run_dir, model_cfg, train_cfg, dataset, train_batches, val_batches,
               train_cfg.total_steps(model_cfg), resume_from, init_from)


# Keys that decide the parameters' shapes: init_from weights must agree on all of them.
_SHAPE_KEYS = ("architecture", "vocab_size", "context_length", "emb_dim", "n_heads", "n_layers",
               "qkv_bias", "tie_embeddings")


def _init_checkpoint(run_dir: Path, model: ModelConfig, train: TrainConfig) -> Path | None:
    """The checkpoint folder train.json `init_from` names (relative to the run directory), checked
    against model.json now, before JAX starts."""
    if train.init_from is None:
        return None
    try:
        found = ckpt.resolve_checkpoint(Path(run_dir) / train.init_from)
    except ckpt.CheckpointError as e:
        raise ConfigError(f"{run_dir}/train.json: init_from={train.init_from!r}: {e}") from None
    saved = ckpt.read_configs(found).get("model.json")
    if saved is not None:
        for key in _SHAPE_KEYS:
            if saved.get(key) != getattr(model, key):
                raise ConfigError(f"{run_dir}/model.json: {key}={getattr(model, key)!r} differs from the "
                                  f"init_from weights {found} ({key}={saved.get(key)!r})")
    return found


def _check_dataset(run_dir: Path, model: ModelConfig, train: TrainConfig, ds: Dataset) -> None:
    manifest = ds.path / "manifest.json"
    if ds.tokenizer != train.tokenizer:
        raise DataError(f"{manifest}: dataset tokenizer {ds.tokenizer!r} does not match "
                        f"{run_dir}/train.json tokenizer={train.tokenizer!r}")
    if model.vocab_size < ds.vocab_size:
        raise ConfigError(f"{run_dir}/model.json: vocab_size={model.vocab_size} is smaller than the "
                          f"{ds.tokenizer} tokenizer's {ds.vocab_size} ids ({manifest})")
    if ds.max_token_id >= model.vocab_size:
        raise DataError(f"{manifest}: token id {ds.max_token_id} is out of range for "
                        f"{run_dir}/model.json vocab_size={model.vocab_size}")


# Changing these mid-run would silently change which batches come next or what the weights mean.
_DATA_ORDER_KEYS = ("dataset", "tokenizer", "targets", "sequence_length", "microbatch_size",
                    "gradient_accumulation_steps", "seed")

# How the model runs, not what it is (model.json's speed options): free to change on resume.
# scan_layers is not among them: it changes the optimiser state's layout.
_RUNTIME_KEYS = ("compute_dtype", "attention", "remat", "loss_chunk")


def _check_resume(ckpt_dir: Path, model: ModelConfig, train: TrainConfig) -> None:
    saved = ckpt.read_configs(ckpt_dir)
    old_model, old_train = saved.get("model.json"), saved.get("train.json")
    if old_model is not None:
        # Through today's loader, so keys added since the checkpoint was written take their defaults.
        old_model = to_dict(from_dict(ModelConfig, old_model, f"{ckpt_dir}/model.json"))
        diff = {k: (old_model[k], v) for k, v in to_dict(model).items() if old_model[k] != v}
        fixed = {k: d for k, d in diff.items() if k not in _RUNTIME_KEYS}
        if fixed:
            key, (was, now) = next(iter(fixed.items()))
            raise ConfigError(f"model.json: {key}={now!r} differs from checkpoint {ckpt_dir.name} "
                              f"({key}={was!r}); use --restart to train a new model")
        if diff:
            print(f"Note: model.json's {', '.join(f'{k}={v[1]!r}' for k, v in diff.items())} "
                  f"differ from {ckpt_dir.name}; same weights, run differently")
    if old_train is not None:
        for key in _DATA_ORDER_KEYS:
            if old_train.get(key) != to_dict(train)[key]:
                raise ConfigError(f"train.json: {key}={to_dict(train)[key]!r} differs from checkpoint "
                                  f"{ckpt_dir.name} ({key}={old_train.get(key)!r}), which would change "
                                  f"the data order on resume; use --restart")
        changed = [k for k, v in to_dict(train).items() if old_train.get(k) != v]
        if changed:
            print(f"Note: train.json changed since {ckpt_dir.name}: {', '.join(changed)}")
