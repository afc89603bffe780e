"""Documents from parquet files: one per row of a string column, read one row group at a time.

    pf = open_parquet(path, "text")            # DataError unless a parquet file with a string column "text"
    for doc in parquet_documents(path, "text"):  # non-empty strings; nulls and "" are skipped
        ...

One row group's column is in memory at a time: a corpus may be far larger than memory. Every
failure is a one-line DataError naming the file (and row group).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jaxgpt.data.errors import DataError

# pyarrow raises ArrowException subclasses for malformed files, OSError for unreadable or
# corrupt pages (e.g. "Corrupt snappy compressed data").
_READ_ERRORS = (pa.ArrowException, OSError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = (text.splitlines()[0] if text else type(exc).__name__)[:160]
    # pyarrow quotes the corrupt bytes it met ("don't know what type: \x0f"): keep them visible.
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in line)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def open_parquet(path: Path, column: str) -> pq.ParquetFile:
    """The file's footer, opened (nothing else is read); DataError if it is not parquet or has no string `column`."""
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except _READ_ERRORS as exc:
        raise DataError(f"{path}: not a parquet file or corrupt ({_first_line(exc)})") from None
    schema = pf.schema_arrow
    if column not in schema.names:
        raise DataError(
            f"{path}: no column {column!r} (columns: {', '.join(map(repr, schema.names)) or 'none'}); "
            "name the text column with --text-column"
        )
    kind = schema.field(column).type
    if not _is_text(kind):
        raise DataError(f"{path}: column {column!r} holds {kind}, not strings")
    return pf


def parquet_documents(path: Path, column: str) -> Iterator[str]:
    """Each non-empty string of `column`, in file order, one row group in memory at a time."""
    pf = open_parquet(path, column)
    for group in range(pf.num_row_groups):
        try:
            values = pf.read_row_group(group, columns=[column]).column(0).to_pylist()
        except _READ_ERRORS as exc:
            raise DataError(
                f"{path}: row group {group} of {pf.num_row_groups} is unreadable ({_first_line(exc)})"
            ) from None
        yield from (text for text in values if text)  # None (null) and "" are empty documents
