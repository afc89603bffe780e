"""Our tokenizers as transformers' files (tokenizer.json + tokenizer_config.json), and back, without
JAX or transformers: the tokenizer half of both exports (nanochat_hf.py, gpt2.py).

An export writes one `tokenizers` tokenizer.json that `transformers.AutoTokenizer` loads, whatever
the run's tokenizer:

    "gpt2"     GPT-2's byte-level BPE, from the encoder.json and vocab.bpe in tiktoken's cache
    "bytes"    a BPE with no merges over 256 entries, byte b -> id b, and <|endoftext|> = 256
    a trained  the tokenizer.json the checkpoint keeps (or the data root's), byte for byte

An import recognises GPT-2's and the bytes tokenizer by their whole vocabulary (and merges) and
takes any other as a trained one. One with no <|endoftext|> (karpathy/nanochat's, whose documents
begin with <|bos|>) has its bos token renamed <|endoftext|>: the same id, the same encodings.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from jaxgpt.checkpoints.layout import checkpoint_tokenizer, write_json
from jaxgpt.data.tokenizer import EOT_TEXT, GPT2Tokenizer, TokenizerError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"


class ConversionError(ValueError):
    """A run that has no NanoChat form, or a Hugging Face folder that is not ours to import (one line)."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (byte-level BPE vocabularies are written in it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(chars.items()))


# ----------------------------------------------------------------------------- building tokenizer.json


def _gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) as tiktoken caches them: the file named sha1(url) in its cache folder
    (tiktoken/load.py read_file_cached). Building our GPT2Tokenizer first fetches them if missing, or
    fails with its own one-line message saying how to get them."""
    GPT2Tokenizer()
    folder = (
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or os.environ.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )
    encoder, merges = (
        Path(folder) / hashlib.sha1(f"{_TIKTOKEN_URL}{name}".encode()).hexdigest()
        for name in ("encoder.json", "vocab.bpe")
    )
    missing = [p for p in (encoder, merges) if not p.is_file()]
    if missing:
        raise ConversionError(
            f"{missing[0]}: tiktoken's cached GPT-2 file is missing (TIKTOKEN_CACHE_DIR="
            f"{os.environ.get('TIKTOKEN_CACHE_DIR', '<unset>')}); set TIKTOKEN_CACHE_DIR to the "
            f"folder tiktoken cached 'gpt2' in"
        )
    return encoder, merges


@cache
def gpt2_tokenizer_json() -> str:
    """GPT-2's tokenizer.json: the ids tiktoken's "gpt2" gives, <|endoftext|> = 50256 special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    encoder, merges = _gpt2_files()
    tok = Tokenizer(models.BPE.from_file(str(encoder), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex split
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return tok.to_str()


@cache
def bytes_tokenizer_json() -> str:
    """The bytes tokenizer's tokenizer.json: each UTF-8 byte its own id (no merges), <|endoftext|> = 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # no word split needed
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return tok.to_str()


def tokenizer_files(*, context_length: int, chat_template: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer_config.json, special_tokens_map.json) for a tokenizer.json holding <|endoftext|>:
    it is bos, eos and pad alike (our documents are separated by it). `chat_template`: a Jinja
    template written as transformers' "chat_template" (apply_chat_template, vLLM's chat API)."""
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "pad_token": EOT_TEXT}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": context_length,
        "add_bos_token": False,
        "add_eos_token": False,  # our encode adds nothing: documents end with eot
        "clean_up_tokenization_spaces": False,
    }  # decoding gives the text back unchanged
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config, special


def run_tokenizer_json(ckpt_dir: Path, name: str) -> str:
    """A checkpoint's tokenizer (train.json's name) as tokenizer.json text."""
    if name == "gpt2":
        return gpt2_tokenizer_json()
    if name == "bytes":
        return bytes_tokenizer_json()
    try:
        tok = checkpoint_tokenizer(ckpt_dir, name)  # the copy the checkpoint keeps, else the data root's
    except TokenizerError as e:
        raise ConversionError(f"{ckpt_dir}: {e}") from None
    return tok.data.decode("utf-8")  # type: ignore[attr-defined]  (a TrainedTokenizer: the file's bytes)


