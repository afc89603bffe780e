"""FineWeb-Edu from parquet text: shards under the published names, tokenized shard by shard; the
choice of shards by training length; resuming after SIGKILL byte for byte; offline and corrupt-file errors.

The parquet shards are written here with pyarrow; nothing touches the network.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SLOW, write_run

import download_dataset as dd
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import fineweb_edu
from jaxgpt.data.sources.fineweb_edu import VAL_FILE, shard_file
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.preparation.prepare import FINEWEB_EDU, prepare_dataset
from jaxgpt.training import run as run_setup

WORDS = np.array(
    [
        "the",
        "of",
        "and",
        "a",
        "to",
        "in",
        "is",
        "was",
        "that",
        "for",
        "on",
        "with",
        "as",
        "by",
        "at",
        "from",
        "his",
        "her",
        "an",
        "which",
        "or",
        "be",
        "this",
        "are",
        "were",
        "had",
        "it",
        "learning",
        "students",
        "school",
        "water",
        "energy",
        "cells",
        "history",
        "language",
        "science",
        "théorie",
        "über",
    ]
)


def shard_documents(name: str, n_docs: int, words: int) -> list[str]:
    """Deterministic documents of one shard (seeded by its name)."""
    rng = np.random.default_rng(int(name[6:11]))
    return [" ".join(rng.choice(WORDS, words)) + "." for _ in range(n_docs)]


def write_shards(folder: Path, n_train: int, *, n_docs: int = 60, words: int = 30) -> Path:
    """The validation shard and train shards 0..n_train-1 as the published files are laid out: a
    "text" column among others, row groups of a fixed number of rows."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in [VAL_FILE] + [shard_file(i) for i in range(n_train)]:
        docs = shard_documents(name, n_docs, words)
        table = pa.table(
            {"text": docs, "id": [f"<urn:{name}:{i}>" for i in range(n_docs)], "score": np.linspace(2.5, 5, n_docs)}
        )
        pq.write_table(table, folder / name, row_group_size=max(1, n_docs // 4))
    return folder


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach the network: a shard that is not on disk fails at once."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def byte_tokens(docs: list[str]) -> list[int]:
    return [t for doc in docs for t in [*doc.encode(), 256]]


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_names_match_nanochats_dataset() -> None:
    assert (fineweb_edu.REPO_ID, shard_file(0), VAL_FILE) == (
        "karpathy/fineweb-edu-100b-shuffle",
        "shard_00000.parquet",
        "shard_01822.parquet",
    )
    assert fineweb_edu.N_TRAIN_FILES == 1822


def test_prepare_from_folder_reads_in_place(tmp_path: Path) -> None:
    src = write_shards(tmp_path / "edu", 3)
    root = tmp_path / "data"
    lines: list[str] = []
    path = prepare_dataset(
        FINEWEB_EDU, "bytes", root, options={"train_shards": 2}, from_path=src, log=lines.append, shard_tokens=5000
    )  # a parquet shard of ~9k bytes: several dataset shards
    assert path == root / "fineweb-edu-bytes"
    ds = open_dataset(path, verify=True)
    assert ds.train.read(0, ds.train.n_tokens).tolist() == byte_tokens(
        shard_documents(shard_file(0), 60, 30) + shard_documents(shard_file(1), 60, 30)
    )
    assert ds.val.read(0, ds.val.n_tokens).tolist() == byte_tokens(shard_documents(VAL_FILE, 60, 30))
    m = ds.manifest
    assert (m["source"], m["options"], m["tokenizer"], m["fingerprint"]) == (
        "fineweb-edu",
        {"train_shards": 2},
        "bytes",
        "hf:karpathy/fineweb-edu-100b-shuffle train_files=2",
    )
    shards = m["splits"]["train"]["shards"]
    pieces = [-(-len(byte_tokens(shard_documents(shard_file(i), 60, 30))) // 5000) for i in range(2)]
    assert (
        pieces[0] >= 2
        and [s["source_file"] for s in shards] == [shard_file(0)] * pieces[0] + [shard_file(1)] * pieces[1]
    )
    assert sum(s["documents"] for s in shards) == m["splits"]["train"]["documents"] == 120
    assert m["splits"]["val"]["documents"] == 60
    assert not (root / "downloads").exists()  # read where they are, never copied
    assert sum(line.startswith("tokenized ") for line in lines) == 3


def test_shards_by_training_length_and_a_longer_run_adds_only_new_ones(tmp_path: Path) -> None:
    src = write_shards(tmp_path / "edu", 4)
    root = tmp_path / "data"
    per_shard = len(byte_tokens(shard_documents(shard_file(0), 60, 30)))
    next_shard = len(byte_tokens(shard_documents(shard_file(1), 60, 30)))

    def prep(train_tokens: int, **kw: int) -> tuple[dict, list[str]]:
        lines: list[str] = []
        path = prepare_dataset(
            FINEWEB_EDU, "bytes", root, train_tokens=train_tokens, from_path=src, log=lines.append, **kw
        )
        return open_dataset(path).manifest, lines

    manifest, _ = prep(per_shard)
    assert [s["source_file"] for s in manifest["splits"]["train"]["shards"]] == [shard_file(0)]
    staged = root / "fineweb-edu-bytes.staging" / "shard_00000" / "train-00000.safetensors"
    before = staged.stat()
    manifest, lines = prep(per_shard + 1)  # one token more: the next shard too, and only it is tokenized
    assert [s["source_file"] for s in manifest["splits"]["train"]["shards"]] == [shard_file(0), shard_file(1)]
    assert [line for line in lines if "tokenized" in line] == [
        f"tokenized {src / shard_file(1)}: 60 documents, {next_shard:,} tokens, " + lines[0].split(" tokens, ")[1],
        f"reused 2 tokenized shard(s) from {root / 'fineweb-edu-bytes.staging'}: {VAL_FILE}, {shard_file(0)}",
    ]
    assert (staged.stat().st_ino, staged.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert (root / "fineweb-edu-bytes" / "train-00000.safetensors").stat().st_ino == before.st_ino  # a hard link
    _, lines = prep(per_shard + 1)
    assert lines[-1] == f"reusing dataset {root / 'fineweb-edu-bytes'} (2 train file(s), manifest matches)"
    manifest, lines = prep(10**9, edu_train_files=4)  # more than the 4 published shards there are: each, and a note
    assert len(manifest["splits"]["train"]["shards"]) == 4
    assert any("it will see the data more than once" in line for line in lines)


def test_train_json_names_the_source(tmp_path: Path) -> None:
    """train.py has no --from: the shards are found in <data>/downloads/fineweb-edu/, as after a download."""
    data = tmp_path / "data"
    write_shards(data / "downloads" / "fineweb-edu", 3)
    model = {
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 32,
        "emb_dim": 16,
        "n_heads": 2,
        "n_layers": 1,
    }
    run_dir = write_run(
        tmp_path / "run",
        model,
        {"dataset": {"source": "fineweb-edu"}, "tokenizer": "bytes", "microbatch_size": 8, "train_steps": 40},
    )
    run = run_setup.prepare_run(run_dir, data_root=data, restart=False)  # 40 x 8 x 32 = 10,240 tokens: 2 shards of ~9k
    assert [s["source_file"] for s in run.dataset.manifest["splits"]["train"]["shards"]] == [
        shard_file(0),
        shard_file(1),
    ]


@SLOW  # builds and scores a model
def test_evaluate_scores_the_runs_dataset_without_rebuilding_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """evaluate.py prepares the run's dataset for the run's length: the two shards train.py took, not one."""
    import evaluate
    from jaxgpt.checkpoints import store as ckpt
    from jaxgpt.config import ModelConfig
    from jaxgpt.model.gpt import build_model

    data = tmp_path / "data"
    write_shards(data / "downloads" / "fineweb-edu", 3)
    model = {
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 32,
        "emb_dim": 16,
        "n_heads": 2,
        "n_layers": 1,
    }
    run_dir = write_run(
        tmp_path / "run",
        model,
        {"dataset": {"source": "fineweb-edu"}, "tokenizer": "bytes", "microbatch_size": 8, "train_steps": 40},
    )
    run_setup.prepare_run(run_dir, data_root=data, restart=False)
    manifest = data / "fineweb-edu-bytes" / "manifest.json"
    before = (manifest.stat().st_ino, manifest.read_bytes())
    folder = run_dir / "checkpoints" / "20260101T000000Z-step-1"
    folder.mkdir(parents=True)
    ckpt.save_weights(build_model(ModelConfig(**model), seed=1), folder / ckpt.WEIGHTS)
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    assert evaluate.main([str(run_dir), "--data-dir", str(data), "--max-batches", "1"]) == 0
    assert "reusing dataset" in capsys.readouterr().out
    assert (manifest.stat().st_ino, manifest.read_bytes()) == before


# ----------------------------------------------------------------------------- resuming after a kill


def finished(staging: Path) -> list[str]:
    """Staged shards that were completed (a temporary folder has a '.' in its name)."""
    return sorted(d.name for d in staging.glob("shard_*") if "." not in d.name and (d / "manifest.json").is_file())


def test_sigkill_mid_way_resumes_without_redoing_and_ends_byte_identical(tmp_path: Path) -> None:
    try:
        get_tokenizer("gpt2")
    except ValueError:
        pytest.skip("no tiktoken cache for gpt2 (set TIKTOKEN_CACHE_DIR; ../shared/tiktoken-cache in CI)")
    n_train = 8  # ~0.25 s to tokenize each shard here: after the first one, seconds of work remain
    src = write_shards(tmp_path / "edu", n_train, n_docs=1200, words=400)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    staging = killed / "fineweb-edu-gpt2.staging"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "download_dataset.py"),
            FINEWEB_EDU,
            "--tokenizer",
            "gpt2",
            "--train-shards",
            str(n_train),
            "--from",
            str(src),
            "--data-dir",
            str(killed),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # its own process group: tokenizer workers, if any, die too
    deadline = time.monotonic() + 300
    while not finished(staging):  # as soon as one shard is finished
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no shard finished"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL
    done = finished(staging)
    # It really was mid-way: some shards finished, not all, and no dataset yet.
    assert 1 <= len(done) < n_train + 1, (done, out)
    assert not (killed / "fineweb-edu-gpt2").exists(), out
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for d in done for p in (staging / d).iterdir()}
    unfinished = sorted(staging.glob("*.tmp-*"))  # the shard being written when the kill came, if any

    lines: list[str] = []
    prepare_dataset(FINEWEB_EDU, "gpt2", killed, options={"train_shards": n_train}, from_path=src, log=lines.append)
    names = [VAL_FILE] + [shard_file(i) for i in range(n_train)]
    redone = [n for n in names if f"tokenized {src / n}: " in "\n".join(lines)]
    assert redone == [n for n in names if Path(n).stem not in done]  # only the shards not finished before the kill
    assert f"reused {len(done)} tokenized shard(s) from {staging}: " in "\n".join(lines)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stamps} == stamps  # finished shards untouched
    assert not list(staging.glob("*.tmp-*")) and not list(staging.glob("*.old-*"))  # the unfinished one is gone
    assert [line.split(" (")[0] for line in lines if line.startswith("removing ")] == [
        f"removing {p}" for p in unfinished
    ]

    prepare_dataset(FINEWEB_EDU, "gpt2", clean, options={"train_shards": n_train}, from_path=src, log=lambda _: None)
    for folder in ("fineweb-edu-gpt2", "fineweb-edu-gpt2.staging"):
        resumed, uninterrupted = files_of(killed / folder), files_of(clean / folder)
        assert sorted(resumed) == sorted(uninterrupted) and len(resumed) >= n_train + 2
        assert resumed == uninterrupted  # every file byte for byte, the manifest included
    assert (
        open_dataset(killed / "fineweb-edu-gpt2", verify=True).manifest["splits"]["train"]["documents"]
        == 1200 * n_train
    )


# ----------------------------------------------------------------------------- errors


def test_offline_without_from_is_one_line(tmp_path: Path) -> None:
    # A fresh process, as a user would run it: HF_HUB_OFFLINE is read when huggingface_hub loads.
    # HF_ENDPOINT points at a closed local port in case offline mode were ever ignored.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "download_dataset.py"),
            FINEWEB_EDU,
            "--tokenizer",
            "bytes",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        f"error: cannot fetch {VAL_FILE} from "
        "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle (offline"
    )
    assert str(tmp_path / "data" / "downloads" / "fineweb-edu") in done.stderr
    assert "--from <folder with the .parquet files>" in done.stderr
    assert not (tmp_path / "data" / "fineweb-edu-bytes").exists()


def test_a_missing_train_shard_is_fetched_and_offline_says_so(tmp_path: Path) -> None:
    src = write_shards(tmp_path / "edu", 1)
    with pytest.raises(DataError, match=rf"^cannot fetch {shard_file(1)} from .*\(offline: HF_HUB_OFFLINE is set\)"):
        prepare_dataset(
            FINEWEB_EDU, "bytes", tmp_path / "data", options={"train_shards": 2}, from_path=src, log=lambda _: None
        )
    # the shards finished before the error are kept for the next try
    assert finished(tmp_path / "data" / "fineweb-edu-bytes.staging") == ["shard_00000", "shard_01822"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "no text column"])
