"""Tokenizing documents on every core, in their order: what dataset preparation and BPE counting call.

    for doc in encode_documents(get_tokenizer("gpt2"), texts, eot=True):   # uint16 arrays, eot appended
        ...

The caller's thread reads the documents and cuts them into chunks of about CHUNK_BYTES; a thread
per core encodes them. Results come back in the documents' order, the same whatever the threads;
an error (bad UTF-8, malformed JSON, a tokenizer's) is raised in the caller, nothing left running.
At most 2 chunks per thread are in flight: memory stays bounded.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from jaxgpt.data.storage.shards import token_dtype
from jaxgpt.data.tokenizer import Tokenizer

CHUNK_BYTES = 1 << 20  # text per encode_batch call: ~0.1 s of tiktoken on one core, few calls per second
CHUNK_DOCUMENTS = 1024  # and at most this many documents (many tiny ones: bounded Python lists)
_IN_FLIGHT = 2  # chunks queued per thread: one running, one ready, so no thread waits for the reader


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def text_bytes(text: str) -> int:
    """UTF-8 size of `text`; free for ASCII text (CPython knows a string is ASCII without looking)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Progress:
    """A progress bar on stderr counting text bytes (MB/s) and tokens (tokens/s) across calls;
    by default only where stderr is a terminal (tqdm's own rule), so logs and tests stay clean."""

    def __init__(self, desc: str = "tokenizing", enabled: bool | None = None) -> None:
        self.started = time.perf_counter()
        self.tokens = 0
        self.bar = None
        if enabled if enabled is not None else sys.stderr.isatty():
            from tqdm import tqdm  # here: importing it costs a small corpus's preparation ~40 ms

            self.bar = tqdm(
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                dynamic_ncols=True,
                file=sys.stderr,
                mininterval=0.5,
            )

    def update(self, nbytes: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate / 1e6:.2f}M tokens/s", refresh=False)
            self.bar.update(nbytes)

    def restart(self) -> None:
        """Count from zero again (a corpus read a second time)."""
        self.started, self.tokens = time.perf_counter(), 0
        if self.bar is not None:
            self.bar.reset()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _chunks(documents: Iterable[str], chunk_bytes: int, chunk_documents: int) -> Iterator[tuple[list[str], int]]:
    """(documents, their UTF-8 bytes), about chunk_bytes (at most chunk_documents documents) at a time, in order."""
    chunk: list[str] = []
    size = 0
    for doc in documents:
        chunk.append(doc)
        size += text_bytes(doc)
        if size >= chunk_bytes or len(chunk) >= chunk_documents:
            yield chunk, size
            chunk, size = [], 0
    if chunk:
        yield chunk, size


def _encode_chunk(tokenizer: Tokenizer, chunk: list[str], dtype: np.dtype, eot: bool) -> list[np.ndarray]:
    """Each document's ids in `dtype`, followed by end-of-text when `eot` (runs in a pool thread)."""
    out = []
    for ids in tokenizer.encode_batch(chunk):
        doc = np.empty(ids.size + int(eot), dtype=dtype)
        doc[: ids.size] = ids
        if eot:
            doc[-1] = tokenizer.eot_id
        out.append(doc)
    return out


def encode_documents(
    tokenizer: Tokenizer,
    documents: Iterable[str],
    *,
    eot: bool = True,
    workers: int | None = None,
    progress: Progress | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    chunk_documents: int = CHUNK_DOCUMENTS,
) -> Iterator[np.ndarray]:
    """One token array per document, in order (see the module docstring); workers: threads
    (default: every core; 1 encodes in the calling thread, no pool); chunk_bytes, chunk_documents:
    the text of one encode_batch call (the defaults; a test passes small ones to make many chunks)."""
    dtype = token_dtype(tokenizer.n_vocab)
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        for chunk, size in _chunks(documents, chunk_bytes, chunk_documents):
            encoded = _encode_chunk(tokenizer, chunk, dtype, eot)
            if progress is not None:
                progress.update(size, sum(doc.size for doc in encoded))
            yield from encoded
        return
    pending: collections.deque[tuple[Future[list[np.ndarray]], int]] = collections.deque()
    # The pool's threads are joined when this generator ends, fails or is closed; queued chunks are
    # cancelled first, so an error or Ctrl-C waits for at most the chunks already running.
    pool = ThreadPoolExecutor(workers, thread_name_prefix="tokenize")
    try:
        for chunk, size in _chunks(documents, chunk_bytes, chunk_documents):
            pending.append((pool.submit(_encode_chunk, tokenizer, chunk, dtype, eot), size))
            if len(pending) >= _IN_FLIGHT * workers:
                yield from _done(pending.popleft(), progress)
        while pending:
            yield from _done(pending.popleft(), progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _done(item: tuple[Future[list[np.ndarray]], int], progress: Progress | None) -> list[np.ndarray]:
    future, size = item
    encoded = future.result()  # a tokenizer's exception is raised here, in the caller's thread
    if progress is not None:
        progress.update(size, sum(doc.size for doc in encoded))
    return encoded
