"""Tokenizing on every core (jaxgpt/data/encode.py): the same shards as a single-threaded reference
written here, documents in order whatever finishes first, errors in the caller, no threads left."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SHARED
from safetensors.numpy import save_file

from jaxgpt.data import encode
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import builtin
from jaxgpt.data.sources import files as sources
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import BytesTokenizer
from jaxgpt.preparation import prepare

TIKTOKEN_CACHE = SHARED / "tiktoken-cache"


@pytest.fixture
def tiktoken_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    if not TIKTOKEN_CACHE.is_dir():
        pytest.skip(f"no tiktoken cache at {TIKTOKEN_CACHE} (the gpt2 files cannot be fetched offline)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE.resolve()))


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tokenize")]


def prose(n: int, seed: int) -> list[str]:
    """n documents of 1 to ~40 built-in paragraphs each (a few bytes to ~20 KB): English prose and code."""
    paragraphs = [p for doc in builtin.builtin_documents()[:60] for p in doc.split("\n\n") if p.strip()]
    rng = random.Random(seed)
    return ["\n\n".join(rng.sample(paragraphs, rng.choice([1, 2, 5, 10, 40]))) for _ in range(n)]


def write_corpus(folder: Path, gpt2: bool) -> None:
    """A folder of a .jsonl (blank lines and empty records among the documents) and a .txt file."""
    docs = prose(300, seed=1)
    docs[7] = "<|endoftext|> stays text, never the end-of-text id"
    docs[11] = "héllo wörld, 日本語 🙂, ∑ x² " * 50
    if gpt2:  # a lone surrogate (JSON "\ud800"): tiktoken's own repair; the bytes tokenizer cannot encode it
        docs[13] = "half a pair: \ud800 then text"
    lines = [json.dumps({"text": doc}) for doc in docs]
    lines[20:20] = ["", json.dumps({"text": ""}), "   "]
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "b.txt").write_text(prose(1, seed=2)[0])


def reference_shards(folder: Path, tokenizer: str, fraction: float, shard_tokens: int) -> dict[str, list[np.ndarray]]:
    """The documented preparation, straight and single-threaded: documents in file order (empty ones
    skipped), the seeded hold-out, tiktoken's encode_ordinary (or the UTF-8 bytes) + end-of-text
    per document, each split concatenated and cut every shard_tokens tokens."""
    docs = [
        text
        for line in (folder / "a.jsonl").read_text().splitlines()
        if line.strip() and (text := json.loads(line)["text"])
    ] + [(folder / "b.txt").read_text("utf-8")]
    if tokenizer == "gpt2":
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
        ids, eot = [enc.encode_ordinary(doc) for doc in docs], 50256
    else:
        ids, eot = [list(doc.encode("utf-8")) for doc in docs], 256
    n = len(docs)
    held_out = set(np.random.default_rng(0).permutation(n)[: round(fraction * n)].tolist())
    splits = {}
    for split, want in (("train", False), ("val", True)):
        flat = np.array([t for i in range(n) if (i in held_out) == want for t in ids[i] + [eot]], dtype=np.uint16)
        splits[split] = [flat[i : i + shard_tokens] for i in range(0, flat.size, shard_tokens)]
    return splits


@pytest.mark.parametrize(
    "tokenizer, reads",
    [("bytes", 1), ("bytes", 2), ("gpt2", 1), ("gpt2", 2)],
    ids=["bytes-one-read", "bytes-count-then-read", "gpt2-one-read", "gpt2-count-then-read"],
)
def test_prepared_shards_are_byte_identical_to_a_single_threaded_reference(
    tokenizer: str, reads: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Both ways of reading a corpus: a small one tokenized while it is counted (one read), a
    larger one counted first and read again for both splits."""
    if tokenizer == "gpt2":
        request.getfixturevalue("tiktoken_cache")
    write_corpus(tmp_path / "corpus", gpt2=tokenizer == "gpt2")
    # Small chunks on 4 threads (whatever this machine has), several shards per split cut inside
    # documents: the order, the routing of each document to its split and the cuts are all exercised.
    shard_tokens = 5_000 if tokenizer == "gpt2" else 20_000
    calls = []
    read_documents = sources.read_documents
    monkeypatch.setattr(sources, "read_documents", lambda files, *args: calls.append(1) or read_documents(files, *args))
    path = prepare.prepare_dataset(
        "text",
        tokenizer,
        tmp_path / "data",
        options={"paths": [str(tmp_path / "corpus")], "validation_fraction": 0.1},
        log=lambda _msg: None,
        chunk_bytes=2048,
        workers=4,
        shard_tokens=shard_tokens,
        one_read_bytes=10**9 if reads == 1 else 1000,
    )
    assert len(calls) == reads
    expected = reference_shards(tmp_path / "corpus", tokenizer, 0.1, shard_tokens)
    manifest = open_dataset(path, verify=True).manifest
    for split, shards in expected.items():
        assert len(shards) >= 2, split  # the cut happens in both splits
        entries = manifest["splits"][split]["shards"]
        assert [e["tokens"] for e in entries] == [s.size for s in shards]
        for i, (entry, shard) in enumerate(zip(entries, shards)):
            # The very bytes safetensors writes for the reference tokens: format, header and data.
            save_file({"tokens": shard}, str(tmp_path / f"ref-{split}-{i}"))
            assert (path / entry["file"]).read_bytes() == (tmp_path / f"ref-{split}-{i}").read_bytes(), entry["file"]
    assert manifest["splits"]["val"]["documents"] == 30 and manifest["splits"]["train"]["documents"] == 271
    assert not pool_threads()


