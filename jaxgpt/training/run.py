"""Run set-up: load and cross-check a run directory's configs, dataset and checkpoints, without JAX.

train.py calls `prepare_run` before anything imports JAX, so a malformed config, a missing or
mismatched dataset, a corrupt checkpoint or a resume that would change the data order is one
line on stderr within a second, never after a backend start-up or a compile. This module, and
everything it imports (config, data, download_dataset, tokenizer, checkpoint_files), must stay
free of JAX, Flax and Orbax: tests/training/test_run_setup.py checks that in a fresh interpreter.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxgpt.checkpoints import layout as ckpt
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from jaxgpt.conversations.rows import ConversationRows
from jaxgpt.conversations.template import TEMPLATE_FILE
from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.batch import Sampler
from jaxgpt.data.samplers.documents import DocumentSampler
from jaxgpt.data.samplers.windows import BatchSampler, WholeSplit
from jaxgpt.data.storage.shards import Dataset, open_dataset
from jaxgpt.data.tokenizer import TOKENIZER_FILE, TOKENIZER_NAMES, TokenizerError, TrainedTokenizer, get_tokenizer
from jaxgpt.evaluation.core import PreparedTask, prepare
from jaxgpt.evaluation.core_bundle import fetch_bundle, read_tasks
from jaxgpt.evaluation.hellaswag import Example, fetch_val, read_examples
from jaxgpt.preparation.prepare import prepare_dataset, resolve_options
from jaxgpt.tracking import wandb_log

INPUT_ERRORS = (ConfigError, DataError, TokenizerError, ckpt.CheckpointError)


class TrainingError(RuntimeError):
    """Training cannot go on (it diverged): one line, the last good checkpoint kept."""


@dataclass
class Run:
    """Everything validated before any compile: configs, dataset, samplers, resume point."""

    run_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    dataset: Dataset
    train_batches: Sampler  # BatchSampler; DocumentSampler for packing "documents"; ConversationRows
    val_batches: Sampler  # ... and WholeSplit for validation_batches "all"
    total_steps: int
    resume_from: Path | None
    init_from: Path | None = None  # weights to fine-tune from (train.json init_from), when not resuming
    hellaswag: list[Example] | None = None  # train.json hellaswag_interval: the examples to score
    core: list[PreparedTask] | None = None  # train.json core_interval: every task's rows, tokenized once
    # A trained tokenizer (train.json "tokenizer" names one): each checkpoint keeps a copy of its file.
    tokenizer: TrainedTokenizer | None = None

    @property
    def checkpoint_files(self) -> dict[str, bytes]:
        """What travels with every checkpoint besides its weights: a trained tokenizer's file, a conversation
        dataset's chat template."""
        files = {} if self.tokenizer is None else {TOKENIZER_FILE: self.tokenizer.data}
        template = self.dataset.manifest.get("template")
        if template is not None:
            files[TEMPLATE_FILE] = (json.dumps(template, indent=2) + "\n").encode()
        return files


