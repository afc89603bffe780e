"""The records of task files: JSONL lines, parquet rows, CSV rows, each with where it came from.

    for where, record in records(path):      # where = "file:line" (JSONL, CSV) or "file: row N" (parquet)
        ...
    files = task_files(path, "mmlu")         # a file, or a folder's files of one split (sorted)

Every failure is a one-line TaskError naming the file (and line): a missing file, malformed JSON, an
unreadable parquet or CSV file, a folder holding none or several splits' files.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from jaxgpt.tasks.base import TaskError

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".csv": "csv"}
SHUFFLE_SEED = 42  # nanochat's tasks shuffle(seed=42): a capped run takes the same examples as its --max-problems
# A split's name in a public file's name: "abstract_algebra_test.csv", "test-00000-of-00001.parquet".
_SPLIT = re.compile(r"(?:^|[_.-])(auxiliary_train|test|dev|validation|val|train)(?=[_.-]|$)")
T = TypeVar("T")


def task_files(path: Path, what: str) -> list[Path]:
    """`path` itself if a file; a folder's .jsonl/.parquet/.csv files (not recursive, sorted) if they
    all belong to one split by their names (MMLU's subject CSVs: "<subject>_test.csv")."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TaskError(f"{path}: {what} file not found")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)
    if not files:
        raise TaskError(f"{path}: folder holds no {'/'.join(FORMATS)} files for {what}")
    splits = sorted({m.group(1) for p in files if (m := _SPLIT.search(p.name.lower()))})
    if len(splits) > 1:
        raise TaskError(f"{path}: folder holds files of several splits ({', '.join(splits)}); name one file or folder")
    return files


def records(path: Path, fmt: str | None = None) -> Iterator[tuple[str, Any]]:
    """(where, record) for each record: a JSONL line's JSON value, a parquet row's dict, a CSV row's
    list of strings. `fmt` ("jsonl", "parquet", "csv") defaults to the file's suffix; blank lines skipped."""
    fmt = fmt or FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise TaskError(f"{path}: unsupported file type {path.suffix!r} (use {', '.join(FORMATS)})")
    if not path.is_file():
        raise TaskError(f"{path}: file not found")
    if fmt == "jsonl":
        yield from _jsonl(path)
    elif fmt == "parquet":
        yield from _parquet(path)
    else:
        yield from _csv(path)


def _jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except UnicodeDecodeError as e:
                raise TaskError(f"{where}: not UTF-8 (byte {e.start})") from None
            except json.JSONDecodeError as e:
                raise TaskError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None


def _parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa  # imported here: only parquet files need it
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise TaskError(f"{path}: not a readable parquet file ({first})") from None
    for number, row in enumerate(rows, start=1):
        yield f"{path}: row {number}", row


def _csv(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        start = 1
        try:
            for row in reader:
                if row:
                    yield f"{path}:{start}", row
                start = reader.line_num + 1
        except UnicodeDecodeError as e:
            raise TaskError(f"{path}: not UTF-8 (byte {e.start})") from None
        except csv.Error as e:
            raise TaskError(f"{path}:{start}: malformed CSV ({e})") from None


def field_of(record: Any, key: str, kind: type, where: str) -> Any:
    """record[key], which must be of `kind` (a non-empty one for str); a TaskError naming `where` if not."""
    if not isinstance(record, dict):
        raise TaskError(f"{where}: expected an object with a {key!r} field, got {type(record).__name__}")
    if key not in record:
        raise TaskError(f"{where}: missing field {key!r}")
    value = record[key]
    if (
        (kind is not object and isinstance(value, bool))
        or not isinstance(value, kind)
        or (kind is str and not value.strip())
    ):
        what = {str: "a non-empty string", list: "a list", dict: "an object", int: "a whole number"}[kind]
        raise TaskError(f"{where}: field {key!r} must be {what}, got {value!r:.80}")
    return value


def strings(value: Any, key: str, where: str) -> list[str]:
    """A list of strings (a field such as choices); a TaskError naming `where` if it is not."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{where}: {key!r} must be a list of strings, got {value!r:.80}")
    return list(value)


def nanochat_order(items: Sequence[T], shuffle: bool, limit: int | None) -> list[T]:
    """The items in nanochat's order (np.random.default_rng(42).permutation, its HubDataset.shuffle)
    when `shuffle`, else in file order; then the first `limit` (default: all)."""
    if limit is not None and limit < 1:
        raise TaskError(f"limit must be a whole number >= 1, got {limit!r}")
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(items)) if shuffle else range(len(items))
    return [items[int(i)] for i in order][:limit]
