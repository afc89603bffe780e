"""Train a byte-level BPE tokenizer on a corpus's train split (`download_dataset.py tokenizer`).

    from jaxgpt.preparation.bpe import train_tokenizer
    folder = train_tokenizer("shakespeare-4k", "tinyshakespeare", data_root, vocab_size=4096)
    # -> data_root/tokenizers/shakespeare-4k/{tokenizer.json, meta.json}; train.json "tokenizer": "shakespeare-4k"

nanochat's recipe on Hugging Face `tokenizers` (GPT-4's pre-split regex, byte-level, no
normalizer), with five special tokens after the learned ones: "<|endoftext|>", then nanochat's
four role tokens (the "nanochat" chat template). It learns from the train split the source's
dataset trains on, never the validation documents, on which its bytes per token against GPT-2's
is printed and kept in meta.json; FineWeb-Edu as nanochat's tok_train.py reads it. The same corpus
and settings give a byte-identical tokenizer.json; a folder holding a different tokenizer of that
name is replaced only with force=True (--force). Reference: docs/tokenizers.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from jaxgpt.data.encode import encode_documents
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import fineweb_edu
from jaxgpt.data.sources.parquet import parquet_documents
from jaxgpt.data.storage.shards import _remove_stale, dataset_lock
from jaxgpt.data.tokenizer import (
    EOT_TEXT,
    ROLE_TOKENS,
    TOKENIZER_FILE,
    TOKENIZER_NAMES,
    GPT2Tokenizer,
    Tokenizer,
    TokenizerError,
    TrainedTokenizer,
    check_name,
    trained_dir,
)
from jaxgpt.files import fsync
from jaxgpt.preparation.prepare import FINEWEB, FINEWEB_EDU, SOURCES, _corpus, resolve_options

# nanochat's GPT-4-style split: \p{N}{1,2} rather than GPT-4's {1,3}, which wastes fewer tokens on
# numbers at small vocabulary sizes (nanochat/tokenizer.py).
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
META_FILE = "meta.json"
FORMAT_VERSION = 1
SPECIAL_TOKENS = (EOT_TEXT, *ROLE_TOKENS)
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # every byte, then the specials
MAX_VOCAB = 1 << 20  # far past any useful size; larger is a typo
# Sources whose documents are read here (FineWeb-10B arrives as GPT-2 ids: nothing to learn from).
TEXT_SOURCES = tuple(s for s in SOURCES if s != FINEWEB)
_FROM_SOURCES = ("tinyshakespeare", FINEWEB_EDU)
# FineWeb-Edu: nanochat's scripts/tok_train.py defaults (the first 2B characters of the train shards,
# each document cut to 10,000 characters); compression on the first 10M characters of whole documents
# of the fixed validation shard (~a 25th of it: a stable figure in seconds).
EDU_OPTIONS = {"max_chars": 2_000_000_000, "doc_cap": 10_000}
EDU_VAL_CHARS = 10_000_000
_CHUNK_CHARS = 1 << 25  # characters of validation documents held at once while measuring compression


def check_vocab_size(vocab_size: object) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise TokenizerError(
            f"--vocab-size must be a whole number in {MIN_VOCAB}..{MAX_VOCAB} (256 bytes + "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size!r}"
        )
    return vocab_size


def _hf_bpe(vocab_size: int, progress: bool) -> tuple[Any, Any]:
    """An untrained tokenizer and its trainer (nanochat's HuggingFaceTokenizer.train_from_iterator)."""
    from tokenizers import Regex, decoders, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = HFTokenizer(BPE(byte_fallback=True, unk_token=None, fuse_unk=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = None
    # The special tokens are added after training, so they take the last ids (end-of-text first).
    trainer = BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        show_progress=progress,
        min_frequency=0,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    return tok, trainer


class _Counted:
    """Passes documents through, counting them and their UTF-8 bytes (for meta.json)."""

    def __init__(self, documents: Iterable[str]) -> None:
        self.documents, self.count, self.bytes = documents, 0, 0

    def __iter__(self) -> Iterator[str]:
        for doc in self.documents:
            self.count += 1
            self.bytes += len(doc.encode("utf-8"))
            yield doc


def _chunks(documents: Iterable[str]) -> Iterator[list[str]]:
    """Consecutive lists of documents of about _CHUNK_CHARS characters: memory stays bounded while
    each tokenizer gets batches large enough to keep every core busy."""
    chunk: list[str] = []
    size = 0
    for doc in documents:
        chunk.append(doc)
        size += len(doc)
        if size >= _CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def compression(documents: Iterable[str], tokenizers: dict[str, Tokenizer]) -> dict[str, Any]:
    """Bytes per token of each tokenizer over the same documents (no end-of-text), streamed in chunks."""
    n_docs, n_bytes, tokens = 0, 0, dict.fromkeys(tokenizers, 0)
    for chunk in _chunks(documents):
        n_docs += len(chunk)
        n_bytes += sum(len(doc.encode("utf-8")) for doc in chunk)
        for key, tok in tokenizers.items():  # prepare.py's encoder, as the dataset is encoded
            tokens[key] += sum(int(ids.size) for ids in encode_documents(tok, chunk, eot=False))
    return {
        "documents": n_docs,
        "bytes": n_bytes,
        **{key: {"tokens": n, "bytes_per_token": n_bytes / n if n else None} for key, n in tokens.items()},
    }


def _request(source: str, options: dict, fingerprint: str, vocab_size: int) -> dict[str, Any]:
    """What decides the tokenizer: a folder whose meta.json records the same request is reused."""
    return {
        "format": FORMAT_VERSION,
        "source": source,
        "options": options,
        "fingerprint": fingerprint,
        "vocab_size": vocab_size,
        "split_pattern": SPLIT_PATTERN,
        "special_tokens": list(SPECIAL_TOKENS),
    }


def read_meta(folder: Path) -> dict[str, Any] | None:
    """A tokenizer folder's meta.json, or None when it has none that parses."""
    try:
        meta = json.loads((Path(folder) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _existing(folder: Path, request: dict[str, Any], name: str, force: bool) -> bool:
    """True when `folder` already holds the tokenizer `request` asks for; TokenizerError when it holds
    another one and force is off (a dataset or run made with it would otherwise change under it)."""
    if not folder.exists():
        return False
    meta = read_meta(folder)
    if meta is not None and (folder / TOKENIZER_FILE).is_file() and {k: meta.get(k) for k in request} == request:
        return True
    if force:
        return False
    if meta is None:
        what = f"no readable {META_FILE}"
    else:  # the first setting that differs: the corpus itself (fingerprint) changes with any edit of its files
        key = next((k for k in request if meta.get(k) != request[k]), None)
        what = f"its {key} is {meta.get(key)!r}, now {request[key]!r}" if key else f"no {TOKENIZER_FILE}"
    raise TokenizerError(
        f"{folder}: already holds a different tokenizer {name!r} ({what}); pass --force to "
        "replace it (datasets prepared with it are then rebuilt) or choose another name"
    )


def _replace(tmp: Path, folder: Path) -> None:
    """Move the finished tmp folder into place; an old folder is moved aside first, removed after."""
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    if folder.exists():
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def train_tokenizer(
    name: str,
    source: str,
    data_root: Path,
    *,
    vocab_size: int,
    options: dict | None = None,
    from_path: Path | None = None,
    force: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] = print,
    edu_val_chars: int = EDU_VAL_CHARS,
) -> Path:
    """Train (or reuse) the tokenizer `name` on `source`'s train split; returns its folder,
    data_root/tokenizers/<name>. Every bad input is a one-line TokenizerError or DataError, raised
    before training. progress: tokenizers' progress bars (None: when stdout is a terminal).
    edu_val_chars: FineWeb-Edu's compression is measured on the validation shard's first documents
    up to this many characters."""
    _check_request(name, source, vocab_size, from_path)
    resolved, fingerprint, splits = _source(
        source, options, data_root, from_path, log, edu_val_chars
    )  # bad paths fail here
    folder = trained_dir(name, data_root)
    request = _request(source, resolved, fingerprint, vocab_size)
    with dataset_lock(folder, log):
        if _existing(folder, request, name, force):
            log(f"reusing tokenizer {folder} (trained with these settings on this corpus)")
            return folder
        started = time.perf_counter()
        train_docs, val_docs, how = splits()
        hf, trainer = _hf_bpe(vocab_size, sys.stdout.isatty() if progress is None else progress)
        seen = _Counted(train_docs)
        log(f"training a {vocab_size}-token byte-level BPE on the {source} train split ...")
        hf.train_from_iterator(seen, trainer)
        hf.add_special_tokens(list(SPECIAL_TOKENS))
        tok, figures = _save(folder, name, hf, request, seen, val_docs, how, log)
    log(
        f"saved {folder}: {tok.n_vocab} tokens (end-of-text id {tok.eot_id}), trained on {seen.count:,} "
        f"documents / {seen.bytes:,} bytes in {time.perf_counter() - started:.1f} s"
    )
    log(compression_line(figures))
    return folder


def _check_request(name: str, source: str, vocab_size: int, from_path: Path | None) -> None:
    """The arguments checked before anything is read: a one-line TokenizerError or DataError."""
    check_name(name)
    if name in TOKENIZER_NAMES:
        raise TokenizerError(f"tokenizer name {name!r} is built in; choose another name for a trained one")
    if source not in TEXT_SOURCES:
        raise DataError(f"cannot train a tokenizer on {source!r}; choose one of {', '.join(TEXT_SOURCES)}")
    check_vocab_size(vocab_size)
    if from_path is not None and source not in _FROM_SOURCES:
        raise DataError(f"{source}: --from applies only to {' and '.join(_FROM_SOURCES)}")


def _save(
    folder: Path,
    name: str,
    hf: Any,
    request: dict[str, Any],
    seen: _Counted,
    val_docs: Iterator[str],
    how: str,
    log: Callable[[str], None],
) -> tuple[TrainedTokenizer, dict[str, Any]]:
    """Write the trained tokenizer and its meta.json (with its compression on the validation
    documents) into a temporary folder, then swap it in whole: a kill never leaves half a tokenizer
    current. Returns the tokenizer as measured and the compression figures."""
    vocab_size = request["vocab_size"]
    _remove_stale(folder)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        (tmp / TOKENIZER_FILE).write_text(hf.to_str(pretty=True), encoding="utf-8")
        tok = TrainedTokenizer(name, tmp / TOKENIZER_FILE)  # measured as it will be used
        if tok.n_vocab < vocab_size:
            log(
                f"note: the train split has only enough distinct pairs for {tok.n_vocab} tokens, "
                f"fewer than the {vocab_size} asked for"
            )
        others = _gpt2(log)
        figures = compression(val_docs, {"tokenizer": tok, **others})
        meta = {
            **request,
            "name": name,
            "n_vocab": tok.n_vocab,
            "eot_id": tok.eot_id,
            "sha256": tok.sha256,
            "library": f"tokenizers {_version()}",
            "train_split": {"documents": seen.count, "bytes": seen.bytes},
            "validation_split": how,
            "compression": figures,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        for path in (tmp / TOKENIZER_FILE, tmp / META_FILE, tmp):  # on disk before the rename makes them current
            fsync(path)
        _replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok, figures


Splits = Callable[[], tuple[Iterator[str], Iterator[str], str]]


def _source(
    source: str,
    options: dict | None,
    data_root: Path,
    from_path: Path | None,
    log: Callable[[str], None],
    edu_val_chars: int,
) -> tuple[dict, str, Splits]:
    """(resolved options, corpus fingerprint, the function that opens the train and validation documents)."""
    if source == FINEWEB_EDU:
        return _fineweb_edu(options, data_root, from_path, log, edu_val_chars)
    resolved = resolve_options(source, options)
    corpus = _corpus(source, resolved, data_root, from_path, log)
    return resolved, corpus.fingerprint, lambda: _splits(corpus, resolved["validation_fraction"])


def _fineweb_edu(
    options: dict | None, data_root: Path, from_dir: Path | None, log: Callable[[str], None], val_chars: int
) -> tuple[dict, str, Splits]:
    """nanochat's tokenizer corpus: the train files' first max_chars characters, documents cut to
    doc_cap. The files are chosen (and fetched) one by one by counting their characters first, so the
    fingerprint (their names and sizes) is known before the reuse check; the text is read again to train.
    Validation: the validation file's first documents up to val_chars characters."""
    unknown = sorted(set(options or {}) - set(EDU_OPTIONS))
    if unknown:
        raise DataError(f"{FINEWEB_EDU}: unknown tokenizer option {unknown[0]!r} (known: {', '.join(EDU_OPTIONS)})")
    resolved = {**EDU_OPTIONS, **(options or {})}
    for key, value in resolved.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{FINEWEB_EDU}: --{key.replace('_', '-')} must be a positive whole number, got {value!r}")
    downloads = Path(data_root) / "downloads" / FINEWEB_EDU
    paths = fineweb_edu.tokenizer_files(
        resolved["max_chars"], resolved["doc_cap"], from_dir=from_dir, downloads=downloads, log=log
    )
    fingerprint = " ".join(f"{path.name}:{path.stat().st_size}" for path in paths)

    def splits() -> tuple[Iterator[str], Iterator[str], str]:
        val = fineweb_edu.locate(fineweb_edu.VAL_FILE, from_dir=from_dir, downloads=downloads, log=log)
        how = f"the fixed validation file {fineweb_edu.VAL_FILE}: its first {val_chars:,} characters of documents"
        return (
            fineweb_edu.capped_documents(paths, resolved["max_chars"], resolved["doc_cap"]),
            _first_chars(parquet_documents(val, fineweb_edu.TEXT_COLUMN), val_chars),
            how,
        )

    return resolved, fingerprint, splits


def _first_chars(documents: Iterable[str], limit: int) -> Iterator[str]:
    """Whole documents, in order, until they hold `limit` characters."""
    chars = 0
    for doc in documents:
        if chars >= limit:
            return
        chars += len(doc)
        yield doc


def _splits(corpus: Any, fraction: float) -> tuple[Iterator[str], Iterator[str], str]:
    """(train documents, validation documents, how validation was chosen): the dataset's own hold-out.
    The corpus comes as one stream of (held out?, document); validation is read again, after training."""
    routed, how = corpus.documents(fraction)

    def validation() -> Iterator[str]:
        again, _ = corpus.documents(fraction)
        yield from (doc for held, doc in again if held)

    return (doc for held, doc in routed if not held), validation(), how


def compression_line(figures: dict[str, Any]) -> str:
    """The compression report: this tokenizer's bytes per token against GPT-2's on the validation split."""
    mine = figures["tokenizer"]["bytes_per_token"]
    line = (
        f"compression on the validation split ({figures['documents']:,} documents, {figures['bytes']:,} bytes): "
        f"{mine:.3f} bytes per token"
    )
    gpt2 = figures.get("gpt2")
    if gpt2 is None:
        return line + "; gpt2 not measured (tiktoken's gpt2 files not available)"
    return line + f" against gpt2's {gpt2['bytes_per_token']:.3f} ({mine / gpt2['bytes_per_token']:.2f}x)"


def _gpt2(log: Callable[[str], None]) -> dict[str, Tokenizer]:
    """GPT-2 to compare with, when tiktoken has its files (offline without them: no comparison)."""
    try:
        return {"gpt2": GPT2Tokenizer()}
    except TokenizerError as exc:
        log(f"note: no gpt2 comparison ({str(exc)[:100]}...)")
        return {}


def _version() -> str:
    import tokenizers

    return tokenizers.__version__