class FirstChunkLast(BytesTokenizer):
    """The bytes tokenizer whose first chunk (documents 0-2) waits until the fourth (9-11) is done."""

    def __init__(self) -> None:
        self.fourth_done = threading.Event()
        self.order: list[int] = []

    def encode_batch(self, texts):
        first = int(texts[0].split()[0])
        if first == 0:
            assert self.fourth_done.wait(timeout=60), "the fourth chunk never ran beside the first"
        out = super().encode_batch(texts)
        self.order.append(first)
        if first == 9:
            self.fourth_done.set()
        return out


def test_documents_come_back_in_order_whatever_finishes_first() -> None:
    docs = [f"{i} document number {i} " + "é" * (i % 7) for i in range(40)]
    one = list(encode.encode_documents(BytesTokenizer(), docs, workers=1, chunk_documents=3))
    late = FirstChunkLast()
    four = list(encode.encode_documents(late, docs, workers=4, chunk_documents=3))
    assert late.order.index(0) > late.order.index(9)  # the first chunk really finished after a later one
    assert len(one) == len(four) == 40
    for doc, a, b in zip(docs, one, four):
        assert a.dtype == b.dtype == np.uint16
        assert a.tolist() == b.tolist() == list(doc.encode()) + [256]
    no_eot = list(encode.encode_documents(BytesTokenizer(), docs, eot=False, workers=2, chunk_documents=3))
    assert [a.tolist() for a in no_eot] == [list(doc.encode()) for doc in docs]
    assert not pool_threads()


class FailsOn(BytesTokenizer):
    def __init__(self, bad: str) -> None:
        self.bad = bad

    def encode_batch(self, texts):
        if self.bad in texts:
            raise ValueError(f"cannot encode {self.bad!r}")
        return super().encode_batch(texts)


def test_a_tokenizer_error_reaches_the_caller_and_stops_every_thread() -> None:
    docs = [f"doc {i}" for i in range(200)]
    seen = []
    with pytest.raises(ValueError, match="cannot encode 'doc 57'"):
        seen.extend(encode.encode_documents(FailsOn("doc 57"), docs, workers=3, chunk_documents=2))
    assert len(seen) == 56  # every document before the failing chunk, in order
    assert not pool_threads()
    # A consumer that stops early (a writer's error) ends the pool too.
    stream = encode.encode_documents(BytesTokenizer(), docs, workers=3, chunk_documents=2)
    next(stream)
    stream.close()
    assert not pool_threads()


