"""Where documents come from: local text files and downloaded corpora (used by download_dataset.py).

    files = find_text_files(["corpus/", "notes/*.md", "dump.jsonl"])   # sorted, deduplicated
    docs = lambda: read_documents(files)        # one str per .txt/.md file, .jsonl line or .parquet row
    train, val, how = hold_out(docs, 0.05)      # whole documents held out for validation

    path = fetch_file(TINYSHAKESPEARE, data_root / "downloads", from_path=None, log=print)

Every failure is a DataError with one line naming the file (or address) and what to do.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.sources.parquet import parquet_documents
from jaxgpt.files import sha256

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")
WHOLE_FILE_SUFFIXES = (".txt", ".md")  # one document per file (the others hold one per record)
_GLOB_CHARS = re.compile(r"[*?\[]")
_DOWNLOAD_TIMEOUT_S = 30


# ----------------------------------------------------------------------------- downloads


@dataclass(frozen=True)
class RemoteFile:
    name: str  # file name under the downloads folder
    url: str
    size: int
    sha256: str

    def short_sha(self) -> str:
        return f"{self.sha256[:8]}...{self.sha256[-6:]}"


TINYSHAKESPEARE = RemoteFile(
    name="tinyshakespeare.txt",
    url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    size=1_115_394,
    sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
)


def _matches(path: Path, remote: RemoteFile) -> bool:
    # The size check first: it is free and rejects partial copies without reading them.
    return path.is_file() and path.stat().st_size == remote.size and sha256(path) == remote.sha256


def _copy_atomic(source: Path, dest: Path) -> None:
    tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download(
    url: str, dest: Path, *, check: Callable[[Path], None], offline_hint: str, error: type[DataError] = DataError
) -> None:
    """url -> dest through a temporary name in dest's folder: `check(tmp)` raises on a wrong file
    before the rename, so dest is the whole, checked file or absent. A network or file error is
    one line naming the address and where to put the file by hand (`offline_hint`: what else works)."""
    tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f, length=1 << 20)
        check(tmp)
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as exc:  # URLError, HTTPError, timeouts and DNS failures are OSErrors
        reason = getattr(exc, "reason", None) or exc
        raise error(
            f"cannot download {url} ({type(exc).__name__}: {str(reason).splitlines()[0][:120]}); "
            f"fetch it where there is network access and put it at {dest}, or {offline_hint}"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def fetch_recorded(
    url: str,
    dest: Path,
    *,
    validate: Callable[[Path], None],
    offline_hint: str,
    error: type[DataError] = DataError,
    log: Callable[[str], None] = print,
) -> Path:
    """`url` at `dest`, downloaded once: renamed into place only once `validate(tmp)` accepts it, its
    sha256 then recorded beside it (`<file>.sha256`) and checked at every later use, so a truncated
    or edited copy is never used silently. For files whose upstream hash is not pinned here."""
    dest = Path(dest)
    recorded = dest.with_name(dest.name + ".sha256")
    if dest.is_file():
        if recorded.is_file() and recorded.read_text().split()[0] != sha256(dest):
            raise error(
                f"{dest}: sha256 differs from the one recorded at download ({recorded}); "
                f"delete both to download it again"
            )
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading {url} -> {dest}")

    def check(tmp: Path) -> None:
        validate(tmp)
        recorded.write_text(f"{sha256(tmp)}  {dest.name}\n")

    download(url, dest, check=check, offline_hint=offline_hint, error=error)
    return dest


def _download(remote: RemoteFile, dest: Path) -> None:
    def check(tmp: Path) -> None:
        if not _matches(tmp, remote):
            raise DataError(
                f"{remote.url}: downloaded file is not the expected one (sha256 {sha256(tmp)[:12]}..., "
                f"expected {remote.short_sha()}); the address may have changed"
            )

    download(remote.url, dest, check=check, offline_hint="pass --from <file> to download_dataset.py")


def fetch_file(
    remote: RemoteFile, downloads: Path, *, from_path: Path | None, log: Callable[[str], None] = print
) -> Path:
    """A verified local copy of `remote` under `downloads`: from `from_path`, an earlier download, or the network."""
    dest = Path(downloads) / remote.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if from_path is not None:
        from_path = Path(from_path).expanduser()
        if not from_path.is_file():
            raise DataError(f"{from_path}: --from file not found")
        if not _matches(from_path, remote):
            raise DataError(
                f"{from_path}: not the expected {remote.name} ({from_path.stat().st_size:,} bytes; "
                f"expected {remote.size:,} bytes with sha256 {remote.short_sha()})"
            )
        if not (dest.exists() and dest.samefile(from_path)):
            _copy_atomic(from_path, dest)  # kept, so a later rebuild needs neither --from nor the network
        return dest
    if _matches(dest, remote):
        return dest
    if dest.exists():
        log(f"{dest}: not the expected file (size or sha256 differ); downloading it again")
    log(f"downloading {remote.url} -> {dest}")
    _download(remote, dest)
    return dest


# ----------------------------------------------------------------------------- local text files


def _is_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS.search(pattern))


def _expand(pattern: str) -> list[Path]:
    """The text files one path, folder or glob names (folders and globs: recursive, sorted)."""
    path = Path(pattern).expanduser()
    if _is_glob(pattern):
        found = [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
        found = [p for p in found if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
        if not found:
            raise DataError(f"{pattern}: matches no {'/'.join(TEXT_SUFFIXES)} files")
        return found
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in TEXT_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            raise DataError(f"{path}: folder holds no {'/'.join(TEXT_SUFFIXES)} files")
        return found
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.suffix.lower() not in TEXT_SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix!r} (use {', '.join(TEXT_SUFFIXES)})")
    return [path]


def find_text_files(patterns: Iterable[str]) -> list[Path]:
    """Absolute paths of every file the patterns name, in order, each once."""
    seen: dict[Path, None] = {}
    for pattern in patterns:
        for path in _expand(pattern):
            seen.setdefault(path.resolve(), None)
    return list(seen)


def default_name(patterns: list[str]) -> str:
    """A folder-name-safe name for a corpus: the first path's folder name, or its file name with the
    extension after a '-' (chat.jsonl -> chat-jsonl: chat.parquet beside it is another dataset)."""
    first = patterns[0]
    if _is_glob(first):  # corpus/**/*.txt -> corpus
        parts = Path(first).expanduser().parts
        first = str(Path(*parts[: next(i for i, p in enumerate(parts) if _is_glob(p))] or ["."]))
    path = Path(first).expanduser().resolve()
    stem = path.name if path.is_dir() or not path.suffix else f"{path.stem}-{path.suffix[1:]}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "corpus"


def files_fingerprint(files: list[Path]) -> str:
    """sha256 over each file's path, size and modification time: cheap (no reading), and any edit changes it."""
    digest = hashlib.sha256()
    for path in files:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"files-{len(files)}-stat-sha256-{digest.hexdigest()}"


