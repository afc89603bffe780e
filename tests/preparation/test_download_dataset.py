"""The builtin corpus, prepare_dataset (build, reuse, rebuild) and the download_dataset CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, SLOW

import download_dataset as dd
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import builtin
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import BytesTokenizer, get_tokenizer
from jaxgpt.preparation import prepare

TIKTOKEN_CACHE = SHARED / "tiktoken-cache"
# Stdlib modules with import side effects: reading their docstrings must not import them.
SIDE_EFFECT_MODULES = ("antigravity", "this", "turtle", "tkinter", "idlelib", "pydoc_data.topics", "smtpd")


def folders(root: Path) -> list[str]:
    """What a data root holds, without the hidden lock files."""
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


class Log(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_builtin_fingerprint_is_remembered_per_stamp(tmp_path: Path, monkeypatch) -> None:
    """A reused built-in dataset is checked without parsing the standard library; the stamp that
    stands for the documents changes when a file they are read from does."""
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path / "cache"))
    truth = builtin.documents_fingerprint(builtin.builtin_documents())
    assert builtin.builtin_fingerprint() == truth  # computed, then remembered
    builtin._builtin_documents.cache_clear()
    assert builtin.builtin_fingerprint() == truth
    assert builtin._builtin_documents.cache_info().misses == 0  # not parsed again
    remembered = json.loads((tmp_path / "cache" / builtin.BUILTIN_FINGERPRINTS).read_text())
    assert list(remembered.values()) == [truth]

    lib = tmp_path / "lib"
    (lib / "pydoc_data").mkdir(parents=True)
    (lib / "pydoc_data" / "topics.py").write_text("topics = {}\n")
    (lib / "mod.py").write_text('"""doc"""\n')
    stamp = builtin.builtin_stamp(lib)
    assert builtin.builtin_stamp(lib) == stamp
    (lib / "mod.py").write_text('"""doc, changed"""\n')
    assert builtin.builtin_stamp(lib) != stamp
    stamp = builtin.builtin_stamp(lib)
    (lib / "pydoc_data" / "topics.py").write_text("topics = {'a': 'b'}\n")
    assert builtin.builtin_stamp(lib) != stamp


@SLOW  # fresh interpreters building the corpus
def test_builtin_documents_deterministic_and_imports_nothing() -> None:
    builtin._builtin_documents.cache_clear()  # really read the files again, not the cached copy
    before = {m for m in SIDE_EFFECT_MODULES if m in sys.modules}
    first = builtin.builtin_documents()
    assert {m for m in SIDE_EFFECT_MODULES if m in sys.modules} == before
    builtin._builtin_documents.cache_clear()
    second = builtin.builtin_documents()
    assert first == second
    assert builtin.documents_fingerprint(first) == builtin.documents_fingerprint(second)

    assert len(first) > 300
    assert sum(len(doc.encode("utf-8")) for doc in first) > 1_000_000
    assert first[0].startswith('The "assert" statement')  # pydoc topics come first, sorted by key
    assert any("Assert statements are a convenient way to insert debugging assertions" in d for d in first)
    json_doc = next(d for d in first if d.startswith("Module json\n"))
    assert "JSON (JavaScript Object Notation)" in json_doc and "json.dumps\n" in json_doc
    headers = [d.split("\n", 1)[0] for d in first if d.startswith("Module ")]
    assert len(set(headers)) == len(headers)  # one document per module, never two
    assert not [h for h in headers if h.startswith("Module test.") or ".tests" in h or "idle_test" in h]


def test_fingerprint_tracks_text_and_boundaries() -> None:
    base = builtin.documents_fingerprint(["ab", "c"])
    version = ".".join(str(v) for v in sys.version_info[:3])
    assert base.startswith(f"python-{version}-")
    assert builtin.documents_fingerprint(["a", "bc"]) != base
    assert builtin.documents_fingerprint(["ab", "d"]) != base


def test_split_documents() -> None:
    docs = [f"doc {i}" for i in range(200)]
    train, val = prepare.split_documents(docs, 0.05)
    assert len(val) == 10 and len(train) == 190
    assert sorted(train + val) == sorted(docs)
    assert (train, val) == prepare.split_documents(docs, 0.05)  # deterministic
    assert val != docs[:10] and val == sorted(val, key=docs.index)  # spread out, original order kept
    with pytest.raises(DataError, match="still train"):
        prepare.split_documents(["only one"], 0.5)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"validation_fraction": 0}, "validation_fraction"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"validation_fraction": True}, "validation_fraction"),
        ({"shuffle": 1}, "unknown option"),
    ],
)
def test_bad_options(options: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        prepare.resolve_options("builtin", options)


def test_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="'wikipedia'"):
        prepare.prepare_dataset("wikipedia", "bytes", tmp_path)


def test_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert prepare.dataset_dir(tmp_path, "builtin", "gpt2") == tmp_path / "builtin-gpt2"
    monkeypatch.setenv("JAXGPT_DATA_DIR", str(tmp_path))
    assert prepare.default_data_root() == tmp_path
    monkeypatch.delenv("JAXGPT_DATA_DIR")
    assert prepare.default_data_root() == Path(dd.__file__).resolve().parent / "data"


def test_prepare_builds_the_corpus(tmp_path: Path) -> None:
    log = Log()
    path = prepare.prepare_dataset("builtin", "bytes", tmp_path, log=log)
    assert path == tmp_path / "builtin-bytes" and "preparing" in log[0] and "wrote" in log[-1]
    ds = open_dataset(path, verify=True)
    docs = builtin.builtin_documents()
    train_docs, val_docs = prepare.split_documents(docs, 0.05)
    meta = ds.manifest
    assert meta["options"] == {"validation_fraction": 0.05}
    assert meta["fingerprint"] == builtin.documents_fingerprint(docs)
    assert meta["splits"]["val"]["documents"] == len(val_docs) and len(val_docs) == round(0.05 * len(docs))
    # Every document is its UTF-8 bytes followed by one end-of-text token, in order.
    expected = np.concatenate(
        [np.frombuffer(d.encode("utf-8"), np.uint8).astype(np.int32).tolist() + [256] for d in val_docs[:3]]
    )
    np.testing.assert_array_equal(ds.val.read(0, expected.size), expected)
    assert ds.train.n_tokens == sum(len(d.encode("utf-8")) + 1 for d in train_docs)
    first = ds.train.read(0, len(train_docs[0].encode("utf-8")) + 1)
    assert first[-1] == 256 and BytesTokenizer().decode(first) == train_docs[0]
    assert folders(tmp_path) == ["builtin-bytes"]


def test_prepare_reuses_then_rebuilds(tmp_path: Path) -> None:
    path = prepare.prepare_dataset("builtin", "bytes", tmp_path, log=Log())
    stamp = (path / "manifest.json").stat().st_mtime_ns, (path / "train-00000.safetensors").stat().st_mtime_ns

    log = Log()
    assert prepare.prepare_dataset("builtin", "bytes", tmp_path, options={"validation_fraction": 0.05}, log=log) == path
    assert log == [f"reusing dataset {path} (manifest matches)"]
    assert ((path / "manifest.json").stat().st_mtime_ns, (path / "train-00000.safetensors").stat().st_mtime_ns) == stamp

    log = Log()
    prepare.prepare_dataset("builtin", "bytes", tmp_path, options={"validation_fraction": 0.1}, log=log)
    assert "options changed" in log[0]
    assert open_dataset(path).manifest["options"] == {"validation_fraction": 0.1}
    assert folders(tmp_path) == ["builtin-bytes"]  # old folder removed

    # A damaged folder (here a truncated shard) is never taken for complete: it is rebuilt.
    shard = path / "val-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    log = Log()
    prepare.prepare_dataset("builtin", "bytes", tmp_path, options={"validation_fraction": 0.1}, log=log)
    assert "truncated" in log[0] and "val-00000.safetensors" in log[0]
    open_dataset(path, verify=True)

    # So is a folder without manifest.json, e.g. one left by a copy that was interrupted.
    (path / "manifest.json").unlink()
    log = Log()
    prepare.prepare_dataset("builtin", "bytes", tmp_path, options={"validation_fraction": 0.1}, log=log)
    assert "missing" in log[0]
    open_dataset(path)


def test_prepare_gpt2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not TIKTOKEN_CACHE.is_dir():
        pytest.skip(f"no tiktoken cache at {TIKTOKEN_CACHE} (the gpt2 files cannot be fetched offline)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE.resolve()))
    path = prepare.prepare_dataset("builtin", "gpt2", tmp_path, log=Log())
    ds = open_dataset(path)
    assert (ds.tokenizer, ds.vocab_size, ds.eot_id, ds.manifest["dtype"]) == ("gpt2", 50257, 50256, "uint16")
    tok = get_tokenizer("gpt2")
    train_docs, _ = prepare.split_documents(builtin.builtin_documents(), 0.05)
    ids = tok.encode(train_docs[0])
    np.testing.assert_array_equal(ds.train.read(0, len(ids) + 1), ids + [50256])
    n_bytes = open_dataset(prepare.prepare_dataset("builtin", "bytes", tmp_path, log=Log())).train.n_tokens
    assert 0.15 < ds.train.n_tokens / n_bytes < 0.5  # BPE packs ~3-4 bytes of English per token


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dd.main(["builtin", "--data-dir", str(tmp_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "verified" in out
    assert dd.main(["builtin", "--data-dir", str(tmp_path)]) == 0
    assert "reusing" in capsys.readouterr().out

    assert dd.main(["builtin", "--data-dir", str(tmp_path), "--validation-fraction", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: builtin: validation_fraction") and err.count("\n") == 1

    with pytest.raises(SystemExit) as info:
        dd.main(["--help"])
    assert info.value.code == 0 and "--tokenizer" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        dd.main(["nosuchsource"])
    assert info.value.code == 2


def test_cli_gpt2_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tiktoken = pytest.importorskip("tiktoken")

    def offline(name: str):
        raise OSError("Failed to resolve host")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    assert dd.main(["builtin", "--tokenizer", "gpt2", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: gpt2 tokenizer:") and "TIKTOKEN_CACHE_DIR" in err and err.count("\n") == 1
    assert not (tmp_path / "builtin-gpt2").exists()


@pytest.mark.parametrize(
    "source, options, match",
    [
        ("text", {}, "text: option 'paths' must be a non-empty list"),
        ("text", {"paths": []}, "option 'paths' must be"),
        ("text", {"paths": ["a"], "name": "../up"}, "text: option 'name' must be"),
        ("text", {"paths": ["a"], "validation_fraction": 0}, "validation_fraction"),
        ("tinyshakespeare", {"paths": ["a"]}, "unknown option"),
        ("fineweb10B-gpt2", {"train_shards": 104}, "train_shards must be null or 1..103"),
        ("fineweb10B-gpt2", {"train_shards": True}, "train_shards"),
        ("fineweb10B-gpt2", {"validation_fraction": 0.1}, "unknown option"),
        ("fineweb-edu", {"train_shards": 1823}, "fineweb-edu: train_shards must be null or 1..1822, got 1823"),
        ("fineweb-edu", {"text_column": "body"}, "unknown option"),
    ],
)
def test_bad_source_options(source: str, options: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        prepare.resolve_options(source, options)


def test_resolved_text_options() -> None:
    resolved = prepare.resolve_options("text", {"paths": "corpus/"})
    assert resolved == {"paths": ["corpus"], "name": "corpus", "validation_fraction": 0.05, "text_column": "text"}
    assert prepare.dataset_dir(Path("/d"), "text", "gpt2", resolved["name"]) == Path("/d/text-corpus-gpt2")


def test_from_only_for_downloadable_sources(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--from applies only to tinyshakespeare, fineweb10B-gpt2 and fineweb-edu$"):
        prepare.prepare_dataset("builtin", "bytes", tmp_path, from_path=tmp_path)


def test_cli_text_and_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "my corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.md").write_text(f"Document {i}.\n" * 20)
    data = tmp_path / "data"
    assert dd.main(["text", str(corpus), "--data-dir", str(data), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "text-my-corpus-bytes" in out and "verified" in out
    assert dd.main(["text", str(corpus / "none"), "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {corpus / 'none'}: no such file or folder\n"
    # `run` prepares what a run's train.json names, with the same options: the folder is reused.
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.json").write_text(
        json.dumps({"architecture": "gpt2", "vocab_size": 257, "context_length": 8, "emb_dim": 8, "n_layers": 1})
    )
    (run / "train.json").write_text(
        json.dumps(
            {"dataset": {"source": "text", "options": {"paths": [str(corpus)]}}, "microbatch_size": 2, "train_steps": 1}
        )
    )
    assert dd.main(["run", str(run), "--data-dir", str(data)]) == 0
    assert "reusing dataset" in capsys.readouterr().out
    (run / "train.json").write_text("{")
    assert dd.main(["run", str(run), "--data-dir", str(data)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run / 'train.json'}: malformed JSON")
