"""Shared fixtures: one prepared built-in dataset for the whole session, tiny run directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

# gpt2 tokenizer tests read tiktoken's files from the shared offline cache when it exists.
if "TIKTOKEN_CACHE_DIR" not in os.environ and (SHARED / "tiktoken-cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken-cache")


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding the built-in corpus with the bytes tokenizer, built once."""
    from download_dataset import prepare_dataset

    root = tmp_path_factory.mktemp("data")
    prepare_dataset("builtin", "bytes", root, log=lambda _msg: None)
    return root


def write_run(run_dir: Path, model: dict, train: dict) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "model.json").write_text(json.dumps(model, indent=2))
    (run_dir / "train.json").write_text(json.dumps(train, indent=2))
    return run_dir
