"""Tokenizers: raw UTF-8 bytes (offline, vocab 257), GPT-2 BPE (tiktoken, vocab 50257) and byte-level
BPEs trained on a corpus (jaxgpt/preparation/bpe.py), each used by name.

    from jaxgpt.data.tokenizer import get_tokenizer
    tok = get_tokenizer("bytes")          # or "gpt2", or a trained one: <data root>/tokenizers/<name>/
    ids = tok.encode("héllo")             # list[int]
    text = tok.decode(ids)

Every tokenizer encodes text as ordinary text: the literal "<|endoftext|>" never becomes the
end-of-text id, so no text can forge a document boundary (`eot_id` is appended explicitly).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jaxgpt.config import TOKENIZER_NAME as TRAINED_NAME
from jaxgpt.data.root import default_data_root

TOKENIZER_NAMES = ("bytes", "gpt2")  # built in; any other valid name is a trained tokenizer's
TOKENIZERS_DIR = "tokenizers"  # under the data root
TOKENIZER_FILE = "tokenizer.json"  # the Hugging Face tokenizers file, in its folder and in each checkpoint
EOT_TEXT = "<|endoftext|>"
# nanochat's role tokens (nanochat/tokenizer.py), added after end-of-text to every tokenizer trained here
# (bpe.py), for its chat template (jaxgpt/conversations/template.py); nanochat's <|bos|> is our end-of-text.
ROLE_TOKENS = ("<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>")
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

        encode_documents calls it from one thread per core at once (jaxgpt/data/encode.py): it
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
        # making holds the GIL), so encode_documents' threads encode on every core at once.
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
                f"gpt2 tokenizer: cannot decode id {int(bad[0])} (valid ids are 0..{self.n_vocab - 1})"
            )
        return self._enc.decode(arr.tolist(), errors="replace")


class TrainedTokenizer:
    """A byte-level BPE trained on a corpus (jaxgpt/preparation/bpe.py), run by Hugging Face `tokenizers`.

    Every byte is a token of its own, so any text encodes; end-of-text is the last id, a special
    token that `encode` never produces from text (encode_special_tokens: "<|endoftext|>" in a
    document is split like any other text). Decoding keeps it as the text "<|endoftext|>", as gpt2
    does. Pickles as its name and tokenizer.json bytes, so it can be shipped to worker processes.
    """

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise TokenizerError(f"{self.path}: cannot read tokenizer {name!r} ({exc.strerror or exc})") from None
        self._load(data)

    def _load(self, data: bytes) -> None:
        from tokenizers import Tokenizer as HFTokenizer  # imported here: bytes and gpt2 do not need it

        self.data = data  # the file as read: checkpoints keep a copy, byte for byte
        self.sha256 = hashlib.sha256(data).hexdigest()  # datasets and checkpoints record which file made them
        try:
            self._tok = HFTokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file (and UnicodeDecodeError)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TokenizerError(f"{self.path}: not a tokenizers tokenizer.json ({first[:120]})") from None
        eot = self._tok.token_to_id(EOT_TEXT)
        if eot is None:
            raise TokenizerError(f"{self.path}: has no {EOT_TEXT} token (train it with download_dataset.py tokenizer)")
        self._tok.encode_special_tokens = True  # "<|endoftext|>" in text is ordinary text (not saved in the file)
        self.eot_id: int = eot
        # Every added token by name: end-of-text and, in tokenizers trained since they were added,
        # nanochat's role tokens (jaxgpt/conversations/template.py).
        self.special_ids: dict[str, int] = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        self.n_vocab: int = self._tok.get_vocab_size(with_added_tokens=True)
        self._dtype = np.uint16 if self.n_vocab <= 1 << 16 else np.uint32

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "data": self.data}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.path = state["name"], Path(state["path"])
        self._load(state["data"])

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast: tokenizers' threads (Rust, no GIL) share the batch; no character offsets computed.
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=self._dtype) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = arr[(arr < 0) | (arr >= self.n_vocab)]
        if bad.size:  # tokenizers would skip them silently
            raise TokenizerError(
                f"{self.name} tokenizer: cannot decode id {int(bad[0])} (valid ids are 0..{self.n_vocab - 1})"
            )
        # The ByteLevel decoder replaces invalid UTF-8 (half a character) with U+FFFD.
        return self._tok.decode(arr.tolist(), skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """(n_vocab,) bytes of text behind each id (special tokens 0): byte-level tokens spell one
        character per byte, which decoding one id alone would miscount for a part of a character."""
        lengths = np.array([len(self._tok.id_to_token(i)) for i in range(self.n_vocab)], np.int64)
        for i in self._tok.get_added_tokens_decoder():
            lengths[i] = 0
        return lengths


def special_tokens(tok: Tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens by name ("<|endoftext|>" -> its id, ...): what a chat template's
    literal text may name (jaxgpt/conversations/template.py). Text is never encoded into them."""
    return dict(getattr(tok, "special_ids", None) or {EOT_TEXT: tok.eot_id})


SPECIAL_NAME = re.compile(r"(<\|[A-Za-z0-9_]+\|>)")  # "<|endoftext|>", "<|user_start|>", ...


def encode_with_specials(tok: Tokenizer, text: str) -> list[int]:
    """Text whose special-token names become their ids and the rest ordinary text: a chat template's
    own literal parts, and what transformers' tokenizers and vLLM's /tokenize read."""
    specials = special_tokens(tok)
    ids: list[int] = []
    for piece in SPECIAL_NAME.split(text):
        if piece in specials:
            ids.append(specials[piece])
        elif piece:
            ids.extend(tok.encode(piece))
    return ids


def trained_dir(name: str, data_root: Path | None = None) -> Path:
    """<data root>/tokenizers/<name>: where `download_dataset.py tokenizer` saves a trained tokenizer."""
    return Path(default_data_root() if data_root is None else data_root) / TOKENIZERS_DIR / name


def check_name(name: object) -> str:
    """A tokenizer name as train.json and the commands take it; TokenizerError otherwise."""
    if not isinstance(name, str) or not TRAINED_NAME.fullmatch(name):
        raise TokenizerError(
            f"tokenizer name must be 'bytes', 'gpt2' or a trained tokenizer's name (letters, "
            f"digits, '.', '_' or '-'), got {name!r}"
        )
    return name


def get_tokenizer(name: str, data_root: Path | None = None, *, file: Path | None = None) -> Tokenizer:
    """The tokenizer called `name`: "bytes", "gpt2", or a trained one read from `file` (a copy saved
    in a checkpoint) or else from <data_root>/tokenizers/<name>/tokenizer.json (data_root: see
    trained_dir). TokenizerError, naming the folder and the command that makes it, when it is missing."""
    if name == "bytes":
        return BytesTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    check_name(name)
    if file is not None:
        return TrainedTokenizer(name, file)
    folder = trained_dir(name, data_root)
    if not (folder / TOKENIZER_FILE).is_file():
        raise TokenizerError(
            f"tokenizer {name!r} not found: {folder} has no {TOKENIZER_FILE}; train it with "
            f"`download_dataset.py tokenizer {name} <source> --vocab-size N` (docs/tokenizers.md)"
        )
    return TrainedTokenizer(name, folder / TOKENIZER_FILE)
