"""Local text and Tiny Shakespeare: file discovery, documents, validation split, round trips, downloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

import download_dataset as dd
from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.windows import BatchSampler
from jaxgpt.data.sources import files as sources
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import BytesTokenizer, get_tokenizer
from jaxgpt.preparation import prepare

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"


def log_to(lines: list[str]):
    return lines.append


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A folder of every supported kind, plus files that must be ignored."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.txt").write_text("Alpha document.\nSecond line.\n")
    (root / "sub" / "b.md").write_bytes("\ufeff# Beta\n\nMarkdown é.\n".encode())  # BOM dropped
    records = [{"text": f"record {i}: " + "word " * i} for i in range(30)]
    lines = [json.dumps(r) for r in records[:10]] + ["", json.dumps({"text": ""})]  # blank, empty: skipped
    lines += [json.dumps(r) for r in records[10:]]
    (root / "c.jsonl").write_text("\n".join(lines) + "\n")
    (root / ".git" / "config.txt").write_text("hidden: never read")
    (root / "notes.rst").write_text("not a supported kind")
    return root


def expected_documents() -> list[str]:
    return (
        ["Alpha document.\nSecond line.\n"]
        + [f"record {i}: " + "word " * i for i in range(30)]
        + ["# Beta\n\nMarkdown é.\n"]
    )


# ----------------------------------------------------------------------------- files and documents


def test_find_and_read(corpus: Path) -> None:
    files = sources.find_text_files([str(corpus)])
    assert [f.relative_to(corpus).as_posix() for f in files] == ["a.txt", "c.jsonl", "sub/b.md"]
    assert list(sources.read_documents(files)) == expected_documents()
    # Globs, explicit files and repeats: each file once, in the order first named.
    again = sources.find_text_files([str(corpus / "sub" / "*.md"), str(corpus / "**" / "*.txt"), str(corpus)])
    assert [f.name for f in again] == ["b.md", "a.txt", "c.jsonl"]
    assert sources.default_name([str(corpus)]) == "corpus"
    assert sources.default_name([str(corpus / "**" / "*.txt")]) == "corpus"
    assert sources.default_name([str(corpus / "a.txt")]) == "a-txt"  # a.parquet beside it: a-parquet


@pytest.mark.parametrize(
    "make, pattern, match",
    [
        (lambda r: None, "missing", "missing: no such file or folder"),
        (lambda r: None, "notes.rst", r"notes\.rst: unsupported file type '\.rst'"),
        (lambda r: None, "*.zip", r"\*\.zip: matches no"),
        (lambda r: (r / "empty").mkdir(), "empty", "empty: folder holds no"),
    ],
)
def test_find_errors(corpus: Path, make, pattern: str, match: str) -> None:
    make(corpus)
    with pytest.raises(DataError, match=match):
        sources.find_text_files([str(corpus / pattern)])


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("bad.jsonl", b'{"text": "ok"}\n{"text": 3}\n', r"bad\.jsonl:2: expected an object with a string 'text'"),
        ("bad.jsonl", b'{"text": "ok"}\n\n{oops\n', r"bad\.jsonl:3: malformed JSON"),
        ("bad.jsonl", b'["text"]\n', r"bad\.jsonl:1: expected an object"),
        ("latin1.txt", "caf\u00e9".encode("latin-1"), r"latin1\.txt: not UTF-8 \(byte 3"),
    ],
)
def test_bad_documents_name_the_file(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=match) as info:
        list(sources.read_documents([tmp_path / name]))
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- validation split


def test_hold_out_by_document() -> None:
    docs = [f"doc {i}\n" for i in range(40)]
    train, val, how = sources.hold_out(lambda: iter(docs), 0.1)
    train, val = list(train), list(val)
    assert (len(train), len(val), how) == (36, 4, "4 of 40 documents")
    assert sorted(train + val) == sorted(docs)
    assert train == sorted(train, key=docs.index) and val == sorted(val, key=docs.index)  # order kept
    assert val != docs[-4:]  # spread over the corpus, not its end
    # The same seeded choice as the builtin corpus's split_documents.
    assert (train, val) == tuple(prepare.split_documents(docs, 0.1))


def test_hold_out_tail_for_few_documents() -> None:
    text = "".join(f"line {i}\n" for i in range(100))  # one document, like Tiny Shakespeare
    train, val, how = sources.hold_out(lambda: iter([text]), 0.1)
    train, val = list(train), list(val)
    assert "".join(train + val) == text and how == "the last 10% of the text of 1 document(s)"
    assert train[0].endswith("\n") and val[0].startswith("line ")  # cut after a newline
    assert abs(len(val[0]) / len(text) - 0.1) < 0.02
    # Two documents: the cut falls in the second; the first stays whole in train.
    train, val = sources.split_tail(["a" * 50 + "\n", "b\n" * 25], 0.2)
    assert train == ["a" * 50 + "\n", "b\n" * 16] and val == ["b\n" * 9]  # 101 chars: keep 81, to a newline
    # One long line: cut inside it rather than give up.
    train, val = sources.split_tail(["x" * 100], 0.1)
    assert (len(train[0]), len(val[0])) == (90, 10)
    with pytest.raises(DataError, match="tiny: cannot hold out"):
        sources.split_tail(["abc"], 0.1, "tiny")
    with pytest.raises(DataError, match="empty: no text"):
        sources.hold_out(lambda: iter([]), 0.1, "empty")


@pytest.mark.parametrize(
    "docs",
    [[f"doc {i}\n" for i in range(40)], ["".join(f"line {i}\n" for i in range(100))]],
    ids=["by-document", "tail"],
)
def test_hold_out_routed_is_hold_out_in_one_stream(docs: list[str]) -> None:
    """One read for both splits (what preparing uses): the same documents as hold_out's two, in corpus order."""
    reads = []

    def documents():
        reads.append(1)
        return iter(docs)

    train, val, how = sources.hold_out(documents, 0.1)
    train, val = list(train), list(val)
    reads.clear()
    routed, routed_how = sources.hold_out_routed(documents, 0.1)
    pairs = list(routed)
    assert routed_how == how and len(reads) == 2  # count, then one read for both splits (hold_out: one each)
    assert [d for held, d in pairs if not held] == train and [d for held, d in pairs if held] == val
    if len(docs) > 1:
        assert [d for _, d in pairs] == docs  # corpus order: the writer routes each document as it comes


