"""Train a run directory.

    uv run train.py runs/a-to-a             # train, or resume from runs/a-to-a/checkpoints/latest
    uv run train.py runs/a-to-a --restart   # start over; old checkpoints are moved aside, not deleted

`runs/<name>/model.json` and `runs/<name>/train.json` describe the run completely (see README).
The first Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint and exits; a second
one aborts at once. Rerunning resumes from the latest checkpoint with the same step, learning
rate, next batch and dropout keys as if never interrupted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import checkpointing as ckpt
import fast_malloc
import sharding
from config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from data import BatchSampler, Dataset, DataError, open_dataset
from download_dataset import default_data_root, prepare_dataset
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


# ----------------------------------------------------------------------------- set-up


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


def train(run: Run) -> int:
    # JAX and the model stack are imported only now, so that every input error above is
    # reported before JAX starts up, let alone compiles.
    from trainer import Trainer

    return Trainer(run).fit()


# ----------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    parser.add_argument("--restart", action="store_true",
                        help="start over: move checkpoints/ aside to checkpoints.old-<time>/")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where datasets live (default: $JAXGPT_DATA_DIR or ./data)")
    group = parser.add_argument_group("several processes (jax.distributed); see README")
    group.add_argument("--coordinator", default=None,
                       help="host:port of process 0 (or $JAX_COORDINATOR_ADDRESS)")
    group.add_argument("--num-processes", type=int, default=None, help="(or $JAX_NUM_PROCESSES)")
    group.add_argument("--process-id", type=int, default=None, help="(or $JAX_PROCESS_ID)")
    group.add_argument("--distributed-auto", action="store_true",
                       help="let JAX detect the cluster (SLURM, Open MPI, TPU pods, ...)")
    args = parser.parse_args(argv)
    try:
        sharding.maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                              auto=args.distributed_auto)
        # Process 0 alone prepares the dataset and moves old checkpoints aside; the others
        # then find both ready.
        with sharding.main_process_first():
            run = prepare_run(args.run_dir, data_root=args.data_dir or default_data_root(),
                              restart=args.restart and sharding.is_main_process())
        return train(run)  # may still raise CheckpointError while loading, before compiling
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    fast_malloc.reexec()  # restarts once with huge-page malloc where that helps (fast_malloc.py)
    raise SystemExit(main())