def prepare_run(run_dir: Path, *, data_root: Path, restart: bool, lock: bool = True, processes: int = 1) -> Run:
    """Load and cross-check configs, dataset and checkpoint. Raises INPUT_ERRORS, one line each.

    lock: take the run directory's lock (multi-process: process 0 only). processes: how many take
    part (several: no HellaSwag or CORE during training). Checked: the checkpoint folder is writable
    with room for one checkpoint, the validation ids fit the model, the checkpoint to resume from
    verifies (a damaged `latest` is set aside and the one before it used).
    """
    model_cfg, train_cfg = load_run_configs(run_dir)
    wandb_log.check(run_dir, train_cfg.wandb)  # the optional package, before anything is built
    if processes > 1 and (train_cfg.hellaswag_interval is not None or train_cfg.core_interval is not None):
        raise ConfigError(
            f"{run_dir}/train.json: hellaswag_interval and core_interval work in single-process runs "
            f"only (their batches are one process's arrays); score checkpoints with evaluate.py instead"
        )
    if lock:
        lock_run(run_dir)
    check_writable(run_dir, model_cfg, tidy=lock)
    dataset, tokenizer = _dataset(run_dir, model_cfg, train_cfg, data_root)
    ds_path = dataset.path
    try:
        train_batches, val_batches = _samplers(model_cfg, train_cfg, dataset)
    except DataError as e:  # "train split: dataset too small ...": which run's, which dataset
        raise DataError(f"{run_dir}/train.json: {dataset.path} {e}") from None
    if train_batches.n_windows < train_cfg.sequences_per_step:
        raise DataError(
            f"{ds_path}: train split has {train_batches.n_windows} sequences of {train_cfg.seq_len(model_cfg)} tokens, "
            f"fewer than one optimiser step needs ({train_cfg.sequences_per_step})"
        )
    if restart:
        moved = ckpt.archive_checkpoints(run_dir)
        if moved:
            print(f"Moved old checkpoints aside to {moved}")
    resume_from = resume_point(run_dir)
    if resume_from is not None:
        try:
            _check_resume(resume_from, model_cfg, train_cfg, dataset)
        except ConfigError as e:  # "model.json: ..." or "train.json: ...": which run's
            raise ConfigError(f"{run_dir}/{e}") from None
        _check_tokenizer(resume_from, tokenizer)
    init_from = init_checkpoint(run_dir, model_cfg, train_cfg) if resume_from is None else None
    examples, core = _benchmarks(model_cfg, train_cfg, data_root, tokenizer)
    return Run(
        run_dir,
        model_cfg,
        train_cfg,
        dataset,
        train_batches,
        val_batches,
        train_cfg.total_steps(model_cfg, train_batches.n_windows),
        resume_from,
        init_from,
        examples,
        core,
        tokenizer,
    )


def _dataset(
    run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, data_root: Path
) -> tuple[Dataset, TrainedTokenizer | None]:
    """The run's dataset, prepared if missing and checked against the model; a trained tokenizer
    (train.json names one), which must be the one that prepared it."""
    try:
        resolve_options(train_cfg.dataset.source, train_cfg.dataset.options)
    except DataError as e:  # an unknown source or option: the run's train.json says so
        raise DataError(f"{run_dir}/train.json: dataset: {e}") from None
    ds_path = prepare_dataset(
        train_cfg.dataset.source,
        train_cfg.tokenizer,
        data_root,
        options=train_cfg.dataset.options,  # the length decides how many FineWeb files
        train_tokens=train_cfg.planned_tokens(model_cfg),
    )
    dataset = open_dataset(ds_path)
    _check_dataset(run_dir, model_cfg, train_cfg, dataset)
    if train_cfg.tokenizer in TOKENIZER_NAMES:
        return dataset, None
    tokenizer = get_tokenizer(train_cfg.tokenizer, data_root)
    assert isinstance(tokenizer, TrainedTokenizer), tokenizer
    if dataset.manifest.get("tokenizer_sha256") != tokenizer.sha256:  # every source's preparation records it
        raise DataError(
            f"{ds_path}/manifest.json: not prepared with {tokenizer.path} (tokenizer_sha256 "
            f"{dataset.manifest.get('tokenizer_sha256')!r}); prepare the dataset again"
        )
    return dataset, tokenizer


def _samplers(model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset) -> tuple[Sampler, Sampler]:
    """The training rows and the validation batches train.json asks for (each checks the dataset can give them)."""
    seq_len = train_cfg.seq_len(model_cfg)
    common = dict(microbatch_size=train_cfg.microbatch_size, seq_len=seq_len, seed=train_cfg.seed)
    if train_cfg.packing == "conversations":
        options = dataset.manifest["options"]
        return (
            ConversationRows(dataset.train, too_long=options["too_long"], pack=options["pack"], **common),
            ConversationRows(dataset.val, too_long=options["too_long"], pack=options["pack"], shuffle=False, **common),
        )
    if train_cfg.packing == "documents":
        train_batches = DocumentSampler(dataset.train, eot_id=dataset.eot_id, targets=train_cfg.targets, **common)
    else:
        train_batches = BatchSampler(dataset.train, shuffle=True, targets=train_cfg.targets, **common)
    if train_cfg.validation_batches == "all":
        return train_batches, WholeSplit(
            dataset.val, microbatch_size=train_cfg.microbatch_size, seq_len=seq_len, targets=train_cfg.targets
        )
    return train_batches, BatchSampler(dataset.val, shuffle=False, targets=train_cfg.targets, **common)