def test_hold_out_routed_notices_a_changed_corpus() -> None:
    sizes = iter([10, 11])
    routed, _ = sources.hold_out_routed(lambda: iter([f"d{i}" for i in range(next(sizes))]), 0.2)
    with pytest.raises(DataError, match="corpus changed while it was being prepared \\(10 documents, then 11\\)"):
        list(routed)


# ----------------------------------------------------------------------------- text source end to end


def test_text_round_trip_to_batches(corpus: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    # Many small shards: windows cross shard boundaries.
    path = prepare.prepare_dataset(
        "text", "bytes", tmp_path / "data", options={"paths": [str(corpus)]}, log=log_to(lines), shard_tokens=64
    )
    assert path == tmp_path / "data" / "text-corpus-bytes"
    assert "validation = 2 of 32 documents" in lines[-1]
    ds = open_dataset(path, verify=True)
    assert len(ds.train.shards) > 10 and ds.manifest["options"]["paths"] == [str(corpus)]
    train_docs, val_docs = prepare.split_documents(expected_documents(), 0.05)  # same seeded choice
    tok = BytesTokenizer()
    source = "".join(doc + "\0" for doc in train_docs)  # "\0" stands for end-of-text below
    tokens = ds.train.read(0, ds.train.n_tokens)
    assert tok.decode(tokens) == source.replace("\0", "")
    assert np.count_nonzero(tokens == 256) == len(train_docs) == ds.manifest["splits"]["train"]["documents"]
    assert tok.decode(ds.val.read(0, ds.val.n_tokens)) == "".join(val_docs)
    # Every sequence of every batch is one of the source's windows (w*T .. w*T+T, end-of-text as "\0"),
    # its targets the same text one byte on.
    T, B = 16, 4
    sampler = BatchSampler(ds.train, microbatch_size=B, seq_len=T, seed=3)
    text = source.encode()
    windows: dict[bytes, list[int]] = {}
    for w in range(sampler.n_windows):
        windows.setdefault(text[w * T : (w + 1) * T], []).append(w)

    def as_bytes(row: np.ndarray) -> bytes:
        return bytes(np.where(row == 256, 0, row).astype(np.uint8))

    for step in range(sampler.n_windows // (2 * B)):
        x, y = sampler.batch(step, 2)[:2]
        for xs, ys in zip(x.reshape(-1, T), y.reshape(-1, T)):
            assert any(text[w * T + 1 : (w + 1) * T + 1] == as_bytes(ys) for w in windows[as_bytes(xs)])


def test_text_reuse_rebuild_and_name(corpus: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    options = {"paths": [str(corpus) + "/"]}
    path = prepare.prepare_dataset("text", "bytes", root, options=options, log=log_to([]))
    lines: list[str] = []
    # "corpus/" and "corpus" are the same folder: reused, not rebuilt.
    assert prepare.prepare_dataset("text", "bytes", root, options={"paths": [str(corpus)]}, log=log_to(lines)) == path
    assert lines == [f"reusing dataset {path} (manifest matches)"]
    (corpus / "a.txt").write_text("Alpha, edited.\n")  # size and mtime change -> fingerprint changes
    lines = []
    prepare.prepare_dataset("text", "bytes", root, options=options, log=log_to(lines))
    assert "fingerprint changed" in lines[0]
    named = prepare.prepare_dataset(
        "text", "bytes", root, options={"paths": [str(corpus / "a.txt")], "name": "mine"}, log=log_to([])
    )
    assert named.name == "text-mine-bytes"
    assert BytesTokenizer().decode(open_dataset(named).train.read(0, 10)) == "Alpha, edi"  # the tail is val


def test_text_gpt2_through_tiktoken_cache(tmp_path: Path) -> None:
    try:
        get_tokenizer("gpt2")
    except ValueError:
        pytest.skip("no tiktoken cache for gpt2 (set TIKTOKEN_CACHE_DIR; ../shared/tiktoken-cache in CI)")
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": "Every effort moves you"}) + "\n" for _ in range(20))
    )
    path = prepare.prepare_dataset(
        "text", "gpt2", tmp_path / "data", options={"paths": [str(tmp_path / "docs.jsonl")]}, log=log_to([])
    )
    ds = open_dataset(path)
    assert (ds.tokenizer, ds.vocab_size, ds.eot_id) == ("gpt2", 50257, 50256)
    assert ds.train.read(0, ds.train.n_tokens).tolist() == [6109, 3626, 6100, 345, 50256] * 19
    assert ds.val.read(0, ds.val.n_tokens).tolist() == [6109, 3626, 6100, 345, 50256]


# ----------------------------------------------------------------------------- Tiny Shakespeare


def test_tinyshakespeare_split_is_nanogpts_cut_byte_for_byte(tmp_path: Path, no_network: None) -> None:
    """The same on a stand-in file (runs without the shared copy): the pinned hash is the stand-in's."""
    text = "".join(f"Line {i}: {'to be or not ' * (i % 7)}\n" for i in range(997))
    (tmp_path / "input.txt").write_text(text)
    stand_in = sources.RemoteFile(
        "tinyshakespeare.txt", sources.TINYSHAKESPEARE.url, len(text), sources.sha256(tmp_path / "input.txt")
    )
    ds = open_dataset(
        prepare.prepare_dataset(
            "tinyshakespeare",
            "bytes",
            tmp_path,
            from_path=tmp_path / "input.txt",
            log=log_to([]),
            tinyshakespeare=stand_in,
        )
    )
    n = len(text)
    assert int(n * 0.9) != n - round(0.1 * n) or text[int(n * 0.9) - 1] != "\n"  # a cut a newline rule would move
    assert ds.train.read(0, ds.train.n_tokens).astype(np.uint8).tobytes() == text[: int(n * 0.9)].encode()
    assert ds.val.read(0, ds.val.n_tokens).astype(np.uint8).tobytes() == text[int(n * 0.9) :].encode()
    assert sources.nanogpt_split(text, 0.1) == (text[: int(n * 0.9)], text[int(n * 0.9) :])
    with pytest.raises(DataError, match="option 'split' must be one of 'nanogpt', 'newline', got 'lines'"):
        prepare.prepare_dataset("tinyshakespeare", "bytes", tmp_path, options={"split": "lines"})


def test_tinyshakespeare_offline_is_one_line(
    tmp_path: Path, no_network: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dd.main(["tinyshakespeare", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot download {sources.TINYSHAKESPEARE.url} (")
    assert str(tmp_path / "downloads" / "tinyshakespeare.txt") in err and "--from" in err
    assert not (tmp_path / "tinyshakespeare-bytes").exists()
    assert list((tmp_path / "downloads").iterdir()) == []  # no partial download left


def test_tinyshakespeare_rejects_a_wrong_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "input.txt").write_text("To be, or not to be\n")
    assert dd.main(["tinyshakespeare", "--data-dir", str(tmp_path), "--from", str(tmp_path / "input.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input.txt: not the expected tinyshakespeare.txt" in err and "86c4e6aa" in err
    assert dd.main(["tinyshakespeare", "--data-dir", str(tmp_path), "--from", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt: --from file not found" in capsys.readouterr().err


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no offline copy at {SHAKESPEARE}")
def test_tinyshakespeare_from_local_copy(tmp_path: Path, no_network: None) -> None:
    lines: list[str] = []
    path = prepare.prepare_dataset("tinyshakespeare", "bytes", tmp_path, from_path=SHAKESPEARE, log=log_to(lines))
    ds = open_dataset(path, verify=True)
    text = SHAKESPEARE.read_text()
    tok = BytesTokenizer()
    # nanoGPT's data/shakespeare_char/prepare.py, cut for cut: the splits are these characters
    # (ASCII: one byte each), with no end-of-text anywhere.
    with open(SHAKESPEARE) as f:
        data = f.read()
    n = len(data)
    train_data, val_data = data[: int(n * 0.9)], data[int(n * 0.9) :]
    assert (len(train_data), len(val_data)) == (1_003_854, 111_540)
    assert ds.train.read(0, ds.train.n_tokens).astype(np.uint8).tobytes() == train_data.encode("ascii")
    assert ds.val.read(0, ds.val.n_tokens).astype(np.uint8).tobytes() == val_data.encode("ascii")
    assert ds.train.n_tokens == 1_003_854 and ds.val.n_tokens == 111_540  # nothing else (no end-of-text)
    assert ds.manifest["fingerprint"] == f"sha256-{sources.TINYSHAKESPEARE.sha256}"
    assert ds.manifest["options"] == {"validation_fraction": 0.1, "split": "nanogpt"}
    # The older cut, still an option: moved to the next newline, end-of-text after each part.
    old = open_dataset(
        prepare.prepare_dataset(
            "tinyshakespeare",
            "bytes",
            tmp_path / "old",
            from_path=SHAKESPEARE,
            options={"split": "newline"},
            log=log_to([]),
        )
    )
    train, val = tok.decode(old.train.read(0, old.train.n_tokens)), tok.decode(old.val.read(0, old.val.n_tokens))
    assert train + val == text and train.endswith("\n") and len(train) != len(train_data)
    assert old.val.read(old.val.n_tokens - 1, 1)[0] == tok.eot_id
    # Later calls need neither --from nor the network: reused, or rebuilt from the kept copy.
    lines = []
    prepare.prepare_dataset("tinyshakespeare", "bytes", tmp_path, log=log_to(lines))
    assert lines == [f"reusing dataset {path} (manifest matches)"]
    prepare.prepare_dataset("tinyshakespeare", "bytes", tmp_path, options={"validation_fraction": 0.2}, log=log_to([]))
    assert open_dataset(path).val.n_tokens > 0.19 * len(text)
    assert os.stat(tmp_path / "downloads" / "tinyshakespeare.txt").st_size == 1_115_394
