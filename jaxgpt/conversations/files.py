"""Conversations from files: Alpaca records and chat messages, each with where it came from.

    for where, messages in read_conversations(find_conversation_files(["alpaca.json", "chats/"])):
        ...   # where: "chats/a.jsonl:12"; messages: [{"role": "user", "content": ...}, ...]

Formats, told apart record by record:
    Alpaca   {"instruction", "input" (optional, may be ""), "output"}: one user message (the input
             kept beside the instruction, for the template to place) and one assistant message.
    chat     {"messages": [{"role": "system" | "user" | "assistant", "content": ...}, ...]}: several
             turns; an assistant message may carry OpenAI's "weight": 0 (rendered, not trained on).

Files: .json (an array of records), .jsonl (one per line; blank lines skipped) and .parquet (one
per row: a `messages` column, or `instruction` and `output` columns with an optional `input`), as
files, folders (recursive) or globs. Every problem is a one-line DataError naming the file and
line (or row): a missing field, a wrong type, an empty answer, roles out of turn.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jaxgpt.conversations.template import TemplateError, check_messages
from jaxgpt.data.errors import DataError

SUFFIXES = (".json", ".jsonl", ".parquet")
Conversation = list[dict[str, Any]]


def find_conversation_files(patterns: Iterable[str]) -> list[Path]:
    """Absolute paths of the .json/.jsonl/.parquet files the paths, folders or globs name, each once."""
    seen: dict[Path, None] = {}
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if any(c in pattern for c in "*?["):
            found = [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if not any(q.startswith(".") for q in p.relative_to(path).parts))
        elif path.exists():
            if path.suffix.lower() not in SUFFIXES:
                raise DataError(f"{path}: unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
            found = [path]
        else:
            raise DataError(f"{path}: no such file or folder")
        found = [p for p in found if p.is_file() and p.suffix.lower() in SUFFIXES]
        if not found:
            raise DataError(f"{pattern}: names no {'/'.join(SUFFIXES)} files")
        for p in found:
            seen.setdefault(p.resolve(), None)
    return list(seen)


def to_messages(record: Any, where: str) -> Conversation:
    """One record (Alpaca or chat) as checked messages; DataError naming `where` otherwise."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object (Alpaca or chat record), got {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'messages' must be a non-empty list, got {messages!r:.60}")
        messages = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]
    elif "instruction" in record or "output" in record:
        for key in ("instruction", "output"):
            if not isinstance(record.get(key), str):
                raise DataError(f"{where}: Alpaca record needs a string {key!r}, got {record.get(key)!r:.60}")
        extra = record.get("input") or ""
        if not isinstance(extra, str):
            raise DataError(f"{where}: Alpaca 'input' must be a string, got {extra!r:.60}")
        messages = [
            {"role": "user", "content": record["instruction"], **({"input": extra} if extra else {})},
            {"role": "assistant", "content": record["output"]},
        ]
    else:
        raise DataError(
            f"{where}: neither an Alpaca record (instruction, input, output) nor a chat record "
            f"(messages); keys: {sorted(record)[:8]}"
        )
    try:
        messages = check_messages(messages)
    except TemplateError as e:
        raise DataError(f"{where}: {e}") from None
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and not m["content"].strip():
            raise DataError(f"{where}: message {i} is an empty answer (nothing to train on); fix or remove the record")
        if m["role"] == "user" and not m["content"].strip():
            raise DataError(f"{where}: message {i} is an empty user message")
    return messages


def _cut_off(text: str, e: json.JSONDecodeError) -> tuple[int, int] | None:
    """(line, column) where `text` ends mid-record, when that is the error; else None."""
    if not (e.msg.startswith("Unterminated string") or not text[e.pos :].strip()):
        return None
    lines = text.rstrip().split("\n")
    return len(lines), len(lines[-1])


def _json_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
        data = json.loads(text)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        cut = _cut_off(text, e)
        if cut is not None:
            raise DataError(
                f"{path}:{cut[0]}: malformed JSON: the file is cut off after column {cut[1]} ({e.msg})"
            ) from None
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, list):
        raise DataError(
            f"{path}: holds one JSON {type(data).__name__}, expected a list of records: a .json file is a JSON "
            f"array of Alpaca or chat records (.jsonl: one record a line)"
        )
    for i, record in enumerate(data):
        yield f"{path}[{i}]", record


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):  # split on "\n" only, as JSONL is
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                text = raw.decode("utf-8").rstrip("\r\n")  # the error's column is then in this line
                yield where, json.loads(text)
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 (byte {e.start})") from None
            except json.JSONDecodeError as e:
                cut = _cut_off(text, e)
                if cut is not None:
                    raise DataError(
                        f"{where}: malformed JSON: the line is cut off after column {cut[1]} ({e.msg})"
                    ) from None
                raise DataError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a parquet file or corrupt ({str(e).splitlines()[0][:120]})") from None
    names = pf.schema_arrow.names
    columns = ["messages"] if "messages" in names else [c for c in ("instruction", "input", "output") if c in names]
    if columns != ["messages"] and not {"instruction", "output"} <= set(columns):
        raise DataError(
            f"{path}: needs a 'messages' column or 'instruction' and 'output' columns (columns: {', '.join(names)})"
        )
    row = 0
    for group in range(pf.num_row_groups):
        try:
            records = pf.read_row_group(group, columns=columns).to_pylist()  # one row group in memory at a time
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path}: row group {group} is unreadable ({str(e).splitlines()[0][:120]})") from None
        for record in records:
            yield f"{path} row {row}", record
            row += 1


def read_conversations(files: Iterable[Path]) -> Iterator[tuple[str, Conversation]]:
    """(where, messages) of every record of the files, in order."""
    readers = {".json": _json_records, ".jsonl": _jsonl_records, ".parquet": _parquet_records}
    for path in files:
        for where, record in readers[path.suffix.lower()](Path(path)):
            yield where, to_messages(record, where)
