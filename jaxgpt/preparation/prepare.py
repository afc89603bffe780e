"""Prepare a tokenized corpus on disk: train/val safetensors shards + manifest.json (download_dataset.py).

    from jaxgpt.preparation.prepare import default_data_root, prepare_dataset
    path = prepare_dataset("text", "gpt2", default_data_root(), options={"paths": ["corpus/"]})

Sources (train.json's "dataset" names one; each keeps its defaults in DEFAULT_OPTIONS): builtin
(offline), text (.txt, .md, .jsonl, .parquet files, folders or globs), tinyshakespeare,
fineweb10B-gpt2 (fineweb.py), fineweb-edu (fineweb_edu.py), conversations and instructions
(jaxgpt/conversations/prepare.py); what each reads: docs/data.md "Data". Documents are tokenized
with `bytes`, `gpt2` or a tokenizer trained here (bpe.py), each followed by the end-of-text token;
validation is held out by whole documents (or the text's last part when too few). A folder whose
manifest matches the request (source, options, fingerprint, tokenizer and its sha256) is reused;
anything else is rebuilt atomically. The data root: --data-dir, else $JAXGPT_DATA_DIR, else the
repository's data/.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxgpt.config import CONVERSATION_SOURCES
from jaxgpt.conversations import instructions
from jaxgpt.conversations import prepare as chat_prepare
from jaxgpt.data.encode import CHUNK_BYTES, Progress, encode_documents
from jaxgpt.data.errors import DataError
from jaxgpt.data.root import REPOSITORY, default_data_root  # noqa: F401 - re-exported: callers import them from here
from jaxgpt.data.sources import builtin, fineweb, fineweb_edu
from jaxgpt.data.sources import files as sources
from jaxgpt.data.storage.shards import dataset_lock, open_dataset, read_manifest, write_dataset
from jaxgpt.data.tokenizer import TOKENIZER_NAMES, Tokenizer, check_name, get_tokenizer

FINEWEB = fineweb.SOURCE
FINEWEB_EDU = fineweb_edu.SOURCE
# Options that change what is written; each source lists its defaults here and nowhere else.
DEFAULT_OPTIONS: dict[str, dict] = {
    "builtin": {"validation_fraction": 0.05},
    # paths: files, folders or globs (relative to the working directory); name: the dataset
    # folder is data/text-<name>-<tokenizer>, by default named after the first path;
    # text_column: the string column of .parquet files that holds the documents.
    "text": {"paths": None, "name": None, "validation_fraction": 0.05, "text_column": "text"},
    # split "nanogpt": nanoGPT's prepare.py cut, byte for byte (sources.nanogpt_split); "newline":
    # the cut moved to the next newline, each part followed by end-of-text (the older default).
    "tinyshakespeare": {"validation_fraction": 0.1, "split": "nanogpt"},
    # train_shards: how many 100M-token train files; null = as many as the training length needs.
    FINEWEB: {"train_shards": None},
    # train_shards: how many parquet train shards; null = as many as the training length needs.
    FINEWEB_EDU: {"train_shards": None},
    # Conversation datasets (chat_prepare.py): template, a built-in name or a template object (null: the
    # tokenizer's default); too_long, what training does with a conversation longer than a row; pack,
    # whether a row holds as many whole conversations as fit (chat_rows.py) or one.
    "conversations": {
        "paths": None,
        "name": None,
        "validation_fraction": 0.05,
        "template": None,
        "too_long": "drop",
        "pack": True,
    },
    "instructions": {
        "examples": 24000,
        "validation_examples": 600,
        "seed": 0,
        "tasks": list(instructions.TASKS),
        "template": None,
        "too_long": "drop",
        "pack": True,
    },
}
assert CONVERSATION_SOURCES == ("conversations", "instructions")
SOURCES = tuple(DEFAULT_OPTIONS)
_TOKENIZERS = {FINEWEB: ("gpt2",)}  # FineWeb's files are GPT-2 ids already; the others take any tokenizer
_FROM_SOURCES = ("tinyshakespeare", FINEWEB, FINEWEB_EDU)  # sources that can read a local copy instead of downloading
SHARD_TOKENS = 2**27  # tokens per shard (256 MiB of uint16): bounded files, few enough to open quickly
# Text files of at most this many bytes hold at most about this many tokens (a byte-level
# tokenizer makes no more tokens than bytes): tokenized while counted, their tokens kept until
# the hold-out is known, so the corpus is read once. Larger ones are counted, then read again.
ONE_READ_BYTES = SHARD_TOKENS
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TINYSHAKESPEARE_SPLITS = ("nanogpt", "newline")  # tinyshakespeare's two cuts (DEFAULT_OPTIONS)


def dataset_dir(data_root: Path, source: str, tokenizer: str, name: str | None = None) -> Path:
    """data_root/<source>-<tokenizer>, or data_root/<source>-<name>-<tokenizer> for named (text) corpora."""
    return Path(data_root) / (f"{source}-{name}-{tokenizer}" if name else f"{source}-{tokenizer}")


# ----------------------------------------------------------------------------- options


def _check_fraction(source: str, fraction: object) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise DataError(f"{source}: validation_fraction must be a number in (0, 1), got {fraction!r}")
    return float(fraction)  # 1 vs 1.0 must not trigger a rebuild


def _text_options(resolved: dict, source: str = "text") -> None:
    paths = resolved["paths"]
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise DataError(f"{source}: option 'paths' must be a non-empty list of files, folders or globs, got {paths!r}")
    # normpath: "corpus/" and "corpus" name the same folder and must not trigger a rebuild.
    resolved["paths"] = [os.path.normpath(p) for p in paths]
    name = resolved["name"] if resolved["name"] is not None else sources.default_name(resolved["paths"])
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DataError(f"{source}: option 'name' must be letters, digits, '.', '_' or '-', got {name!r}")
    resolved["name"] = name
    if source == "text" and (not isinstance(resolved["text_column"], str) or not resolved["text_column"]):
        raise DataError(f"text: option 'text_column' must be a column name, got {resolved['text_column']!r}")


def resolve_options(source: str, options: dict | None) -> dict:
    """The source's default options updated with `options`; DataError for unknown keys or bad values."""
    if source not in DEFAULT_OPTIONS:
        raise DataError(f"unknown dataset source {source!r}; choose one of {', '.join(SOURCES)}")
    resolved = dict(DEFAULT_OPTIONS[source])
    unknown = sorted(set(options or {}) - set(resolved))
    if unknown:
        raise DataError(f"{source}: unknown option(s) {unknown}; known: {sorted(resolved)}")
    resolved.update(options or {})
    if "validation_fraction" in resolved:
        resolved["validation_fraction"] = _check_fraction(source, resolved["validation_fraction"])
    if source in ("text", "conversations"):
        _text_options(resolved, source)
    if source in CONVERSATION_SOURCES:
        chat_prepare.check_options(source, resolved)
    if resolved.get("split", "nanogpt") not in TINYSHAKESPEARE_SPLITS:
        raise DataError(
            f"{source}: option 'split' must be one of {', '.join(map(repr, TINYSHAKESPEARE_SPLITS))}, "
            f"got {resolved['split']!r}"
        )
    shards = resolved.get("train_shards")
    most = fineweb_edu.N_TRAIN_FILES if source == FINEWEB_EDU else fineweb.N_TRAIN_FILES
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= most):
        raise DataError(f"{source}: train_shards must be null or 1..{most}, got {shards!r}")
    return resolved


