"""Prepare a tokenized training corpus on disk (train/val safetensors shards + manifest.json).

Usage:
    uv run download_dataset.py builtin                       # bytes tokenizer -> data/builtin-bytes
    uv run download_dataset.py builtin --tokenizer gpt2      # GPT-2 BPE (needs tiktoken's gpt2 files)
    uv run download_dataset.py builtin --data-dir /big/disk --validation-fraction 0.1 --verify

Sources:
    builtin   an offline corpus of a few MB of English technical prose that ships with every
              Python: the pydoc help topics plus the docstrings of the standard-library modules,
              read from their source files with `ast` (nothing is imported or executed).

A folder whose manifest matches the request (source, options, fingerprint, tokenizer) is
reused as is; anything else is rebuilt atomically. The default data root is $JAXGPT_DATA_DIR,
else <project root>/data. From Python:

    from download_dataset import prepare_dataset, default_data_root
    path = prepare_dataset("builtin", "bytes", default_data_root())
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import os
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from data import DataError, open_dataset, read_manifest, token_dtype, write_dataset
from tokenizer import TOKENIZER_NAMES, Tokenizer, TokenizerError, get_tokenizer

# Options that change what is written; each source lists its defaults here and nowhere else.
DEFAULT_OPTIONS: dict[str, dict] = {"builtin": {"validation_fraction": 0.05}}
SOURCES = tuple(DEFAULT_OPTIONS)
# Folder names under the stdlib that hold tests, third-party packages, binaries or build files.
_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages", "lib-dynload"}
_ENCODE_CHUNK = 256  # documents per tokenizer call: bounds memory while keeping tiktoken's threads busy


def default_data_root() -> Path:
    """$JAXGPT_DATA_DIR if set, else the git-ignored data/ folder beside this file."""
    env = os.environ.get("JAXGPT_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "data"


def dataset_dir(data_root: Path, source: str, tokenizer: str) -> Path:
    return Path(data_root) / f"{source}-{tokenizer}"


# ----------------------------------------------------------------------------- builtin corpus


def _parse(path: Path) -> ast.Module | None:
    """The AST of a source file, or None if this Python cannot parse it (e.g. lib2to3 fixtures)."""
    try:
        with warnings.catch_warnings():  # invalid escape sequences in old stdlib files warn on parse
            warnings.simplefilter("ignore")
            return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):  # ValueError: null bytes or undecodable source
        return None


def _pydoc_topics(stdlib: Path) -> list[str]:
    """Values of pydoc_data.topics.topics sorted by key, read as a literal instead of importing it."""
    tree = _parse(stdlib / "pydoc_data" / "topics.py")
    if tree is None:  # some distributions strip pydoc_data
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return [topics[key] for key in sorted(topics)]
    return []


def _docstrings(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of every class and function, in source order, nested ones too."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                yield name, doc
            yield from _docstrings(node.body, name)


def _module_document(path: Path, module: str) -> str | None:
    tree = _parse(path)
    if tree is None:
        return None
    parts = []
    doc = ast.get_docstring(tree)
    if doc:
        parts.append(doc)
    parts.extend(f"{name}\n{doc}" for name, doc in _docstrings(tree.body, module))
    if not parts:
        return None
    return f"Module {module}\n\n" + "\n\n".join(parts) + "\n"


def _stdlib_sources(stdlib: Path) -> list[Path]:
    """Every stdlib .py file worth reading, sorted by relative path so the order never depends on the disk."""
    found = []
    for folder, dirs, files in os.walk(stdlib):
        rel = Path(folder).relative_to(stdlib)
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not (rel == Path(".") and d.startswith("config-"))]
        for name in files:
            # _sysconfigdata* describes this machine's build, not the language.
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                found.append(Path(folder) / name)
    return sorted(found, key=lambda p: p.relative_to(stdlib).as_posix())


@functools.lru_cache(maxsize=1)
def _builtin_documents() -> tuple[str, ...]:
    # Cached: the stdlib does not change while a process runs, and parsing ~700 files takes seconds.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = _pydoc_topics(stdlib)
    for path in _stdlib_sources(stdlib):
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
        doc = _module_document(path, module)
        if doc is not None:
            docs.append(doc)
    return tuple(docs)


def builtin_documents() -> list[str]:
    """The offline corpus: one document per pydoc topic, then one per stdlib module with docstrings.

    Deterministic for a given Python installation (its fingerprint names the version and hashes the text).
    """
    return list(_builtin_documents())


def documents_fingerprint(documents: Sequence[str]) -> str:
    """Python version + sha256 of the documents (NUL-separated, so moving a boundary changes it)."""
    digest = hashlib.sha256()
    for doc in documents:
        digest.update(doc.encode("utf-8"))
        digest.update(b"\0")
    version = ".".join(str(v) for v in sys.version_info[:3])
    return f"python-{version}-sha256-{digest.hexdigest()}"


# ----------------------------------------------------------------------------- preparing


def resolve_options(source: str, options: dict | None) -> dict:
    """The source's default options updated with `options`; DataError for unknown keys or bad values."""
    if source not in DEFAULT_OPTIONS:
        raise DataError(f"unknown dataset source {source!r}; choose one of {', '.join(SOURCES)}")
    resolved = dict(DEFAULT_OPTIONS[source])
    unknown = sorted(set(options or {}) - set(resolved))
    if unknown:
        raise DataError(f"{source}: unknown option(s) {unknown}; known: {sorted(resolved)}")
    resolved.update(options or {})
    fraction = resolved["validation_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise DataError(f"{source}: validation_fraction must be a number in (0, 1), got {fraction!r}")
    resolved["validation_fraction"] = float(fraction)  # 1 vs 1.0 must not trigger a rebuild
    return resolved


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


def tokenize_documents(tokenizer: Tokenizer, documents: Sequence[str]) -> Iterator[np.ndarray]:
    """Token arrays of each document with the end-of-text id appended (what write_dataset expects)."""
    dtype = token_dtype(tokenizer.n_vocab)
    for i in range(0, len(documents), _ENCODE_CHUNK):
        for ids in tokenizer.encode_batch(documents[i:i + _ENCODE_CHUNK]):
            doc = np.empty(ids.size + 1, dtype=dtype)
            doc[:-1] = ids
            doc[-1] = tokenizer.eot_id
            yield doc


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


def prepare_dataset(source: str, tokenizer: str, data_root: Path, *, options: dict | None = None,
                    log: Callable[[str], None] = print) -> Path:
    """Make sure data_root/<source>-<tokenizer> holds the requested dataset and return its path.

    Reuses the folder when its manifest matches (source, options, fingerprint, tokenizer);
    otherwise tokenizes the source and writes it atomically, replacing the old folder.
    """
    resolved = resolve_options(source, options)
    if tokenizer not in TOKENIZER_NAMES:
        raise TokenizerError(f"unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZER_NAMES)}")
    path = dataset_dir(data_root, source, tokenizer)
    started = time.perf_counter()
    documents = builtin_documents()
    fingerprint = documents_fingerprint(documents)
    expected = {"source": source, "options": resolved, "fingerprint": fingerprint, "tokenizer": tokenizer}
    problem = _reuse_problem(path, expected)
    if problem is None:
        log(f"reusing dataset {path} (manifest matches)")
        return path
    log(f"preparing dataset {path}: {problem}")
    tok = get_tokenizer(tokenizer)  # before any writing: a missing gpt2 cache fails fast
    train_docs, val_docs = split_documents(documents, resolved["validation_fraction"])
    manifest = write_dataset(
        path, source=source, options=resolved, fingerprint=fingerprint, tokenizer=tok,
        splits={"train": tokenize_documents(tok, train_docs), "val": tokenize_documents(tok, val_docs)})
    text_mb = sum(len(doc.encode("utf-8")) for doc in documents) / 1e6
    counts = ", ".join(f"{name} {s['tokens']:,} tokens / {s['documents']} documents / {len(s['shards'])} shard(s)"
                       for name, s in manifest["splits"].items())
    log(f"wrote {path}: {text_mb:.1f} MB of text -> {counts} in {time.perf_counter() - started:.1f} s")
    return path


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Tokenize a corpus into train/val safetensors shards (reused when already prepared).")
    parser.add_argument("source", choices=SOURCES, help="corpus to prepare")
    parser.add_argument("--tokenizer", choices=TOKENIZER_NAMES, default="bytes", help="default: bytes")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data root holding <source>-<tokenizer>/ (default: $JAXGPT_DATA_DIR or <project>/data)")
    parser.add_argument("--validation-fraction", type=float, default=None,
                        help="share of documents held out for validation (default: 0.05)")
    parser.add_argument("--verify", action="store_true", help="afterwards, check every shard's sha256")
    args = parser.parse_args(argv)
    options = {} if args.validation_fraction is None else {"validation_fraction": args.validation_fraction}
    data_root = args.data_dir if args.data_dir is not None else default_data_root()
    try:
        path = prepare_dataset(args.source, args.tokenizer, data_root, options=options)
        if args.verify:
            open_dataset(path, verify=True)
            print(f"verified sha256 of every shard in {path}")
    except (DataError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