def _decode(path: Path, data: bytes, line: int | None = None) -> str:
    try:
        return data.decode("utf-8-sig" if line is None else "utf-8")
    except UnicodeDecodeError as exc:
        where = f"{path}:{line}" if line is not None else str(path)
        raise DataError(
            f"{where}: not UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); convert the file to UTF-8"
        ) from None


def _jsonl_documents(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(_decode(path, raw, number))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DataError(
                    f"{path}:{number}: expected an object with a string 'text' field, "
                    f"got {type(record).__name__} {str(record)[:60]!r}"
                )
            if text:
                yield text


def read_documents(files: list[Path], text_column: str = "text") -> Iterator[str]:
    """One document per .txt/.md file, per .jsonl line (its 'text' field) and per .parquet row (its
    `text_column`, streamed one row group at a time); empty ones are skipped."""
    for path in files:
        if path.suffix.lower() == ".jsonl":
            yield from _jsonl_documents(path)
        elif path.suffix.lower() == ".parquet":
            yield from parquet_documents(path, text_column)
        else:
            text = _decode(path, path.read_bytes())
            if text:
                yield text


# ----------------------------------------------------------------------------- validation split


def split_tail(documents: list[str], fraction: float, where: str = "corpus") -> tuple[list[str], list[str]]:
    """Hold out the last `fraction` of the text (by characters), cut after a newline where there is one."""
    total = sum(len(doc) for doc in documents)
    keep = total - round(fraction * total)  # characters that stay in train
    j = 0
    while keep > len(documents[j]):
        keep -= len(documents[j])
        j += 1
    doc = documents[j]
    newline = doc.find("\n", keep)
    cut = newline + 1 if newline != -1 and newline + 1 < len(doc) else keep  # one long line: cut inside it
    train = [d for d in documents[:j] + [doc[:cut]] if d]
    val = [d for d in [doc[cut:]] + documents[j + 1 :] if d]
    if not train or not val:
        raise DataError(
            f"{where}: cannot hold out {fraction:.0%} of {total:,} characters for validation and still train"
        )
    return train, val


def nanogpt_split(text: str, fraction: float, where: str = "corpus") -> tuple[str, str]:
    """nanoGPT's data/shakespeare_char/prepare.py cut: `train = data[:int(n*0.9)]`, `val = data[int(n*0.9):]`
    on the characters (for validation_fraction 0.1), so validation losses compare with its published ones."""
    cut = int(len(text) * (1 - fraction))
    if not 0 < cut < len(text):
        raise DataError(
            f"{where}: cannot hold out {fraction:.0%} of {len(text):,} characters for validation and still train"
        )
    return text[:cut], text[cut:]


def hold_out_mask(n: int, fraction: float, where: str = "corpus") -> np.ndarray | None:
    """Which of n documents are held out for validation (a seeded choice spread over the corpus),
    or None when there are too few to hold out whole ones: then the text's tail is (split_tail)."""
    if n == 0:
        raise DataError(f"{where}: no text (every file or record is empty)")
    n_val = round(fraction * n)
    if n_val == 0:  # fewer than ~1/(2 * fraction) documents: by document would give 0% or far too much
        return None
    if n_val >= n:
        raise DataError(f"{where}: cannot hold out {n_val} of {n} documents for validation and still train")
    # The same seeded choice as the builtin corpus: spread over the corpus, original order kept.
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(0).permutation(n)[:n_val]] = True
    return is_val