def test_a_malformed_line_mid_corpus_is_the_usual_one_line_error(tmp_path: Path) -> None:
    """Read errors come from the reader, in the caller's thread, as without threads: file:line, nothing written."""
    lines = [json.dumps({"text": doc}) for doc in prose(200, seed=3)]
    lines[150] = '{"text": "cut off'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:151: malformed JSON"):
        prepare.prepare_dataset(
            "text",
            "bytes",
            tmp_path / "data",
            options={"paths": [str(tmp_path / "bad.jsonl")]},
            log=lambda _msg: None,
            chunk_bytes=512,
        )
    assert not pool_threads()
    assert not (tmp_path / "data").exists() or not any(p.is_dir() for p in (tmp_path / "data").iterdir())


def test_progress_reports_bytes_and_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    progress = encode.Progress("tokenizing test", enabled=True)
    docs = ["héllo " * 1000, "plain ascii " * 500]
    out = list(encode.encode_documents(BytesTokenizer(), docs, workers=2, progress=progress))
    progress.close()
    assert progress.tokens == sum(a.size for a in out) == 7000 + 6000 + 2
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert bar.startswith("tokenizing test: 13.0kB") and "13,002 tokens" in bar and "tokens/s" in bar, bar
    assert encode.text_bytes("héllo") == 6 and encode.text_bytes("hello") == 5
    quiet = encode.Progress("not a terminal")  # capsys's stderr, as a log file or a pipe: no bar, no tqdm
    quiet.update(10, 5)
    quiet.close()
    assert quiet.bar is None and quiet.tokens == 5 and capsys.readouterr().err == ""


def read_position(pid: int, path: Path) -> int:
    """How far process `pid` has read the file at `path` (Linux /proc), 0 while it has it closed."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if Path(os.readlink(fd)) == path:
                return int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split()[1])  # "pos: N"
        except OSError:  # closed meanwhile
            continue
    return 0


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="reads the process's file position in /proc")
@pytest.mark.parametrize("one_read", [True, False], ids=["one-read", "count-then-read"])
def test_ctrl_c_while_tokenizing_exits_and_leaves_nothing(one_read: bool, tmp_path: Path, tiktoken_cache: None) -> None:
    """SIGINT to download_dataset.py in the middle of tokenizing: it exits at once with a one-line
    message, no dataset and no temporary folder left behind, whichever way it reads the corpus."""
    paragraphs = "\n\n".join(prose(50, seed=4))
    size = 40_000_000 if one_read else prepare.ONE_READ_BYTES + 10_000_000  # seconds of BPE even on many cores
    with open(tmp_path / "big.jsonl", "w") as f:
        f.writelines(json.dumps({"text": f"{i} {paragraphs}"}) + "\n" for i in range(max(1, size // len(paragraphs))))
    data = tmp_path / "data"
    # A shell's background job (CI started with `&`) ignores SIGINT, and Python then installs no
    # KeyboardInterrupt handler: the child gives Ctrl-C its usual meaning before it runs the command.
    ctrl_c = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-c",
            ctrl_c,
            str(ROOT / "download_dataset.py"),
            "text",
            str(tmp_path / "big.jsonl"),
            "--tokenizer",
            "gpt2",
            "--data-dir",
            str(data),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        # One read: the file is read as it is tokenized (a few MB ahead at most), so a read position
        # past the first MB and short of the end is the middle of tokenizing. Counted first: the
        # temporary folder exists while both splits are tokenized and written.
        while not (
            1_000_000 < read_position(proc.pid, tmp_path / "big.jsonl") < size // 2
            if one_read
            else list(data.glob("text-big-jsonl-gpt2.tmp-*"))
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "never started tokenizing"
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "interrupted: no half-written dataset was kept (run the command again to prepare it)"
    ], err
    assert sorted(p.name for p in data.iterdir()) == [".text-big-jsonl-gpt2.lock"]