# ----------------------------------------------------------------------------- documents


def split_documents(documents: Sequence[str], validation_fraction: float) -> tuple[list[str], list[str]]:
    """Hold out whole documents for validation (a seeded choice, so no text leaks across splits)."""
    n = len(documents)
    n_val = max(1, round(validation_fraction * n))
    if n_val >= n:
        raise DataError(f"cannot hold out {n_val} of {n} documents for validation and still train")
    val_ids = set(np.random.default_rng(0).permutation(n)[:n_val].tolist())
    train = [doc for i, doc in enumerate(documents) if i not in val_ids]
    val = [doc for i, doc in enumerate(documents) if i in val_ids]
    return train, val


@dataclass(frozen=True)
class _Encoding:
    """How _prepare_documents tokenizes: threads and chunk size (encode_documents's), where a shard
    is cut, and the largest local corpus read only once (_tokenized_while_counted)."""

    workers: int | None
    chunk_bytes: int
    shard_tokens: int
    one_read_bytes: int


def _tokenize_routed(
    tokenizer: Tokenizer, documents: Iterable[tuple[bool, str]], eot: bool, progress: Progress, encoding: _Encoding
) -> Iterator[tuple[str, np.ndarray]]:
    """(split, tokens) per (held out?, document): both splits tokenized as one stream, so the
    corpus is read once for them (write_dataset takes the pairs)."""
    held_out: collections.deque[bool] = collections.deque()  # documents read ahead by the tokenizer's threads

    def texts() -> Iterator[str]:
        for is_val, doc in documents:
            held_out.append(is_val)
            yield doc

    for tokens in encode_documents(
        tokenizer, texts(), eot=eot, progress=progress, workers=encoding.workers, chunk_bytes=encoding.chunk_bytes
    ):
        yield ("val" if held_out.popleft() else "train"), tokens


