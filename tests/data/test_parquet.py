"""Parquet files in the `text` source: documents per row group, the same hold-out and shards as JSONL,
one-line errors for bad files, and a parquet corpus prepared, trained on and evaluated end to end.

The parquet files are written here with pyarrow; nothing touches the network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SLOW, write_run

import download_dataset as dd
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import files as sources
from jaxgpt.data.sources.parquet import parquet_documents
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.preparation import prepare

ROWS_PER_GROUP = 25


def documents(n: int = 120) -> list[str]:
    """Varied documents: several lines, non-ASCII, a literal end-of-text string that must stay text."""
    return [
        f"doc {i}: " + "naïve café " * (i % 7) + "\nsecond line\n" + ("<|endoftext|>" if i % 31 == 0 else "")
        for i in range(n)
    ]


def write_parquet(path: Path, column: dict[str, list], *, rows_per_group: int = ROWS_PER_GROUP, **extra: list) -> Path:
    pq.write_table(pa.table({**column, **extra}), path, row_group_size=rows_per_group)
    return path


def with_gaps(docs: list[str]) -> list[str | None]:
    """docs with a null and an empty string after every 10th: rows that are no document."""
    out: list[str | None] = []
    for i, doc in enumerate(docs):
        out.append(doc)
        if i % 10 == 0:
            out += [None, ""]
    return out


def log_to(lines: list[str]):
    return lines.append


# ----------------------------------------------------------------------------- reading


def test_documents_read_equal_written_nulls_and_empties_skipped(tmp_path: Path) -> None:
    docs = documents()
    path = write_parquet(tmp_path / "a.parquet", {"text": with_gaps(docs)}, id=list(range(len(with_gaps(docs)))))
    assert pq.ParquetFile(path).num_row_groups == 6  # several row groups, read one at a time
    assert list(parquet_documents(path, "text")) == docs
    # large_string columns and another column name (text_column)
    table = pa.table({"body": pa.array(docs, type=pa.large_string())})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=50)
    assert list(parquet_documents(tmp_path / "b.parquet", "body")) == docs
    # discovery: .parquet files are text files beside .txt/.md/.jsonl; read in order with the others
    (tmp_path / "c.txt").write_text("plain text\n")
    files = sources.find_text_files([str(tmp_path)])
    assert [f.name for f in files] == ["a.parquet", "b.parquet", "c.txt"]
    assert list(sources.read_documents(files[:1] + files[2:])) == docs + ["plain text\n"]


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite bytes in the middle of one row group's compressed column chunk (snappy fails on them)."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    middle = start + chunk.total_compressed_size // 2
    data[middle : middle + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


def test_streams_row_group_by_row_group(tmp_path: Path) -> None:
    """A damaged third row group is found only when reading gets there: the first two row groups'
    documents came out before it (the file is never read whole), and the error names the group."""
    docs = [f"document {i} " + "word " * (i % 50) for i in range(100)]
    path = write_parquet(tmp_path / "big.parquet", {"text": docs})
    corrupt_row_group(path, 2)
    seen: list[str] = []
    with pytest.raises(DataError) as err:
        for doc in parquet_documents(path, "text"):  # one at a time: what came before the error is kept
            seen.append(doc)  # noqa: PERF402
    assert seen == docs[: 2 * ROWS_PER_GROUP]
    assert str(err.value).startswith(f"{path}: row group 2 of 4 is unreadable (") and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the same dataset as JSONL


@pytest.mark.parametrize("tokenizer", ["bytes", "gpt2"])
def test_parquet_prepares_the_same_shards_as_jsonl(tmp_path: Path, tokenizer: str) -> None:
    docs = documents(200)
    (tmp_path / "j").mkdir()
    (tmp_path / "p").mkdir()
    (tmp_path / "j" / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    write_parquet(tmp_path / "p" / "corpus.parquet", {"text": with_gaps(docs)})
    root = tmp_path / "data"
    made = {
        kind: prepare.prepare_dataset(
            "text", tokenizer, root, options={"paths": [str(tmp_path / kind)]}, log=log_to([]), shard_tokens=1000
        )  # several shards per split
        for kind in ("j", "p")
    }
    j, p = (open_dataset(made[kind], verify=True) for kind in ("j", "p"))
    assert len(j.train.shards) > 2 and len(j.val.shards) >= 1
    for split in ("train", "val"):
        assert j.manifest["splits"][split] == p.manifest["splits"][split]  # shard sha256s, token and document counts
        assert [f.read_bytes() for f in getattr(j, split).files] == [f.read_bytes() for f in getattr(p, split).files]
    n_val = round(0.05 * len(docs))
    assert p.manifest["splits"]["val"]["documents"] == n_val and p.manifest["options"]["text_column"] == "text"
    # The held-out documents are whole and the seeded choice (sources.hold_out)
    is_val = np.zeros(len(docs), dtype=bool)
    is_val[np.random.default_rng(0).permutation(len(docs))[:n_val]] = True
    if tokenizer == "bytes":
        val_text = "".join(d + "\0" for d, v in zip(docs, is_val) if v)
        tokens = p.val.read(0, p.val.n_tokens)
        assert bytes(np.where(tokens == 256, 0, tokens).astype(np.uint8)).decode() == val_text


def test_text_column_option_and_flag(tmp_path: Path) -> None:
    docs = documents(40)
    write_parquet(tmp_path / "c.parquet", {"content": docs}, text=[str(i) for i in range(40)])
    root = tmp_path / "data"
    assert dd.main(["text", str(tmp_path / "c.parquet"), "--text-column", "content", "--data-dir", str(root)]) == 0
    ds = open_dataset(root / "text-c-parquet-bytes")
    assert ds.manifest["options"]["text_column"] == "content"
    assert ds.manifest["splits"]["train"]["documents"] + ds.manifest["splits"]["val"]["documents"] == 40
    assert ds.train.n_tokens + ds.val.n_tokens == sum(len(d.encode()) + 1 for d in docs)
    # the default column is another dataset (options differ): rebuilt from "text", not reused
    lines: list[str] = []
    prepare.prepare_dataset("text", "bytes", root, options={"paths": [str(tmp_path / "c.parquet")]}, log=log_to(lines))
    assert "options changed" in lines[0]
    again = open_dataset(root / "text-c-parquet-bytes")
    assert again.train.n_tokens + again.val.n_tokens == sum(len(str(i)) + 1 for i in range(40))


# ----------------------------------------------------------------------------- errors


def bad_files(tmp_path: Path) -> dict[str, tuple[Path, dict, str]]:
    """name -> (file, extra options, the error's text after '<file>: ')."""
    good = write_parquet(tmp_path / "good.parquet", {"text": documents(60)}, n=list(range(60)))
    (tmp_path / "notparquet.parquet").write_text('{"text": "a JSON line, not parquet"}\n')
    (tmp_path / "truncated.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    write_parquet(tmp_path / "ints.parquet", {"text": list(range(60))})
    corrupt = write_parquet(tmp_path / "corrupt.parquet", {"text": [f"row {i} " * 20 for i in range(100)]})
    corrupt_row_group(corrupt, 1)
    not_parquet = "not a parquet file or corrupt (Parquet magic bytes not found in footer."
    return {
        "not parquet": (tmp_path / "notparquet.parquet", {}, not_parquet),
        "truncated": (tmp_path / "truncated.parquet", {}, not_parquet),
        "missing column": (
            good,
            {"text_column": "body"},
            ("no column 'body' (columns: 'text', 'n'); name the text column with --text-column"),
        ),
        "not strings": (tmp_path / "ints.parquet", {}, "column 'text' holds int64, not strings"),
        "corrupt row group": (corrupt, {}, "row group 1 of 4 is unreadable ("),
    }


@pytest.mark.parametrize("case", ["not parquet", "truncated", "missing column", "not strings", "corrupt row group"])
def test_bad_parquet_is_one_line_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    path, options, message = bad_files(tmp_path)[case]
    root = tmp_path / "data"
    with pytest.raises(DataError) as err:
        prepare.prepare_dataset("text", "bytes", root, options={"paths": [str(path)], **options}, log=log_to([]))
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)
    assert not (root / f"text-{path.stem}-bytes").exists()  # nothing half-written
    # the CLI: exit 2, the message on one line
    column = ["--text-column", options["text_column"]] if options else []
    assert dd.main(["text", str(path), *column, "--data-dir", str(root)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith(f"error: {path}: ") and err_text.count("\n") == 1


def test_bad_file_keeps_the_existing_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_parquet(folder / "a.parquet", {"text": documents(60)})
    root = tmp_path / "data"
    path = prepare.prepare_dataset("text", "bytes", root, options={"paths": [str(folder)]}, log=log_to([]))
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    (folder / "b.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(DataError, match=rf"^{folder / 'b.parquet'}: not a parquet file or corrupt"):
        prepare.prepare_dataset("text", "bytes", root, options={"paths": [str(folder)]}, log=log_to([]))
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before


def test_text_column_must_be_a_name(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^text: option 'text_column' must be a column name, got ''$"):
        prepare.resolve_options("text", {"paths": ["x"], "text_column": ""})
    with pytest.raises(DataError, match=r"^text: option 'text_column' must be a column name, got 3$"):
        prepare.resolve_options("text", {"paths": ["x"], "text_column": 3})


# ----------------------------------------------------------------------------- end to end


@SLOW  # a training and an evaluation
def test_parquet_corpus_prepares_trains_and_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import evaluate
    import train
    from jaxgpt.checkpoints import store as ckpt

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(2):
        write_parquet(corpus / f"part-{k}.parquet", {"text": documents(150)[k::2]})
    model = {
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 32,
        "emb_dim": 32,
        "n_heads": 2,
        "n_layers": 1,
    }
    train_cfg = {
        "dataset": {"source": "text", "options": {"paths": [str(corpus)]}},
        "tokenizer": "bytes",
        "microbatch_size": 4,
        "train_steps": 4,
        "checkpoint_interval": 4,
        "validation_batches": 1,
        "learning_rate": 0.003,
    }
    run = write_run(tmp_path / "run", model, train_cfg)
    data = tmp_path / "data"
    assert train.main([str(run), "--data-dir", str(data)]) == 0
    ds = open_dataset(data / "text-corpus-bytes", verify=True)
    assert ds.manifest["splits"]["train"]["documents"] + ds.manifest["splits"]["val"]["documents"] == 150
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["step"] == 4 and np.isfinite(meta["val_loss"])
    capsys.readouterr()
    assert evaluate.main([str(run), "--data-dir", str(data), "--max-batches", "2"]) == 0
    out = capsys.readouterr().out
    loss = float(next(line for line in out.splitlines() if line.startswith("loss ")).split()[1])
    assert np.isfinite(loss) and 0 < loss < np.log(257) + 1