def test_corrupt_local_shard_is_one_line_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, damage: str
) -> None:
    src = write_shards(tmp_path / "edu", 2)
    root = tmp_path / "data"
    path = prepare_dataset(FINEWEB_EDU, "bytes", root, options={"train_shards": 1}, from_path=src, log=lambda _: None)
    before = files_of(path)
    bad = src / shard_file(1)
    if damage == "garbage":
        bad.write_bytes(b"<html>rate limited</html>")
    elif damage == "truncated":
        bad.write_bytes(bad.read_bytes()[:1000])
    else:
        pq.write_table(pa.table({"content": ["a document"]}), bad)
    message = {
        "garbage": "not a parquet file or corrupt (Parquet magic bytes not found in footer.",
        "truncated": "not a parquet file or corrupt (Parquet magic bytes not found in footer.",
        "no text column": "no column 'text' (columns: 'content')",
    }[damage]
    with pytest.raises(DataError) as err:
        prepare_dataset(FINEWEB_EDU, "bytes", root, options={"train_shards": 2}, from_path=src, log=lambda _: None)
    assert str(err.value).startswith(f"{bad}: {message}"), str(err.value)
    assert files_of(path) == before  # the existing dataset is kept as it was
    assert (
        dd.main(
            [FINEWEB_EDU, "--tokenizer", "bytes", "--train-shards", "2", "--from", str(src), "--data-dir", str(root)]
        )
        == 2
    )
    err_text = capsys.readouterr().err
    assert err_text.startswith(f"error: {bad}: ") and err_text.count("\n") == 1