def _tokenized_while_counted(
    tokenizer: Tokenizer,
    documents: Callable[[], Iterator[str]],
    fraction: float,
    where: str,
    progress: Progress,
    encoding: _Encoding,
) -> tuple[Iterator[tuple[str, np.ndarray]], str] | None:
    """A small corpus in one read: every document tokenized while they are counted, the arrays kept
    (a shard's worth at most, as the writer holds anyway), then given to their split once the count
    decides the hold-out. None when the corpus is larger than that after all, or has too few
    documents to hold out whole ones (the text's tail is held out instead): read it again then."""
    kept: list[np.ndarray] = []
    n_tokens = 0
    stream = encode_documents(
        tokenizer, documents(), progress=progress, workers=encoding.workers, chunk_bytes=encoding.chunk_bytes
    )
    for tokens in stream:
        kept.append(tokens)
        n_tokens += tokens.size
        if n_tokens > 2 * encoding.one_read_bytes:  # a tokenizer or format with more tokens than bytes
            stream.close()
            return None
    mask = sources.hold_out_mask(len(kept), fraction, where)
    if mask is None:
        return None
    kept.reverse()  # handed out from the end: the writer's copy is the only one left

    def splits() -> Iterator[tuple[str, np.ndarray]]:
        for held in mask:
            yield ("val" if held else "train"), kept.pop()

    return splits(), sources.held_out(mask)


@dataclass
class _Corpus:
    """A document source: its fingerprint now (cheap), its train/val documents only when building."""

    fingerprint: str
    # fraction -> (held out?, document) in the order read, and how validation was chosen
    documents: Callable[[float], tuple[Iterable[tuple[bool, str]], str]]
    eot: bool = True  # end-of-text after each document
    # Local text small enough to read once (_tokenized_while_counted): its documents, and where they are.
    read_once: Callable[[], Iterator[str]] | None = None
    where: str = ""


def _in_order(train: Iterable[str], val: Iterable[str]) -> Iterator[tuple[bool, str]]:
    """Splits already apart (as lists), as one stream: every train document, then every validation one."""
    return itertools.chain(((False, doc) for doc in train), ((True, doc) for doc in val))


