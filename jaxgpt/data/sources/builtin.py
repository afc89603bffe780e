"""The built-in corpus: a few MB of English technical prose that ships with every Python (offline).

The pydoc help topics, then one document per standard-library module with docstrings, read with
`ast` (nothing is imported). Deterministic for a given Python installation: its fingerprint
names the version and hashes the text, and is remembered per cheap stamp (jaxgpt/caches.py).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from jaxgpt import caches

BUILTIN_FINGERPRINTS = "builtin_fingerprint.json"  # in caches.cache_root(): stamp -> fingerprint


# Folder names under the stdlib that hold tests, third-party packages, binaries or build files.
_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages", "lib-dynload"}


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


def builtin_stamp(stdlib: Path) -> str:
    """What the built-in documents are made of, read cheaply: this module's code, the Python
    version, and the path, size and modification time of every file they are read from."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in [stdlib / "pydoc_data" / "topics.py", *_stdlib_sources(stdlib)]:
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    version = ".".join(str(v) for v in sys.version_info[:3])
    return f"python-{version}-{digest.hexdigest()}"


def builtin_fingerprint() -> str:
    """documents_fingerprint(builtin_documents()), remembered per builtin_stamp (caches.py): a
    run that reuses the prepared built-in dataset need not parse the standard library (~2 s)."""
    stamp = builtin_stamp(Path(sysconfig.get_paths()["stdlib"]))
    known = caches.recall(BUILTIN_FINGERPRINTS, stamp)
    if isinstance(known, str):
        return known
    fingerprint = documents_fingerprint(builtin_documents())
    caches.remember(BUILTIN_FINGERPRINTS, stamp, fingerprint)
    return fingerprint


def documents_fingerprint(documents: Sequence[str]) -> str:
    """Python version + sha256 of the documents (NUL-separated, so moving a boundary changes it)."""
    digest = hashlib.sha256()
    for doc in documents:
        digest.update(doc.encode("utf-8"))
        digest.update(b"\0")
    version = ".".join(str(v) for v in sys.version_info[:3])
    return f"python-{version}-sha256-{digest.hexdigest()}"
