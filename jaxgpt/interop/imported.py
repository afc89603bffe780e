"""A run directory made from weights trained elsewhere (import_gpt2.py, convert_hf.py import),
without JAX: model.json, a train.json that fine-tunes from them, and pretrained/, a weights-only
checkpoint that train.json's `init_from` names.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import numpy as np

from jaxgpt.checkpoints.layout import META, WEIGHTS, latest_checkpoint, write_json
from jaxgpt.config import MODEL_FILE, TRAIN_FILE, ModelConfig, TrainConfig, from_dict, to_dict
from jaxgpt.files import write_tensors

INIT_DIR = "pretrained"
# What a fresh import fine-tunes with; the user edits train.json to taste.
FINETUNE = {
    "dataset": {"source": "builtin"},
    "init_from": INIT_DIR,
    "microbatch_size": 8,
    "gradient_accumulation_steps": 2,
    "train_steps": 100,
    "learning_rate": 1e-4,
    "warmup_percent": 5,
    "lr_end_factor": 0.1,
    "weight_decay": 0.1,
    "checkpoint_interval": 25,
    "validation_batches": 8,
    "keep_last_checkpoints": 2,
}


def check_target(run_dir: Path, force: bool, error: type[Exception]) -> None:
    """`error` unless run_dir can take an import: no model.json, train.json or pretrained/ there
    (unless `force`), and never a run with training checkpoints."""
    clash = next((p for p in (run_dir / MODEL_FILE, run_dir / TRAIN_FILE, run_dir / INIT_DIR) if p.exists()), None)
    if clash is not None and not force:
        raise error(f"{clash}: already exists; choose a new run directory or pass --force")
    if latest_checkpoint(run_dir) is not None:
        raise error(f"{run_dir}: has training checkpoints; import into a new run directory")


def write_run(
    run_dir: Path, weights: dict[str, np.ndarray], cfg: ModelConfig, tokenizer: str, files: dict[str, str], source: str
) -> Path:
    """Write the run directory (`files`: more files for pretrained/, name -> text); returns pretrained/."""
    train_json = {**FINETUNE, "tokenizer": tokenizer, "sequence_length": min(256, cfg.context_length)}
    train = from_dict(TrainConfig, train_json, "imported.FINETUNE")  # our own defaults must be valid
    init = run_dir / INIT_DIR
    _write_init(init, weights, cfg, train, files, source)
    write_json(run_dir / MODEL_FILE, to_dict(cfg))
    write_json(run_dir / TRAIN_FILE, train_json)
    return init


def _write_init(
    init: Path, weights: dict[str, np.ndarray], cfg: ModelConfig, train: TrainConfig, files: dict[str, str], source: str
) -> None:
    """The weights-only checkpoint, assembled aside and renamed into place."""
    init.parent.mkdir(parents=True, exist_ok=True)
    tmp = init.parent / f".tmp-{init.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_tensors(weights, tmp / WEIGHTS)
    for filename, text in files.items():
        (tmp / filename).write_text(text, encoding="utf-8")
    write_json(tmp / MODEL_FILE, to_dict(cfg))
    write_json(tmp / TRAIN_FILE, to_dict(train))
    write_json(
        tmp / META,
        {  # last: marks the folder complete
            "format": 1,
            "step": 0,
            "weights_only": True,
            "imported_from": source,
            "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    )
    if init.exists():
        shutil.rmtree(init)
    os.rename(tmp, init)