def _corpus(
    source: str,
    options: dict,
    data_root: Path,
    from_path: Path | None,
    log: Callable[[str], None],
    *,
    one_read_bytes: int = ONE_READ_BYTES,
    tinyshakespeare: sources.RemoteFile = sources.TINYSHAKESPEARE,
) -> _Corpus:
    """The source's documents; local text of at most one_read_bytes is read once (_Corpus.read_once);
    tinyshakespeare: the file to fetch, its address, size and hash."""
    if source == "builtin":

        def split_builtin(fraction: float) -> tuple[Iterator[tuple[bool, str]], str]:
            docs = builtin.builtin_documents()
            train, val = split_documents(docs, fraction)
            return _in_order(train, val), f"{len(val)} of {len(docs)} documents"

        return _Corpus(builtin.builtin_fingerprint(), split_builtin)
    if source == "text":
        files = sources.find_text_files(options["paths"])
        where = f"text {' '.join(options['paths'])}"

        def read() -> Iterator[str]:
            return sources.read_documents(files, options["text_column"])

        # Whole files only, too few to hold out whole documents: the tail is held out, read twice anyway.
        few = (
            all(f.suffix.lower() in sources.WHOLE_FILE_SUFFIXES for f in files)
            and round(options["validation_fraction"] * len(files)) == 0
        )
        small = not few and sum(f.stat().st_size for f in files) <= one_read_bytes
        return _Corpus(
            sources.files_fingerprint(files),
            lambda fraction: sources.hold_out_routed(read, fraction, where),
            read_once=read if small else None,
            where=where,
        )
    assert source == "tinyshakespeare", source
    remote, downloads = tinyshakespeare, Path(data_root) / "downloads"
    if from_path is not None:  # checked (and copied) now, even when the prepared dataset is reused
        sources.fetch_file(remote, downloads, from_path=from_path, log=log)

    def split_file(fraction: float) -> tuple[Iterator[tuple[bool, str]], str]:
        path = sources.fetch_file(remote, downloads, from_path=None, log=log)
        if options["split"] == "nanogpt":
            (text,) = sources.read_documents([path])
            train, val = sources.nanogpt_split(text, fraction, str(path))
            return _in_order([train], [val]), f"nanoGPT's cut at character {len(train):,}, no end-of-text"
        return sources.hold_out_routed(lambda: sources.read_documents([path]), fraction, str(path))

    # The file is pinned by its hash. nanoGPT's split adds no end-of-text: the splits are its bytes.
    return _Corpus(f"sha256-{remote.sha256}", split_file, eot=options["split"] != "nanogpt")


# ----------------------------------------------------------------------------- preparing


def _reuse_problem(path: Path, expected: dict) -> str | None:
    """Why the folder at `path` cannot be reused for `expected`, or None if it can."""
    if not path.exists():
        return "not prepared yet"
    try:
        manifest = read_manifest(path)
    except DataError as exc:
        return str(exc)
    for key, want in expected.items():
        if manifest.get(key) != want:
            return f"{key} changed ({manifest.get(key)!r} -> {want!r})"
    try:
        open_dataset(path)  # cheap checks: every shard present with the right size
    except DataError as exc:
        return str(exc)
    return None


def _prepare_documents(
    path: Path,
    source: str,
    tokenizer: str,
    options: dict,
    corpus: _Corpus,
    log: Callable[[str], None],
    data_root: Path,
    encoding: _Encoding,
) -> Path:
    started = time.perf_counter()
    expected = {"source": source, "options": options, "fingerprint": corpus.fingerprint, "tokenizer": tokenizer}
    trained = None if tokenizer in TOKENIZER_NAMES else get_tokenizer(tokenizer, data_root)
    if trained is not None:  # retrained under the same name (--force): the dataset is rebuilt with the new one
        expected["tokenizer_sha256"] = trained.sha256
    problem = _reuse_problem(path, expected)
    if problem is None:
        log(f"reusing dataset {path} (manifest matches)")
        return path
    log(f"preparing dataset {path}: {problem}")
    tok = trained or get_tokenizer(tokenizer)  # before any writing: a missing gpt2 cache fails fast
    progress = Progress(f"tokenizing {path.name}")
    try:
        once = None
        if corpus.read_once is not None:
            once = _tokenized_while_counted(
                tok, corpus.read_once, options["validation_fraction"], corpus.where, progress, encoding
            )
        if once is not None:
            splits, how = once
        else:
            progress.restart()
            documents, how = corpus.documents(options["validation_fraction"])
            splits = _tokenize_routed(tok, documents, corpus.eot, progress, encoding)
        manifest = write_dataset(
            path,
            source=source,
            options=options,
            fingerprint=corpus.fingerprint,
            tokenizer=tok,
            shard_tokens=encoding.shard_tokens,
            splits=splits,
        )
    finally:
        progress.close()
    splits = manifest["splits"]
    share = splits["val"]["tokens"] / max(1, splits["train"]["tokens"] + splits["val"]["tokens"])
    counts = ", ".join(
        f"{name} {s['tokens']:,} tokens / {s['documents']} documents / {len(s['shards'])} shard(s)"
        for name, s in splits.items()
    )
    log(f"wrote {path}: {counts}; validation = {how}, {share:.1%} of the tokens; {time.perf_counter() - started:.1f} s")
    return path