def write_tokenizer(out_dir: Path, tokenizer_json: str, *, context_length: int, chat_template: str | None) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir (tokenizer_files)."""
    tmp = Path(out_dir) / f".{TOKENIZER_FILE}.tmp"
    tmp.write_text(tokenizer_json, encoding="utf-8")
    os.replace(tmp, Path(out_dir) / TOKENIZER_FILE)
    config, special = tokenizer_files(context_length=context_length, chat_template=chat_template)
    write_json(Path(out_dir) / TOKENIZER_CONFIG, config)
    write_json(Path(out_dir) / SPECIAL_TOKENS_MAP, special)


def eot_of(tokenizer_json: str, where: str) -> tuple[int, int]:
    """(<|endoftext|> id, vocabulary size with the added tokens) of a tokenizer.json."""
    tok = _parse(tokenizer_json, where)
    eot = tok.token_to_id(EOT_TEXT)
    if eot is None:
        raise ConversionError(f"{where}: has no {EOT_TEXT} token")
    return eot, tok.get_vocab_size(with_added_tokens=True)


def _parse(tokenizer_json: str, where: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConversionError(f"{where}: not a tokenizers tokenizer.json ({first[:120]})") from None


# ----------------------------------------------------------------------------- reading a folder's tokenizer


def identify(folder: Path, hf_config: dict[str, Any]) -> tuple[str | None, str]:
    """(our tokenizer name, tokenizer.json text) for an exported folder: ("gpt2", ...) or ("bytes", ...)
    when its tokenizer is one of those, else (None, the text to keep as a trained tokenizer's file,
    with <|endoftext|> standing for the folder's bos token when it had none: module docstring)."""
    path = Path(folder) / TOKENIZER_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConversionError(
            f"{path}: not found; the import needs the folder's tokenizer as a tokenizers "
            f"tokenizer.json (convert a slow or tiktoken-only tokenizer first)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: unreadable ({e})") from None
    tok = _parse(text, str(path))  # first: a malformed file is one line naming it
    data = json.loads(text)
    if _is_bytes(data):
        return "bytes", text
    if _looks_like_gpt2(data) and _is_gpt2(data):
        return "gpt2", text
    if tok.token_to_id(EOT_TEXT) is None:
        text = _bos_as_eot(text, tok, folder, hf_config)
    return None, text


def _merges(data: dict[str, Any]) -> list[tuple[str, str]]:
    """A BPE's merges, in either of tokenizer.json's spellings ("a b" strings or [a, b] pairs)."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in data["model"].get("merges", [])]


def _vocab_with_added(data: dict[str, Any]) -> dict[str, int]:
    vocab = dict(data.get("model", {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab


def _is_bytes(data: dict[str, Any]) -> bool:
    if data.get("model", {}).get("type") != "BPE" or _merges(data):
        return False
    want = {char: b for b, char in bytes_to_unicode().items()} | {EOT_TEXT: 256}
    return _vocab_with_added(data) == want


def _looks_like_gpt2(data: dict[str, Any]) -> bool:
    """A cheap first look, so that a trained tokenizer's import never needs tiktoken's files."""
    vocab = _vocab_with_added(data)
    return (
        data.get("model", {}).get("type") == "BPE"
        and len(vocab) == 50257
        and vocab.get(EOT_TEXT) == 50256
        and vocab.get("Ġthe") == 262
    )


def _is_gpt2(data: dict[str, Any]) -> bool:
    ours = json.loads(gpt2_tokenizer_json())
    return _vocab_with_added(data) == _vocab_with_added(ours) and _merges(data) == _merges(ours)


def _bos_as_eot(text: str, tok: Any, folder: Path, hf_config: dict[str, Any]) -> str:
    """tokenizer.json text with the folder's bos token renamed <|endoftext|> (nanochat's <|bos|>):
    every occurrence of the token's string as a JSON key or value (added_tokens, the vocabulary, a
    post-processor's template), checked to keep its id and every encoding."""
    bos = _bos_token(folder, hf_config, tok)
    if bos is None:
        raise ConversionError(
            f"{Path(folder) / TOKENIZER_FILE}: has no {EOT_TEXT} token and names no bos token "
            f"(tokenizer_config.json bos_token, config.json bos_token_id) to stand for it"
        )

    def rename(node: Any) -> Any:
        if isinstance(node, dict):
            return {(EOT_TEXT if k == bos else k): rename(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(v) for v in node]
        return EOT_TEXT if node == bos else node

    where = Path(folder) / TOKENIZER_FILE
    renamed = json.dumps(rename(json.loads(text)), ensure_ascii=False, indent=2)
    new = _parse(renamed, str(where))
    sample = "Every effort moves you, 1234 héllo 日本"
    if (
        new.token_to_id(EOT_TEXT) != tok.token_to_id(bos)
        or new.encode(sample, add_special_tokens=False).ids != tok.encode(sample, add_special_tokens=False).ids
    ):
        raise ConversionError(
            f"{where}: renaming its bos token {bos!r} to {EOT_TEXT} changes its ids; "
            f"this tokenizer cannot be used as a trained tokenizer"
        )
    return renamed


def _bos_token(folder: Path, hf_config: dict[str, Any], tok: Any) -> str | None:
    """The bos token's string, a special (added) token: tokenizer_config.json's bos_token, else the
    token of config.json's bos_token_id. An ordinary token never stands for end-of-text."""
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    path = Path(folder) / TOKENIZER_CONFIG
    if path.is_file():
        bos = json.loads(path.read_text()).get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        if bos in specials:
            return bos
    bos_id = hf_config.get("bos_token_id")
    return next((text for text, i in specials.items() if i == bos_id), None)


def check_trained(text: str, where: str) -> None:
    """Our TrainedTokenizer must load the text (it needs <|endoftext|>); TokenizerError as a one-liner."""
    from jaxgpt.data.tokenizer import TrainedTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / TOKENIZER_FILE
        path.write_text(text, encoding="utf-8")
        try:
            TrainedTokenizer("check", path)
        except TokenizerError as e:
            raise ConversionError(f"{where}: {str(e).split(': ', 1)[-1]}") from None
