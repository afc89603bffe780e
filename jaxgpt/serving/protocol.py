"""The OpenAI API's requests as the server takes them: their fields, their checks, the choices they ask for.

    body = CompletionRequest.model_validate(json)        # pydantic: wrong types name the field
    choices, prompt_tokens = completion_choices(body, tok, context_length)   # APIError for bad values
    body = ChatRequest.model_validate(json)
    choices, prompt_tokens = chat_choices(body, tok, template, context_length)

Fields follow OpenAI's legacy completions and chat completions; `top_k` is an extension (vLLM's).
Parameters OpenAI has and this server does not implement (penalties, logit_bias, best_of, suffix,
tools ...) are accepted at their neutral values only and refused otherwise, so a request is never
answered as if they had been applied; unknown parameters are refused (a typo is not ignored).
Every refusal is an APIError: an HTTP status and OpenAI's error object, naming the parameter.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jaxgpt.conversations.template import ChatTemplate, TemplateError
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.generation.sampling import MAX_LOGPROBS, SamplingParams
from jaxgpt.serving.worker import Choice

MAX_CHOICES = 128  # prompts x n of one request
DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default


class APIError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension: -1 or 0 = off
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0)
    # OpenAI's parameters this server does not implement: accepted at their neutral values only.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


def _unsupported(body: _Common) -> None:
    """Refuse OpenAI parameters that would change the answer in a way this server does not do."""
    neutral = {
        "presence_penalty": body.presence_penalty in (None, 0.0),
        "frequency_penalty": body.frequency_penalty in (None, 0.0),
        "logit_bias": not body.logit_bias,
    }
    if isinstance(body, CompletionRequest):
        neutral |= {"best_of": body.best_of in (None, body.n), "suffix": body.suffix is None}
    if isinstance(body, ChatRequest):
        neutral |= {"response_format": body.response_format in (None, {"type": "text"})}
    for name, ok in neutral.items():
        if not ok:
            raise APIError(
                400,
                f"{name}={getattr(body, name)!r} is not supported by this server (leave it out)",
                param=name,
                code="unsupported_parameter",
            )


def _sampling(body: _Common, max_tokens: int, stop_ids: frozenset[int], **extra: Any) -> SamplingParams:
    """The sampling of every answer of a request (each answer's seed is seed + its index)."""
    _unsupported(body)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, f"stop must be up to 4 non-empty strings, got {stop!r:.200}", param="stop")
    temperature = 1.0 if body.temperature is None else body.temperature
    top_k = None if body.top_k in (None, -1, 0) else body.top_k
    top_p = None if body.top_p in (None, 1.0) else body.top_p
    seed = body.seed if body.seed is not None else secrets.randbits(62)  # no seed: a fresh draw each time
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=tuple(stop),
        stop_ids=stop_ids,
        **extra,
    )


def _room(prompt: Sequence[int], context: int, max_tokens: int, where: str, param: str) -> int:
    """max_tokens, capped so that prompt + answer fit the context (an answer cut there ends with
    finish_reason "length"); a prompt longer than the context is an error naming both lengths."""
    if len(prompt) > context:
        raise APIError(
            400,
            f"{where} is {len(prompt):,} tokens; the model's context is {context:,} tokens "
            f"(prompt and answer must fit in it)",
            param=param,
            code="context_length_exceeded",
        )
    return min(max_tokens, context - len(prompt))


def _prompts(prompt: str | list[str] | list[int] | list[list[int]], tok: Tokenizer) -> list[list[int]]:
    """A completion request's prompts as ids: a string, strings, ids, or lists of ids."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise APIError(
            400,
            "prompt is empty: give a string, a list of strings, a list of token ids or a list of lists of ids",
            param="prompt",
        )
    if isinstance(prompt[0], int):
        prompt = [prompt]
    out = []
    for i, p in enumerate(prompt):
        ids = tok.encode(p) if isinstance(p, str) else list(p)
        if not ids:
            raise APIError(400, f"prompt {i} is empty (it must hold at least one token)", param="prompt")
        bad = [t for t in ids if not 0 <= t < tok.n_vocab]
        if bad:
            raise APIError(
                400,
                f"prompt {i}: token id {bad[0]} is out of range: the {tok.name} tokenizer's ids are "
                f"0..{tok.n_vocab - 1}",
                param="prompt",
            )
        out.append(ids)
    return out


def completion_choices(body: CompletionRequest, tok: Tokenizer, context: int) -> tuple[list[Choice], int]:
    """The choices of a /v1/completions request (prompt i's n choices have indices i*n .. i*n+n-1),
    and how many prompt tokens it holds."""
    prompts = _prompts(body.prompt, tok)
    if len(prompts) * body.n > MAX_CHOICES:
        raise APIError(
            400,
            f"{len(prompts)} prompts x n={body.n} = {len(prompts) * body.n:,} answers: a request may ask for at most "
            f"{MAX_CHOICES} (prompts x n; lm-eval: --batch_size {MAX_CHOICES} or less)",
            param="prompt" if len(prompts) > MAX_CHOICES else "n",
            code="too_many_answers",
        )
    base = _sampling(
        body,
        DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens,
        frozenset({tok.eot_id}),
        logprobs=body.logprobs,
        echo=body.echo,
    )
    choices = []
    for i, ids in enumerate(prompts):
        max_tokens = _room(ids, context, base.max_tokens, f"prompt {i}" if len(prompts) > 1 else "the prompt", "prompt")
        params = dataclasses.replace(base, max_tokens=max_tokens)
        choices.append(Choice(ids, params, body.n, i * body.n, tok.decode(ids) if body.echo else ""))
    return choices, sum(map(len, prompts))


def _message_text(i: int, content: Any) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text parts are taken."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise APIError(
        400,
        f"messages[{i}].content must be a string or a list of text parts "
        f'({{"type": "text", "text": ...}}), got {content!r:.80}',
        param=f"messages[{i}].content",
    )


def chat_choices(body: ChatRequest, tok: Tokenizer, template: ChatTemplate, context: int) -> tuple[list[Choice], int]:
    """The choices of a /v1/chat/completions request: the conversation rendered with the
    checkpoint's chat template, answers ending at its end; and the prompt's token count."""
    messages = []
    for i, m in enumerate(body.messages):
        role = "system" if m.get("role") == "developer" else m.get("role")  # OpenAI's newer name for system
        messages.append({"role": role, "content": _message_text(i, m.get("content"))})
    try:
        ids = template.prompt(tok, messages)
    except TemplateError as e:
        raise APIError(400, f"messages: {e}", param="messages") from None
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = _room(ids, context, context if requested is None else requested, "the conversation", "messages")
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    end = template.end_ids(tok)
    sampling = _sampling(
        body,
        max_tokens,
        frozenset(template.stop_ids(tok)),
        end=tuple(end) if len(end) > 1 else (),
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )
    return [Choice(ids, sampling, body.n)], len(ids)


def check_model(name: str, served: str) -> None:
    if name != served:
        raise APIError(
            404,
            f"The model `{name}` does not exist: this server serves `{served}` (GET /v1/models)",
            param="model",
            code="model_not_found",
        )