def prepare_dataset(
    source: str,
    tokenizer: str,
    data_root: Path,
    *,
    options: dict | None = None,
    train_tokens: int | None = None,
    from_path: Path | None = None,
    log: Callable[[str], None] = print,
    shard_tokens: int = SHARD_TOKENS,
    one_read_bytes: int = ONE_READ_BYTES,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    tinyshakespeare: sources.RemoteFile = sources.TINYSHAKESPEARE,
    edu_train_files: int = fineweb_edu.N_TRAIN_FILES,
) -> Path:
    """Make sure data_root holds the requested dataset (see dataset_dir) and return its path.

    Reuses the folder when its manifest matches, else writes it atomically. train_tokens (the run's
    length) decides how many FineWeb files are needed; from_path is a local copy of a downloadable
    source (tinyshakespeare: the file; FineWeb: a folder of .bin files; FineWeb-Edu: of .parquet
    shards). The keyword arguments after `log` have every run's defaults; tests pass smaller ones
    (shard_tokens, one_read_bytes, workers, chunk_bytes, tinyshakespeare, edu_train_files).
    """
    resolved = resolve_options(source, options)
    _check_request(source, tokenizer, from_path)
    path = dataset_dir(data_root, source, tokenizer, resolved.get("name"))
    if source in (FINEWEB, FINEWEB_EDU):
        return _prepare_hub(
            source,
            path,
            resolved,
            tokenizer,
            data_root,
            train_tokens=train_tokens,
            from_path=from_path,
            shard_tokens=shard_tokens,
            edu_train_files=edu_train_files,
            log=log,
        )
    if source in CONVERSATION_SOURCES:
        tok = get_tokenizer(tokenizer, data_root)
        with dataset_lock(path, log):
            return chat_prepare.prepare(path, source, tok, resolved, log, _reuse_problem)
    corpus = _corpus(
        source, resolved, data_root, from_path, log, one_read_bytes=one_read_bytes, tinyshakespeare=tinyshakespeare
    )  # bad paths fail here, before any lock file
    encoding = _Encoding(
        workers=workers, chunk_bytes=chunk_bytes, shard_tokens=shard_tokens, one_read_bytes=one_read_bytes
    )
    with dataset_lock(path, log):
        return _prepare_documents(path, source, tokenizer, resolved, corpus, log, data_root, encoding)


def _check_request(source: str, tokenizer: str, from_path: Path | None) -> None:
    """The tokenizer and --from checked against the source before anything is read or locked."""
    check_name(tokenizer)  # bytes, gpt2 or a trained tokenizer's name (<data_root>/tokenizers/<name>)
    if tokenizer not in _TOKENIZERS.get(source, (tokenizer,)):
        raise DataError(
            f"{source}: holds {_TOKENIZERS[source][0]} tokens, so the tokenizer must be "
            f"{_TOKENIZERS[source][0]!r}, got {tokenizer!r}"
        )
    if from_path is not None and source not in _FROM_SOURCES:
        raise DataError(f"{source}: --from applies only to {', '.join(_FROM_SOURCES[:-1])} and {_FROM_SOURCES[-1]}")


def _prepare_hub(
    source: str,
    path: Path,
    resolved: dict,
    tokenizer: str,
    data_root: Path,
    *,
    train_tokens: int | None,
    from_path: Path | None,
    shard_tokens: int,
    edu_train_files: int,
    log: Callable[[str], None],
) -> Path:
    """FineWeb or FineWeb-Edu: shard files from the Hub (or --from), prepared by their own modules."""
    if source == FINEWEB:  # its files are GPT-2 ids already: no tokenizer to load
        with dataset_lock(path, log):
            return fineweb.prepare(
                path,
                resolved,
                train_tokens=train_tokens,
                from_dir=from_path,
                downloads=Path(data_root) / "downloads" / FINEWEB,
                log=log,
            )
    tok = get_tokenizer(tokenizer, data_root)  # before any lock or download: a missing one fails fast
    with dataset_lock(path, log):
        return fineweb_edu.prepare(
            path,
            resolved,
            tokenizer=tok,
            train_tokens=train_tokens,
            from_dir=from_path,
            downloads=Path(data_root) / "downloads" / FINEWEB_EDU,
            shard_tokens=shard_tokens,
            n_train_files=edu_train_files,
            log=log,
        )