def _benchmarks(
    model_cfg: ModelConfig, train_cfg: TrainConfig, data_root: Path, tokenizer: TrainedTokenizer | None
) -> tuple[list[Example] | None, list[PreparedTask] | None]:
    """HellaSwag's examples and CORE's tokenized tasks, when train.json scores them during training:
    downloaded (or a one-line error), read and tokenized before anything compiles."""
    examples = core = None
    if train_cfg.hellaswag_interval is not None:
        examples = read_examples(fetch_val(Path(data_root) / "downloads"), train_cfg.hellaswag_examples)
    if train_cfg.core_interval is not None:
        tasks = read_tasks(fetch_bundle(Path(data_root) / "downloads"), train_cfg.core_examples)
        core = prepare(
            tasks,
            tokenizer or get_tokenizer(train_cfg.tokenizer),
            context_length=model_cfg.context_length,
            vocab_size=model_cfg.vocab_size,
        )
    return examples, core


# ----------------------------------------------------------------------------- the run directory

LOCK_FILE = ".train.lock"
_held: dict[Path, int] = {}  # run directory -> the open lock file this process holds


def lock_run(run_dir: Path) -> None:
    """An exclusive advisory lock on <run_dir>/.train.lock for the rest of this process.

    flock: the kernel releases it when the process ends in any way (kill -9 included), so there
    is never a stale lock to clean up. The file says who holds it, for the refusal's message.
    Taken again by the same process (tests, a second train.main call), it is the same lock.
    """
    key = Path(run_dir).resolve()
    if key in _held:
        return
    path = key / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(
            f"{run_dir}: cannot write there ({e.strerror or e}: {path}); make the run directory "
            f"writable or copy it somewhere that is"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(
            f"{run_dir}: already being trained ({holder}; lock {path}); wait for that run to end or stop it"
        ) from None
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode(), 0)
    _held[key] = fd


