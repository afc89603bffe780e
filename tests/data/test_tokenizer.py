"""Tokenizers: bytes round trips (non-ASCII, end-of-text) and GPT-2 ids from the shared tiktoken cache."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import SHARED

from jaxgpt.data.tokenizer import BytesTokenizer, TokenizerError, get_tokenizer

TIKTOKEN_CACHE = SHARED / "tiktoken-cache"
TEXTS = ["Every effort moves you", "héllo wörld — 日本語 🙂\n\ttabs", "", "<|endoftext|> is plain text here"]


@pytest.fixture
def gpt2(monkeypatch: pytest.MonkeyPatch):
    if not TIKTOKEN_CACHE.is_dir():
        pytest.skip(f"no tiktoken cache at {TIKTOKEN_CACHE} (the gpt2 files cannot be fetched offline)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE.resolve()))
    return get_tokenizer("gpt2")


def test_bytes_tokenizer_basics() -> None:
    tok = get_tokenizer("bytes")
    assert (tok.name, tok.n_vocab, tok.eot_id) == ("bytes", 257, 256)
    assert tok.encode("AB") == [65, 66]


@pytest.mark.parametrize("text", TEXTS)
def test_bytes_round_trip(text: str) -> None:
    tok = get_tokenizer("bytes")
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)  # "<|endoftext|>" in the text never becomes the eot id
    assert tok.decode(ids) == text
    (batch,) = tok.encode_batch([text])
    assert batch.tolist() == ids


def test_bytes_decode_drops_eot_and_replaces_bad_utf8() -> None:
    tok = BytesTokenizer()
    assert tok.decode([104, 105, 256, 33, 256]) == "hi!"
    assert tok.decode(np.array([104, 105], dtype=np.int32)) == "hi"  # arrays, as a model emits them
    # A model can stop half-way through a multi-byte character: decode must not raise.
    cut = "é".encode("utf-8")[:1]
    assert tok.decode(list(b"a" + cut + b"b")) == "a\ufffdb"


@pytest.mark.parametrize("bad", [257, -1, 1000])
def test_bytes_decode_rejects_out_of_range_ids(bad: int) -> None:
    with pytest.raises(TokenizerError, match=str(bad)):
        BytesTokenizer().decode([65, bad])


def test_unknown_tokenizer() -> None:
    with pytest.raises(TokenizerError, match="'sentencepiece'"):
        get_tokenizer("sentencepiece")


def test_gpt2_known_ids(gpt2) -> None:
    assert (gpt2.name, gpt2.n_vocab, gpt2.eot_id) == ("gpt2", 50257, 50256)
    assert gpt2.encode("Every effort moves you") == [6109, 3626, 6100, 345]


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_round_trip(gpt2, text: str) -> None:
    ids = gpt2.encode(text)
    assert gpt2.eot_id not in ids  # encode_ordinary: the special string is split into ordinary tokens
    assert gpt2.decode(ids) == text
    (batch,) = gpt2.encode_batch([text])
    assert batch.dtype == np.uint16 and batch.tolist() == ids


def test_gpt2_batch_repairs_lone_surrogates_as_encode_ordinary(gpt2) -> None:
    text = "half a pair \ud800 here"  # JSON "\ud800" reads as this; UTF-8 cannot hold it
    (batch,) = gpt2.encode_batch([text])
    assert batch.tolist() == gpt2._enc.encode_ordinary(text) and batch.size > 0


def test_tokenizers_pickle_small(gpt2) -> None:
    """Picklable (a worker process or a saved object can take one), by name: not the 50k-entry vocabulary."""
    for tok in (gpt2, get_tokenizer("bytes")):
        data = pickle.dumps(tok)
        again = pickle.loads(data)
        assert len(data) < 1000 and (again.name, again.n_vocab, again.eot_id) == (tok.name, tok.n_vocab, tok.eot_id)
        assert again.encode("Every effort moves you") == tok.encode("Every effort moves you")


def test_gpt2_eot_and_bad_ids(gpt2) -> None:
    assert gpt2.decode([6109, gpt2.eot_id]) == "Every<|endoftext|>"
    with pytest.raises(TokenizerError, match="50257"):
        gpt2.decode([50257])


def test_gpt2_offline_without_cache_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    tiktoken = pytest.importorskip("tiktoken")

    def offline(name: str):
        raise OSError("Failed to resolve host\n(second line of a long traceback)")

    # Patched rather than pointing at an empty cache: a machine with network would simply download.
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/nonexistent-cache")
    with pytest.raises(TokenizerError) as info:
        get_tokenizer("gpt2")
    message = str(info.value)
    assert "\n" not in message
    assert "TIKTOKEN_CACHE_DIR=/nonexistent-cache" in message and "Failed to resolve host" in message