def test_from_must_be_a_folder_and_validation_must_hold_text(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"^{tmp_path / 'nowhere'}: --from folder not found"):
        prepare_dataset(FINEWEB_EDU, "bytes", tmp_path / "data", from_path=tmp_path / "nowhere", log=lambda _: None)
    src = write_shards(tmp_path / "edu", 1)
    pq.write_table(pa.table({"text": pa.array([None, ""], type=pa.string())}), src / VAL_FILE)
    for _ in range(2):  # also when its (empty) staged shard is reused
        with pytest.raises(DataError, match=rf"^{VAL_FILE}: its column 'text' holds no text \(tokenized into "):
            prepare_dataset(FINEWEB_EDU, "bytes", tmp_path / "data", from_path=src, log=lambda _: None)


def test_a_damaged_staged_shard_is_tokenized_again(tmp_path: Path) -> None:
    src = write_shards(tmp_path / "edu", 1)
    root = tmp_path / "data"
    path = prepare_dataset(FINEWEB_EDU, "bytes", root, options={"train_shards": 1}, from_path=src, log=lambda _: None)
    good = files_of(path)
    shard = root / "fineweb-edu-bytes.staging" / "shard_00000" / "train-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])  # cut short, as a full disk might leave it
    (path / "manifest.json").unlink()
    lines: list[str] = []
    prepare_dataset(FINEWEB_EDU, "bytes", root, options={"train_shards": 1}, from_path=src, log=lines.append)
    assert any(
        line.startswith(f"{shard}: truncated shard") and line.endswith(f"tokenizing {shard_file(0)} again")
        for line in lines
    ), lines
    assert files_of(path) == good


def test_options_and_cli(tmp_path: Path) -> None:
    src = write_shards(tmp_path / "edu", 2)
    root = tmp_path / "data"
    assert (
        dd.main(
            [
                FINEWEB_EDU,
                "--tokenizer",
                "bytes",
                "--train-shards",
                "2",
                "--from",
                str(src),
                "--data-dir",
                str(root),
                "--verify",
            ]
        )
        == 0
    )
    manifest = json.loads((root / "fineweb-edu-bytes" / "manifest.json").read_text())
    assert manifest["options"] == {"train_shards": 2} and len(manifest["splits"]["train"]["shards"]) == 2
    with pytest.raises(SystemExit):
        dd.main([FINEWEB_EDU, "--train-shards", "1", "--train-tokens", "10"])  # one or the other