def held_out(mask: np.ndarray) -> str:
    """How hold_out_mask chose: "<held out> of <n> documents"."""
    return f"{int(mask.sum())} of {mask.size} documents"


def _hold_out_plan(
    documents: Callable[[], Iterator[str]], fraction: float, where: str
) -> tuple[np.ndarray | tuple[list[str], list[str]], str]:
    """Counts the documents (one read, which also reports bad files before any tokenizing) and
    chooses: a mask of the held-out documents, or (few documents) the text's tail as (train, val)."""
    n = sum(1 for _ in documents())
    mask = hold_out_mask(n, fraction, where)
    if mask is None:
        return split_tail(list(documents()), fraction, where), f"the last {fraction:.0%} of the text of {n} document(s)"
    return mask, held_out(mask)


def hold_out(
    documents: Callable[[], Iterator[str]], fraction: float, where: str = "corpus"
) -> tuple[Iterator[str], Iterator[str], str]:
    """(train, val, description): whole documents held out, or the text's tail when there are too few documents.

    `documents` is called once to count (which also reports bad files before any tokenizing) and
    then once per split, so a corpus larger than memory streams through.
    """
    plan, how = _hold_out_plan(documents, fraction, where)
    if isinstance(plan, tuple):
        return iter(plan[0]), iter(plan[1]), how
    return (
        (doc for is_val, doc in _routed(documents, plan) if not is_val),
        (doc for is_val, doc in _routed(documents, plan) if is_val),
        how,
    )


def hold_out_routed(
    documents: Callable[[], Iterator[str]], fraction: float, where: str = "corpus"
) -> tuple[Iterator[tuple[bool, str]], str]:
    """hold_out's split as one stream of (held out?, document) in the corpus's order, and its
    description: `documents` is called once to count and once more for both splits together."""
    plan, how = _hold_out_plan(documents, fraction, where)
    if isinstance(plan, tuple):
        return itertools.chain(((False, doc) for doc in plan[0]), ((True, doc) for doc in plan[1])), how
    return _routed(documents, plan), how


def _routed(documents: Callable[[], Iterator[str]], is_val: np.ndarray) -> Iterator[tuple[bool, str]]:
    count = 0
    for count, doc in enumerate(documents(), start=1):
        if count > is_val.size:
            break
        yield bool(is_val[count - 1]), doc
    if count != is_val.size:  # a file changed between the counting pass and this one
        raise DataError(
            f"the corpus changed while it was being prepared ({is_val.size} documents, then {count}); prepare it again"
        )
