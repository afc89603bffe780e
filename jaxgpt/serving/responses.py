"""The OpenAI API's responses, built from the engine's pieces: whole answers and server-sent event chunks.

    out = Answers(len(choices))
    async for piece in job.pieces():
        out.add(piece)                                   # whole answers: text, logprobs, finish_reason
    completion_response(meta, out, prompt_tokens, tok)   # {"object": "text_completion", ...}
    completion_chunk(meta, piece, tok)                   # one streamed chunk

Logprobs take OpenAI's two shapes: the legacy completions' parallel lists (tokens, token_logprobs,
top_logprobs, text_offset: what lm-eval's local-completions reads; a prompt's first token has no
logprob, null) and chat's list of {token, logprob, bytes, top_logprobs}.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.generation.sampling import TokenLogprob
from jaxgpt.generation.text import token_bytes, token_text
from jaxgpt.serving.worker import Piece


@dataclass(frozen=True)
class Meta:
    """What every response and chunk of one request repeats."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> Meta:
        return cls(f"{prefix}-{secrets.token_hex(12)}", int(time.time()), model)


@dataclass
class Answer:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


class Answers:
    """Each choice's pieces joined: the whole answers of a request that is not streamed."""

    def __init__(self, n: int) -> None:
        self.answers = [Answer() for _ in range(n)]

    def add(self, piece: Piece) -> None:
        a = self.answers[piece.index]
        a.text += piece.text
        a.logprobs.extend(piece.logprobs)
        if piece.finish_reason is not None:
            a.finish_reason, a.completion_tokens = piece.finish_reason, piece.completion_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.answers)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(entries: list[TokenLogprob], tok: Tokenizer) -> dict[str, Any]:
    """The legacy completions' logprobs object."""
    return {
        "tokens": [token_text(tok, e.token) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [None if e.top is None else {token_text(tok, t): lp for t, lp in e.top} for e in entries],
        "text_offset": [e.offset for e in entries],
    }


def chat_logprobs(entries: list[TokenLogprob], tok: Tokenizer) -> dict[str, Any]:
    """Chat's logprobs object: one entry per answer token."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        return {"token": token_text(tok, token), "logprob": logprob, "bytes": list(token_bytes(tok, token))}

    return {
        "content": [one(e.token, e.logprob) | {"top_logprobs": [one(t, lp) for t, lp in e.top or []]} for e in entries]
    }


def completion_response(
    meta: Meta, out: Answers, prompt_tokens: int, tok: Tokenizer, with_logprobs: bool
) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": a.text,
            "finish_reason": a.finish_reason,
            "logprobs": completion_logprobs(a.logprobs, tok) if with_logprobs else None,
        }
        for i, a in enumerate(out.answers)
    ]
    return {
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(prompt_tokens, out.completion_tokens),
    }


def chat_response(meta: Meta, out: Answers, prompt_tokens: int, tok: Tokenizer, with_logprobs: bool) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": a.text},
            "finish_reason": a.finish_reason,
            "logprobs": chat_logprobs(a.logprobs, tok) if with_logprobs else None,
        }
        for i, a in enumerate(out.answers)
    ]
    return {
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(prompt_tokens, out.completion_tokens),
    }


def completion_chunk(meta: Meta, piece: Piece, tok: Tokenizer, with_logprobs: bool) -> dict[str, Any]:
    choice = {
        "index": piece.index,
        "text": piece.text,
        "finish_reason": piece.finish_reason,
        "logprobs": completion_logprobs(piece.logprobs, tok) if with_logprobs else None,
    }
    return {
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    }


def chat_chunk(
    meta: Meta,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}],
    }


def usage_chunk(meta: Meta, obj: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
    return {
        "id": meta.id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }
