"""Datasets as runs see them: train.py's preparation by training length, mismatches with model.json
and train.json. (The shipped runs' own datasets: test_shipped_runs.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, write_run

import train
from jaxgpt.config import ConfigError
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import fineweb
from jaxgpt.training import run as run_setup

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
SMALL_GPT = {
    "architecture": "gpt2",
    "vocab_size": 50304,
    "context_length": 64,
    "emb_dim": 16,
    "n_heads": 2,
    "n_layers": 1,
}


def fineweb_downloads(data_root: Path, n_train: int, tokens_per_file: int) -> None:
    """What an earlier download leaves in <data>/downloads/fineweb10B-gpt2/ (train.py has no --from)."""
    folder = data_root / "downloads" / fineweb.SOURCE
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [fineweb.VAL_FILE] + [fineweb.train_file(i) for i in range(1, n_train + 1)]:
        fineweb.write_bin(folder / name, rng.integers(0, 50257, tokens_per_file))


def test_train_prepares_only_the_files_its_length_needs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fineweb_downloads(data, n_train=4, tokens_per_file=1000)
    # 5 steps x 2 x 64 tokens = 640 tokens: one file; 20 steps = 2560 tokens: three files.
    run_dir = write_run(
        tmp_path / "run",
        SMALL_GPT,
        {"dataset": {"source": fineweb.SOURCE}, "tokenizer": "gpt2", "microbatch_size": 2, "train_steps": 5},
    )
    run = run_setup.prepare_run(run_dir, data_root=data, restart=False)
    assert run.dataset.train.n_tokens == 1000 and len(run.dataset.train.shards) == 1
    (run_dir / "train.json").write_text(
        json.dumps(
            {"dataset": {"source": fineweb.SOURCE}, "tokenizer": "gpt2", "microbatch_size": 2, "train_steps": 20}
        )
    )
    run = run_setup.prepare_run(run_dir, data_root=data, restart=False)
    assert run.dataset.train.n_tokens == 3000
    assert run.dataset.manifest["fingerprint"].endswith("train_files=3")


def test_model_vocab_must_cover_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    fineweb_downloads(data, n_train=1, tokens_per_file=1000)
    run_dir = write_run(
        tmp_path / "run",
        {**SMALL_GPT, "vocab_size": 50000},
        {"dataset": {"source": fineweb.SOURCE}, "tokenizer": "gpt2", "microbatch_size": 2, "train_steps": 1},
    )
    with pytest.raises(
        ConfigError,
        match=r"model\.json: vocab_size=50000 is smaller than the gpt2 tokenizer's "
        r"50257 ids",
    ):
        run_setup.prepare_run(run_dir, data_root=data, restart=False)
    # The CLI says it in one line, before JAX starts.
    assert train.main([str(run_dir), "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vocab_size=50000" in err


def test_dataset_tokenizer_must_match_train_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fineweb_downloads(data, n_train=1, tokens_per_file=1000)
    run_dir = write_run(
        tmp_path / "run",
        {**SMALL_GPT, "vocab_size": 257},
        {"dataset": {"source": fineweb.SOURCE}, "tokenizer": "bytes", "microbatch_size": 2, "train_steps": 1},
    )
    with pytest.raises(DataError, match="fineweb10B-gpt2: holds gpt2 tokens, so the tokenizer must be 'gpt2'"):
        run_setup.prepare_run(run_dir, data_root=data, restart=False)