def check_writable(run_dir: Path, model: ModelConfig, *, tidy: bool = True) -> None:
    """The checkpoint folder can be created and written, with room for one more checkpoint:
    found now rather than after compiling and training a whole checkpoint interval. tidy (the
    lock holder only): remove what a killed or failed save left behind."""
    root = ckpt.checkpoints_dir(run_dir)
    probe = root / f".write-test-{os.getpid()}"
    existed = root.is_dir()
    try:
        if existed and tidy:  # never a checkpoint, and no other trainer writes here: we hold the lock
            ckpt.remove_leftovers(root)
        root.mkdir(exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            os.fsync(f.fileno())
        probe.unlink()
        free = shutil.disk_usage(root).free
        if not existed:
            root.rmdir()  # leave no trace: --restart would move an empty folder aside
    except OSError as e:
        raise ConfigError(
            f"{root}: cannot write checkpoints there ({e.strerror or e}); make the run "
            f"directory writable or copy it somewhere that is"
        ) from None
    need = checkpoint_bytes(model)
    if free < need:
        raise ConfigError(
            f"{root}: {free / 2**20:,.0f} MiB free, one checkpoint of this model needs about "
            f"{need / 2**20:,.0f} MiB; free some space there first"
        )


def checkpoint_bytes(model: ModelConfig) -> int:
    """About one checkpoint's size: float32 weights, AdamW's two moments and the MultiSteps
    accumulator (4 x 4 bytes per parameter), plus the small files."""
    V, C, L = model.vocab_size, model.emb_dim, model.n_layers
    params = V * C * (1 if model.tie_embeddings else 2)
    if model.architecture == "gpt2":
        params += model.context_length * C + L * (12 * C * C + 13 * C) + 2 * C
    return 16 * params + (1 << 20)


def resume_point(run_dir: Path) -> Path | None:
    """The newest checkpoint that verifies; damaged newer ones are set aside (renamed, never
    deleted), `latest` is moved to it, and `best` repaired, each said in one line."""
    while (found := ckpt.latest_checkpoint(run_dir)) is not None:
        problem = ckpt.verify_checkpoint(found)
        if problem is None:
            break
        moved = ckpt.quarantine(found)
        print(f"warning: checkpoint {found.name} is damaged ({problem}); moved aside to {moved.name}", file=sys.stderr)
    root = ckpt.checkpoints_dir(run_dir)
    if found is not None and (root / "latest").resolve() != found:
        ckpt.point(root, "latest", found.name)
        print(f"Resuming from {found.name}, the newest checkpoint that verifies", file=sys.stderr)
    repaired = ckpt.repair_best(run_dir)
    if repaired:
        print(f"Note: {repaired}", file=sys.stderr)
    return found


# Keys that decide the parameters' shapes: init_from weights must agree on all of them.
_SHAPE_KEYS = (
    "architecture",
    "vocab_size",
    "context_length",
    "emb_dim",
    "n_heads",
    "n_layers",
    "qkv_bias",
    "bias",
    "tie_embeddings",
)


def init_checkpoint(run_dir: Path, model: ModelConfig, train: TrainConfig) -> Path | None:
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
                raise ConfigError(
                    f"{run_dir}/model.json: {key}={getattr(model, key)!r} differs from the "
                    f"init_from weights {found} ({key}={saved.get(key)!r})"
                )
    return found


def _check_dataset(run_dir: Path, model: ModelConfig, train: TrainConfig, ds: Dataset) -> None:
    manifest = ds.path / "manifest.json"
    if ds.tokenizer != train.tokenizer:
        raise DataError(
            f"{manifest}: dataset tokenizer {ds.tokenizer!r} does not match "
            f"{run_dir}/train.json tokenizer={train.tokenizer!r}"
        )
    if model.vocab_size < ds.vocab_size:
        raise ConfigError(
            f"{run_dir}/model.json: vocab_size={model.vocab_size} is smaller than the "
            f"{ds.tokenizer} tokenizer's {ds.vocab_size} ids ({manifest})"
        )
    if ds.max_token_id >= model.vocab_size:
        raise DataError(
            f"{manifest}: token id {ds.max_token_id} is out of range for "
            f"{run_dir}/model.json vocab_size={model.vocab_size}"
        )
    # The manifest vouches for the training shards (each batch is checked against it as it is
    # read); the validation split is small, so its ids are read now rather than found bad at
    # the first validation, an interval into training.
    for shard, path in zip(ds.val.shards, ds.val.files):
        if shard.size and int(shard.max()) >= model.vocab_size:
            at = int(np.argmax(shard >= model.vocab_size))
            raise DataError(
                f"{path}: token id {int(shard[at])} at position {at} is out of range for "
                f"{run_dir}/model.json vocab_size={model.vocab_size}"
            )


# Changing these mid-run would silently change which batches come next or what the weights mean.
_DATA_ORDER_KEYS = (
    "dataset",
    "tokenizer",
    "targets",
    "sequence_length",
    "packing",
    "microbatch_size",
    "gradient_accumulation_steps",
    "seed",
)

# Muon's settings that its optimiser state is laid out by, with the values a checkpoint without them had.
_MUON_STATE_KEYS = {"coefficients": "standard", "normuon": False}

# How the model runs, not what it is (model.json's speed options): free to change on resume.
# scan_layers is not among them: it changes the optimiser state's layout.
RUNTIME_KEYS = ("compute_dtype", "dense_dtype", "attention", "remat", "loss_chunk")


def _check_tokenizer(ckpt_dir: Path, tokenizer: TrainedTokenizer | None) -> None:
    """A run resumes with the tokenizer file its checkpoint was trained with: one retrained under the
    same name (--force) gives the same ids other meanings."""
    saved = ckpt_dir / TOKENIZER_FILE
    if tokenizer is not None and saved.is_file() and ckpt.sha256(saved) != tokenizer.sha256:
        raise TokenizerError(
            f"{tokenizer.path}: tokenizer {tokenizer.name!r} differs from the one checkpoint "
            f"{ckpt_dir.name} was trained with ({saved}); use --restart, or copy that file back"
        )


def _check_resume(ckpt_dir: Path, model: ModelConfig, train: TrainConfig, dataset: Dataset) -> None:
    meta = ckpt.read_meta(ckpt_dir)
    fingerprint = meta.get("data_position", {}).get("fingerprint")
    if fingerprint is not None and fingerprint != dataset.manifest.get("fingerprint"):
        raise DataError(
            f"{dataset.path}/manifest.json: dataset differs from the one checkpoint "
            f"{ckpt_dir.name} was trained on (fingerprint {fingerprint!r}), so the batches "
            f"would not continue where they stopped; use --restart, or restore that dataset"
        )
    saved = ckpt.read_configs(ckpt_dir)
    old_model, old_train = saved.get("model.json"), saved.get("train.json")
    if old_model is not None:
        # Through today's loader, so keys added since the checkpoint was written take their defaults.
        old_model = to_dict(from_dict(ModelConfig, old_model, f"{ckpt_dir}/model.json"))
        diff = {k: (old_model[k], v) for k, v in to_dict(model).items() if old_model[k] != v}
        fixed = {k: d for k, d in diff.items() if k not in RUNTIME_KEYS}
        if fixed:
            key, (was, now) = next(iter(fixed.items()))
            raise ConfigError(
                f"model.json: {key}={now!r} differs from checkpoint {ckpt_dir.name} "
                f"({key}={was!r}); use --restart to train a new model"
            )
        if diff:
            print(
                f"Note: model.json's {', '.join(f'{k}={v[1]!r}' for k, v in diff.items())} "
                f"differ from {ckpt_dir.name}; same weights, run differently"
            )
    if old_train is not None:
        try:  # through today's loader too: keys added since take their defaults (optimizer "adamw", ...)
            old_train = to_dict(from_dict(TrainConfig, old_train, f"{ckpt_dir}/train.json"))
        except ConfigError:
            pass  # a key since removed: compare what is there
        if old_train.get("optimizer", "adamw") != train.optimizer:
            raise ConfigError(
                f"train.json: optimizer={train.optimizer!r} differs from checkpoint {ckpt_dir.name} "
                f"(optimizer={old_train.get('optimizer', 'adamw')!r}), whose optimiser state has "
                f"the other's layout; use --restart (or init_from its weights in a new run)"
            )
        for key, default in _MUON_STATE_KEYS.items():  # they change Muon's state's layout too
            was = (old_train.get("muon") or {}).get(key, default)
            now = getattr(train.muon, key) if train.muon is not None else default
            if was != now:
                raise ConfigError(
                    f"train.json: muon.{key}={now!r} differs from checkpoint {ckpt_dir.name} "
                    f"(muon.{key}={was!r}), whose optimiser state has the other's layout; use "
                    f"--restart (or init_from its weights in a new run)"
                )
        for key in _DATA_ORDER_KEYS:
            if old_train.get(key) != to_dict(train)[key]:
                raise ConfigError(
                    f"train.json: {key}={to_dict(train)[key]!r} differs from checkpoint "
                    f"{ckpt_dir.name} ({key}={old_train.get(key)!r}), which would change "
                    f"the data order on resume; use --restart"
                )
        changed = [k for k, v in to_dict(train).items() if old_train.get(k) != v]
        if changed:
            print(f"Note: train.json changed since {ckpt_dir.name}: {', '.join(changed)}")
