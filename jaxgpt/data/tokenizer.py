"""Tokenizers: raw UTF-8 bytes (offline, vocab 257) and GPT-2 BPE (tiktoken, vocab 50257).

    from jaxgpt.data.tokenizer import get_tokenizer
    tok = get_tokenizer("bytes")          # or "gpt2"
    ids = tok.encode("héllo")             # list[int]
    text = tok.decode(ids)

Both tokenizers encode text as *ordinary* text: the literal string "<|endoftext|>" is never turned
into the end-of-text id. Documents are separated by appending `eot_id` explicitly (see
download_dataset.py), so no text in a corpus can forge a document boundary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

TOKENIZER_NAMES = ("bytes", "gpt2")
# GPT-2's vocabulary, for data that arrives already tokenized (no tiktoken files needed to use it).
GPT2_N_VOCAB, GPT2_EOT_ID = 50257, 50256


_GPT2_FILES_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"


class TokenizerError(ValueError):
    """A tokenizer cannot be built or cannot decode the ids it was given (one-line message)."""


class Tokenizer(Protocol):
    name: str
    n_vocab: int
    eot_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (no end-of-text added), as 1-D integer arrays; fast path for datasets.

        tokenize_documents calls it from one thread per core at once (jaxgpt/data/encode.py): it
        must be thread-safe, and scales when its heavy part drops the GIL (native code does).
        """
        ...


class BytesTokenizer:
    """Ids 0..255 are the UTF-8 bytes of the text; 256 is end-of-text.

    Needs no files, so the whole pipeline works offline. Decoding drops end-of-text ids and
    replaces invalid UTF-8 (a model may emit half a multi-byte character) with U+FFFD.
    """

    name = "bytes"
    n_vocab = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # np.frombuffer views the encoded bytes without a per-byte Python loop: MBs in milliseconds.
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        arr = arr[arr != self.eot_id]
        bad = arr[(arr < 0) | (arr > 255)]
        if bad.size:
            raise TokenizerError(f"bytes tokenizer: cannot decode id {int(bad[0])} (valid ids are 0..256)")
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2's byte-level BPE through tiktoken (ids 0..50256, end-of-text 50256).

    Decoding keeps end-of-text as the text "<|endoftext|>" (tiktoken's behaviour), which makes
    document boundaries visible in samples.
    """

    name = "gpt2"

    def __init__(self) -> None:
        import tiktoken  # imported here so the bytes tokenizer works without tiktoken's files

        try:
            # tiktoken keeps loaded encodings in a registry, so a second call costs nothing.
            self._enc = tiktoken.get_encoding("gpt2")
        except (OSError, ValueError) as exc:  # requests' ConnectionError is an OSError
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
            raise TokenizerError(
                f"gpt2 tokenizer: tiktoken could not load its 'gpt2' files, vocab.bpe and encoder.json from "
                f"{_GPT2_FILES_URL} (TIKTOKEN_CACHE_DIR={cache}; {type(exc).__name__}: {first_line[:120]}); "
                "fetch them once with network access (python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" "
                "with TIKTOKEN_CACHE_DIR set) and point TIKTOKEN_CACHE_DIR at that folder"
            ) from None
        self.n_vocab: int = self._enc.n_vocab
        self.eot_id: int = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_to_numpy hands back tiktoken's own uint32 buffer: no Python int per token (their
        # making holds the GIL), so tokenize_documents' threads encode on every core at once.
        # With nothing allowed and nothing disallowed, "<|endoftext|>" in a text stays text:
        # exactly encode_ordinary's ids.
        return [self._encode_array(text).astype(np.uint16) for text in texts]  # n_vocab 50257 fits in uint16

    def _encode_array(self, text: str) -> np.ndarray:
        try:
            return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
        except UnicodeEncodeError:  # lone surrogates (JSON "\ud800"): encode_ordinary's own repair
            return np.asarray(self._enc.encode_ordinary(text), dtype=np.uint32)

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = arr[(arr < 0) | (arr >= self.n_vocab)]
        if bad.size:
            raise TokenizerError(
                f"gpt2 tokenizer: cannot decode id {int(bad[0])} (valid ids are 0..{self.n_vocab - 1})")
        return self._enc.decode(arr.tolist(), errors="replace")


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called `name` ("bytes" or "gpt2"); TokenizerError for any other name."""
    if name == "bytes":
        return BytesTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise TokenizerError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZER_NAMES)}")
