"""A tokenizer trained on FineWeb-Edu (bpe.py's fineweb-edu source, nanochat's scripts/tok_train.py):
on the first --max-chars characters of the train shards in order, each document cut to --doc-cap;
only the shards that needs are opened; never the validation shard, on which compression is measured;
determinism, reuse and refusal; a dataset prepared with it; one-line errors.

The parquet shards are written here with pyarrow under the published names; nothing touches the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from test_fineweb_edu import files_of, shard_documents, write_shards
from tokenizers import Tokenizer as HFTokenizer

import download_dataset as dd
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources.fineweb_edu import VAL_FILE, shard_file
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import EOT_TEXT, ROLE_TOKENS, TokenizerError, get_tokenizer
from jaxgpt.preparation import bpe

VOCAB = 330
DOC_CAP = 100
# Validation text made of letters no train document has (test_fineweb_edu.WORDS): any merge holding
# one of them could only have been learned from the validation shard.
VAL_ONLY = "qzx"
VAL_DOCS = [" ".join(["qzxq zzxx xqzq"] * (5 + i % 7)) + f" the {i}." for i in range(40)]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def learned_from_validation(vocab: dict[str, int]) -> list[str]:
    """The learned tokens (merges) that hold a letter only the validation text has."""
    return [t for t in vocab if len(t) > 1 and set(t) & set(VAL_ONLY) and t != EOT_TEXT]


def capped(name: str) -> list[str]:
    return [doc[:DOC_CAP] for doc in shard_documents(name, 60, 30)]


def max_chars() -> int:
    """Past shard_00000 (cut documents), inside shard_00001: two shards are needed, not three."""
    return sum(map(len, capped(shard_file(0)))) + 500


def nanochat_documents(limit: int) -> list[str]:
    """tok_train.py's loop, written out here over the fixture's documents."""
    docs, chars = [], 0
    for doc in capped(shard_file(0)) + capped(shard_file(1)) + capped(shard_file(2)):
        docs.append(doc)
        chars += len(doc)
        if chars > limit:
            return docs
    raise AssertionError("the fixture is too small")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """shard_00000 and _00001 readable; _00002 and _00003 corrupt (opening one fails); the validation shard."""
    folder = write_shards(tmp_path / "edu", 2)
    pq.write_table(pa.table({"text": VAL_DOCS}), folder / VAL_FILE, row_group_size=10)
    for i in (2, 3):
        (folder / shard_file(i)).write_bytes(b"not parquet" * 100)
    return folder


def train(root: Path, src: Path, name: str = "edu", *extra: str, limit: int | None = None) -> int:
    return dd.main(
        [
            "tokenizer",
            name,
            "fineweb-edu",
            "--from",
            str(src),
            "--vocab-size",
            str(VOCAB),
            "--max-chars",
            str(limit or max_chars()),
            "--doc-cap",
            str(DOC_CAP),
            "--data-dir",
            str(root),
            *extra,
        ]
    )


def test_trains_on_the_needed_train_shards_only(src: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    assert train(root, src) == 0  # shard_00002 is corrupt: it was never opened
    folder = root / "tokenizers" / "edu"
    meta = json.loads((folder / "meta.json").read_text())
    tok = get_tokenizer("edu", root)
    assert (tok.n_vocab, tok.eot_id, meta["n_vocab"], meta["source"]) == (
        VOCAB,
        VOCAB - 1 - len(ROLE_TOKENS),
        VOCAB,
        "fineweb-edu",
    )
    assert meta["options"] == {"max_chars": max_chars(), "doc_cap": DOC_CAP}
    assert meta["fingerprint"] == " ".join(f"{n}:{(src / n).stat().st_size}" for n in (shard_file(0), shard_file(1)))
    expected = nanochat_documents(max_chars())
    assert len(capped(shard_file(0))) < len(expected) < len(capped(shard_file(0))) + 60  # stopped inside shard 1
    assert meta["train_split"] == {"documents": len(expected), "bytes": sum(len(d.encode()) for d in expected)}
    vocab = HFTokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
    assert not learned_from_validation(vocab)
    assert any(len(t) >= 4 and t.strip("Ġ").isalpha() for t in vocab)  # ... while words of the train text were


def test_the_validation_text_would_be_learned_if_trained_on(tmp_path: Path) -> None:
    # The check above can fail: with the validation documents as a train shard, merges of its letters appear.
    folder = write_shards(tmp_path / "edu", 0)
    pq.write_table(pa.table({"text": VAL_DOCS}), folder / shard_file(0))
    root = tmp_path / "data"
    assert train(root, folder, limit=1000) == 0  # within that one shard
    vocab = HFTokenizer.from_file(str(root / "tokenizers" / "edu" / "tokenizer.json")).get_vocab()
    assert learned_from_validation(vocab)


def test_compression_on_the_validation_shard(src: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    limit = sum(map(len, VAL_DOCS[:10]))  # the first 10 documents hold exactly the cap
    folder = bpe.train_tokenizer(
        "edu",
        "fineweb-edu",
        root,
        vocab_size=VOCAB,
        from_path=src,
        log=lambda _m: None,
        options={"max_chars": max_chars(), "doc_cap": DOC_CAP},
        edu_val_chars=limit,
    )
    assert folder == root / "tokenizers" / "edu"
    meta = json.loads((root / "tokenizers" / "edu" / "meta.json").read_text())
    hf = HFTokenizer.from_file(str(root / "tokenizers" / "edu" / "tokenizer.json"))
    docs = VAL_DOCS[:10]
    n_bytes, n_tokens = sum(len(d.encode()) for d in docs), sum(len(e.ids) for e in hf.encode_batch(docs))
    figures = meta["compression"]
    assert (figures["documents"], figures["bytes"], figures["tokenizer"]["tokens"]) == (10, n_bytes, n_tokens)
    assert figures["tokenizer"]["bytes_per_token"] == pytest.approx(n_bytes / n_tokens)
    assert VAL_FILE in meta["validation_split"]


def test_deterministic_reused_and_refused(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert train(one, src) == 0 and train(two, src) == 0
    assert files_of(one / "tokenizers") == files_of(two / "tokenizers")
    capsys.readouterr()
    assert train(one, src) == 0
    assert "reusing tokenizer" in capsys.readouterr().out
    assert train(one, src, limit=max_chars() + 1) == 2  # another setting: refused before training
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'max_chars': " in err and "--force" in err
    shard = src / shard_file(1)  # another file under the same name: the fingerprint (its size) differs
    pq.write_table(pa.table({"text": shard_documents(shard_file(1), 61, 30)}), shard)
    assert train(one, src) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its fingerprint is" in err
    assert files_of(one / "tokenizers") == files_of(two / "tokenizers")  # nothing replaced
    assert train(one, src, "edu", "--force") == 0
    assert files_of(one / "tokenizers") != files_of(two / "tokenizers")


def test_a_dataset_prepared_with_it(src: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    assert train(root, src) == 0
    assert (
        dd.main(
            ["fineweb-edu", "--from", str(src), "--tokenizer", "edu", "--train-shards", "1", "--data-dir", str(root)]
        )
        == 0
    )
    ds = open_dataset(root / "fineweb-edu-edu", verify=True)
    tok = get_tokenizer("edu", root)

    def ids(docs: list[str]) -> list[int]:
        return [t for doc in docs for t in [*tok.encode(doc), tok.eot_id]]

    assert ds.train.read(0, ds.train.n_tokens).tolist() == ids(shard_documents(shard_file(0), 60, 30))
    assert ds.val.read(0, ds.val.n_tokens).tolist() == ids(VAL_DOCS)
    assert ds.manifest["tokenizer_sha256"] == tok.sha256


def test_errors_are_one_line(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "data"
    assert (
        dd.main(
            [
                "tokenizer",
                "edu",
                "fineweb-edu",
                "--from",
                str(tmp_path / "nowhere"),
                "--vocab-size",
                "300",
                "--data-dir",
                str(root),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere: --from folder not found" in err
    with pytest.raises(DataError, match=r"^fineweb-edu: --doc-cap must be a positive whole number, got 0$"):
        bpe.train_tokenizer("edu", "fineweb-edu", root, vocab_size=300, options={"doc_cap": 0}, from_path=src)
    with pytest.raises(DataError, match=r"^fineweb-edu: unknown tokenizer option 'validation_fraction'"):
        bpe.train_tokenizer("edu", "fineweb-edu", root, vocab_size=300, options={"validation_fraction": 0.1})
    with pytest.raises(TokenizerError, match="--vocab-size"):
        bpe.train_tokenizer("edu", "fineweb-edu", root, vocab_size=10, from_path=src)
    assert train(root, src, limit=10**9) == 2  # all it has read, then the corrupt shard_00002: named, one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shard_file(2)}: not a parquet file or corrupt" in err
    assert not (root / "tokenizers" / "edu").exists()


def test_offline_without_from_is_one_line(tmp_path: Path) -> None:
    # A fresh process, as a user would run it: HF_HUB_OFFLINE is read when huggingface_hub loads.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "download_dataset.py"),
            "tokenizer",
            "edu",
            "fineweb-edu",
            "--vocab-size",
            "300",
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
        f"error: cannot fetch {shard_file(0)} from "
        "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle (offline"
    )
    assert "--from <folder with the .parquet files>" in done.stderr
    assert not (tmp_path / "data" / "tokenizers" / "edu").exists()
