"""FineWeb GPT-2 shards: the llm.c .bin format, conversion, choosing files by training length, offline errors.

The .bin files are written by the tests; nothing here touches the network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.windows import BatchSampler
from jaxgpt.data.sources import fineweb
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.preparation import prepare as prepare_module
from jaxgpt.preparation.prepare import FINEWEB, prepare_dataset

SIZES = {fineweb.VAL_FILE: 3000, fineweb.train_file(1): 5000, fineweb.train_file(2): 5000, fineweb.train_file(3): 4000}


def tokens_of(name: str) -> np.ndarray:
    """Deterministic GPT-2 ids for a file; every 97th token starts a document."""
    seed = int.from_bytes(name.encode()[-12:], "little") % 2**32
    tokens = np.random.default_rng(seed).integers(0, 50256, SIZES[name])
    tokens[::97] = 50256
    return tokens


@pytest.fixture
def bins(tmp_path: Path) -> Path:
    folder = tmp_path / "fineweb10B"
    folder.mkdir()
    for name in SIZES:
        fineweb.write_bin(folder / name, tokens_of(name))
    return folder


def prepare(root: Path, bins: Path | None, lines: list[str] | None = None, **kw) -> Path:
    return prepare_dataset(FINEWEB, "gpt2", root, from_path=bins, log=(lines if lines is not None else []).append, **kw)


# ----------------------------------------------------------------------------- the .bin format


def test_bin_round_trip(tmp_path: Path) -> None:
    tokens = np.array([50256, 1, 2, 65535, 0])
    fineweb.write_bin(tmp_path / "x.bin", tokens)
    assert (tmp_path / "x.bin").stat().st_size == 1024 + 2 * 5
    got = fineweb.read_bin(tmp_path / "x.bin")
    assert isinstance(got, np.memmap) and got.tolist() == tokens.tolist()
    header = np.fromfile(tmp_path / "x.bin", dtype="<i4", count=3)
    assert header.tolist() == [20240520, 1, 5]


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda b: b[:100], "truncated .bin file (100 bytes"),
        (lambda b: b[:-1], "truncated or padded .bin file"),
        (lambda b: b + b"\0\0", "truncated or padded .bin file"),
        (lambda b: (20240521).to_bytes(4, "little") + b[4:], "not an llm.c token file (magic 20240521"),
        (lambda b: b[:4] + (2).to_bytes(4, "little") + b[8:], ".bin version 2 is not supported"),
    ],
)
def test_bad_bin_files_name_the_file(tmp_path: Path, damage, match: str) -> None:
    path = tmp_path / "fineweb_train_000001.bin"
    fineweb.write_bin(path, np.arange(10))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=re.escape(match)) as info:
        fineweb.read_bin(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- conversion


def test_conversion_takes_what_the_training_length_needs(
    tmp_path: Path, bins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_tiktoken(name: str):
        raise AssertionError("the shards are ids already: no tokenizer files needed")

    monkeypatch.setattr(prepare_module, "get_tokenizer", no_tiktoken)
    root = tmp_path / "data"
    path = prepare(root, bins, train_tokens=6000)  # file 1 holds 5000: files 1 and 2
    assert path == root / "fineweb10B-gpt2-gpt2"
    ds = open_dataset(path, verify=True)
    assert (ds.tokenizer, ds.vocab_size, ds.eot_id, ds.manifest["dtype"]) == ("gpt2", 50257, 50256, "uint16")
    assert ds.manifest["fingerprint"] == "hf:kjj0/fineweb10B-gpt2 train_files=2"
    shards = ds.manifest["splits"]["train"]["shards"]
    assert [s["source_file"] for s in shards] == [fineweb.train_file(1), fineweb.train_file(2)]
    expected = np.concatenate([tokens_of(fineweb.train_file(1)), tokens_of(fineweb.train_file(2))])
    np.testing.assert_array_equal(ds.train.read(0, ds.train.n_tokens), expected)
    np.testing.assert_array_equal(ds.val.read(0, ds.val.n_tokens), tokens_of(fineweb.VAL_FILE))
    assert ds.manifest["splits"]["train"]["documents"] == int(np.count_nonzero(expected == 50256))
    # Batches are windows of the original token stream, also across the file boundary at 5000.
    sampler = BatchSampler(ds.train, microbatch_size=8, seq_len=64, seed=0)
    x, y = sampler.batch(0, 4)[:2]
    for xs, ys in zip(x.reshape(-1, 64), y.reshape(-1, 64)):
        start = int(np.flatnonzero((expected[:-64] == xs[0]) & (expected[1:-63] == xs[1]))[0])
        np.testing.assert_array_equal(xs, expected[start : start + 64])
        np.testing.assert_array_equal(ys, expected[start + 1 : start + 65])
    assert not (root / "downloads" / "fineweb10B-gpt2").exists()  # --from: nothing fetched


def test_reuse_grow_and_shrink(tmp_path: Path, bins: Path) -> None:
    root = tmp_path / "data"
    path = prepare(root, bins, train_tokens=5000)
    first = open_dataset(path).manifest["splits"]["train"]["shards"][0]["sha256"]
    lines: list[str] = []
    prepare(root, None, lines, train_tokens=5000)  # no --from needed to reuse
    assert lines == [f"reusing dataset {path} (1 train file(s), manifest matches)"]
    lines = []
    prepare(root, bins, lines, train_tokens=10_001)  # a longer run: files 2 and 3 are added
    assert "3 train file(s)" in lines[0] and "reusing 2 converted shard(s)" in lines[0]  # file 1 and val
    manifest = open_dataset(path, verify=True).manifest
    assert manifest["splits"]["train"]["tokens"] == 14_000
    assert manifest["splits"]["train"]["shards"][0]["sha256"] == first
    lines = []
    prepare(root, None, lines, options={"train_shards": 1})  # shrinks without any .bin file
    assert open_dataset(path, verify=True).manifest["splits"]["train"]["tokens"] == 5000
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["fineweb10B-gpt2-gpt2"]


def test_out_of_vocabulary_token_names_the_bin(tmp_path: Path, bins: Path) -> None:
    bad = tokens_of(fineweb.train_file(1))
    bad[123] = 50300
    fineweb.write_bin(bins / fineweb.train_file(1), bad)
    with pytest.raises(DataError, match=r"fineweb_train_000001\.bin: token id 50300 outside 0\.\.50256"):
        prepare(tmp_path / "data", bins, train_tokens=10)
    assert not (tmp_path / "data" / "fineweb10B-gpt2-gpt2").exists()  # nothing half-written


def test_wrong_tokenizer_and_options(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="tokenizer must be 'gpt2', got 'bytes'"):
        prepare_dataset(FINEWEB, "bytes", tmp_path)
    with pytest.raises(DataError, match="train_shards must be null or 1..103"):
        prepare_dataset(FINEWEB, "gpt2", tmp_path, options={"train_shards": 0})


def test_bad_downloaded_copy_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downloads = tmp_path / "data" / "downloads" / "fineweb10B-gpt2"
    downloads.mkdir(parents=True)
    (downloads / fineweb.train_file(1)).write_bytes(b"partial")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # so the fetch fails at once, without the network
    lines: list[str] = []
    with pytest.raises(DataError, match="cannot fetch fineweb_train_000001.bin"):
        prepare(tmp_path / "data", None, lines, train_tokens=10)
    assert "truncated .bin file" in lines[0] and "fetching it again" in lines[0]


def test_offline_without_copies_is_one_line(tmp_path: Path) -> None:
    # A fresh process, as a user would run it: HF_HUB_OFFLINE is read when huggingface_hub loads.
    # HF_ENDPOINT points at a closed local port in case offline mode were ever ignored.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "download_dataset.py"),
            FINEWEB,
            "--data-dir",
            str(tmp_path / "data"),
            "--train-tokens",
            "1e8",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "error: cannot fetch fineweb_train_000001.bin from https://huggingface.co/datasets/kjj0/fineweb10B-gpt2"
    )
    assert str(tmp_path / "data" / "downloads" / "fineweb10B-gpt2") in done.stderr and "--from" in done.stderr
    assert not (tmp_path / "data" / "fineweb10B-gpt2-gpt2").exists()
