"""The HTTP side of serve.py: a FastAPI app speaking the OpenAI API over the engine, run by uvicorn.

    served = load(Path("runs/tiny"), model_name=None, max_batch=16, max_queue=64)   # the model, once
    run(served, sock, api_key=None)                                                   # until SIGTERM / Ctrl-C

Endpoints (docs/serving.md has the parameters):
    GET  /                          no key needed: the chat page (chat_page.html)
    GET  /health, /healthz          no key needed: {"status": "ok", the engine's queue and counters}
    GET  /v1/models, /v1/models/ID  the one model served
    POST /v1/completions            text completion, OpenAI's legacy API (echo + logprobs: lm-eval)
    POST /v1/chat/completions       the checkpoint's chat template; refused for a base model
    POST /tokenize, /detokenize, GET /tokenizer_info   vLLM's tokenizer endpoints (lm-eval's
                                    tokenizer_backend=remote tokenizes with the server's own tokenizer)

With an API key every endpoint but / and /health needs `Authorization: Bearer KEY`. Every error is
OpenAI's error object. The handlers only check, tokenize (off the event loop), submit and format: the
model runs on the engine's thread (worker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxgpt.conversations.template import ChatTemplate, TemplateError, read_template
from jaxgpt.data.tokenizer import EOT_TEXT, Tokenizer, encode_with_specials
from jaxgpt.serving.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    chat_choices,
    check_model,
    completion_choices,
)
from jaxgpt.serving.responses import (
    Answers,
    Meta,
    chat_chunk,
    chat_logprobs,
    chat_response,
    completion_chunk,
    completion_response,
    usage_chunk,
)
from jaxgpt.serving.worker import Job, Piece, QueueFull, ShuttingDown, Worker

log = logging.getLogger("jaxgpt.serving")
UNION_TAGS = frozenset({"str", "int", "float", "bool"})  # pydantic's names of a union's members in an error's loc
# Answered without the API key: /health (load balancers, tests) and the page, which holds no secret (the model's
# name, as /health gives it; chat or not, its context, whether a key is needed): its requests carry the key typed.
OPEN_PATHS = frozenset({"/", "/health", "/healthz"})
PAGE = Path(__file__).with_name("chat_page.html")
RETRY_AFTER_S = 1  # what a 503 tells a client to wait
GRACE_S = 30  # on SIGTERM / Ctrl-C, how long requests in flight may run on before they are ended (--shutdown-grace)
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # the largest request body (--max-request-bytes): lm-eval's batches are far smaller


@dataclass(frozen=True)
class Served:
    """The model being served and what the endpoints need of it."""

    name: str
    where: str  # the checkpoint folder
    tok: Tokenizer
    template: ChatTemplate | None  # None: a base model, no chat
    context: int
    worker: Worker


def load(path: Path, *, model_name: str | None, max_batch: int, max_queue: int) -> Served:
    """The checkpoint (a run dir, checkpoint folder or latest/best link) loaded once, its chat template
    read, the engine's worker built (not started). Raises the loaders' one-line errors."""
    from jaxgpt.checkpoints.store import load_model  # JAX starts here, after serve.py's checks

    model, cfg, tok, ckpt = load_model(path)
    template = read_template(ckpt)
    if template is not None:
        template.check(tok)
    worker = Worker(model, tok, max_batch=max_batch, max_queue=max_queue)
    return Served(model_name or _run_name(path, ckpt), str(ckpt), tok, template, cfg.context_length, worker)


def _run_name(path: Path, ckpt: Path) -> str:
    """The default model name: the run's folder name (runs/<name>), whichever of its folders was given."""
    if path.resolve() != ckpt.resolve() and path.name not in ("latest", "best"):
        return path.resolve().name  # a run dir
    ckpt = ckpt.resolve()
    return ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.parent.name


# ----------------------------------------------------------------------------- errors and auth


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _install_errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, pydantic's (a 400 naming the field), unknown routes."""

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        # A union's errors name the member tried (prompt.str, prompt.list[int]): name the field only.
        param = ".".join(x for x in loc if x not in UNION_TAGS and not x.startswith(("list[", "dict[")))
        message = f"{param}: {first['msg']}" if param else f"request body: {first['msg']}"
        if first.get("type") == "extra_forbidden":
            message = f"{param}: unknown parameter (not part of this endpoint's API)"
        elif first.get("type") == "json_invalid":
            message, param = (
                f"the request body is not valid JSON ({first.get('ctx', {}).get('error', first['msg'])})",
                "",
            )
        return _error(APIError(400, message, param=param or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        message = f"{e.detail}: no such endpoint" if e.status_code == 404 else str(e.detail)
        return _error(APIError(e.status_code, message))


def _install_auth(app: FastAPI, api_key: str | None) -> None:
    if api_key is None:
        return
    expected = api_key.encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if request.url.path in OPEN_PATHS:
            return await call_next(request)
        given = request.headers.get("authorization")
        if given is None:
            return _error(
                APIError(
                    401,
                    "No API key provided: send the header `Authorization: Bearer KEY` (serve.py --api-key)",
                    code="invalid_api_key",
                )
            )
        scheme, _, key = given.strip().partition(" ")
        # The scheme is case-insensitive (RFC 9110); the key is compared in constant time.
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), expected):
            return _error(APIError(401, "Incorrect API key provided", code="invalid_api_key"))
        return await call_next(request)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 before it is read whole (by its
    Content-Length, or as it arrives without one: then the app is told the client left)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _error(self.error(int(length)))(scope, receive, send)
        seen, refused = 0, False

        async def counted() -> dict:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit and not refused:
                refused = True
                await _error(self.error(seen))(scope, receive, send)
                return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: dict) -> None:
            if not refused:
                await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except Exception:
            if not refused:  # what the app makes of a body cut short is not a failure of its own
                raise

    def error(self, size: int) -> APIError:
        return APIError(
            413,
            f"the request body is {size:,} bytes or more; this server takes at most {self.limit:,} "
            f"(serve.py --max-request-bytes)",
            code="request_too_large",
        )


# ----------------------------------------------------------------------------- running a job


def _submit(served: Served, choices: list[Any]) -> Job:
    job = Job(asyncio.get_running_loop(), choices)
    try:
        served.worker.submit(job)
    except QueueFull as e:
        raise APIError(
            503,
            f"The server is busy ({e}); retry in {RETRY_AFTER_S} s",
            kind="server_error",
            code="overloaded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    return job


def _failed(e: RuntimeError) -> APIError:
    """What the engine failed with, as an error response: 503 while shutting down, else 500."""
    if isinstance(e, ShuttingDown):
        return APIError(503, str(e), kind="server_error", code="shutting_down")
    return APIError(500, str(e), kind="server_error")


async def _collect(job: Job) -> Answers:
    """The whole answers of a request that is not streamed."""
    out = Answers(job.answers)
    try:
        async for piece in job.pieces():
            out.add(piece)
    except RuntimeError as e:
        raise _failed(e) from None
    finally:
        job.cancel()  # a cancelled task (shutdown, client gone) frees its rows; no-op once done
    return out


async def _sse(
    job: Job, chunks: Callable[[Piece], list[dict[str, Any]]], tail: Callable[[int], list[dict[str, Any]]]
) -> StreamingResponse:
    """Server-sent events as OpenAI streams them: `data: {chunk}` per piece, `tail(completion
    tokens)`'s chunks, then `data: [DONE]`. The response starts with the first pieces, so a request
    refused while it waits (a shutdown) is an HTTP error; a failure mid-stream is an error event."""
    batches = job.batches()
    try:
        first = await anext(batches)
    except RuntimeError as e:
        job.cancel()
        raise _failed(e) from None
    except BaseException:
        job.cancel()
        raise

    async def events() -> AsyncIterator[str]:
        generated = 0
        try:
            pieces = first
            while True:  # the pieces waiting: one write, however many events
                generated += sum(piece.completion_tokens for piece in pieces)
                yield "".join(f"data: {json.dumps(chunk)}\n\n" for piece in pieces for chunk in chunks(piece))
                try:
                    pieces = await anext(batches)
                except StopAsyncIteration:
                    break
            for chunk in tail(generated):
                yield f"data: {json.dumps(chunk)}\n\n"
        except RuntimeError as e:
            yield f"data: {json.dumps(_failed(e).body())}\n\n"
        finally:
            job.cancel()  # the client went away (Starlette cancels this generator): free the rows
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# ----------------------------------------------------------------------------- the endpoints


def _install_completions(app: FastAPI, served: Served) -> None:
    tok = served.tok

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        check_model(body.model, served.name)
        # Tokenizing (a long prompt, many prompts) runs off the event loop: /health and the streams stay live.
        choices, prompt_tokens = await asyncio.to_thread(completion_choices, body, tok, served.context)
        job = _submit(served, choices)
        meta = Meta.new("cmpl", served.name)
        logprobs = body.logprobs is not None
        if not body.stream:
            # A JSONResponse as it is: FastAPI would walk a long logprobs list through jsonable_encoder first.
            return JSONResponse(completion_response(meta, await _collect(job), prompt_tokens, tok, logprobs))
        usage = body.stream_options is not None and body.stream_options.include_usage
        return await _sse(
            job,
            lambda piece: [completion_chunk(meta, piece, tok, logprobs)],
            lambda n: [usage_chunk(meta, "text_completion", prompt_tokens, n)] if usage else [],
        )


def _chat_chunks(meta: Meta, piece: Piece, tok: Tokenizer, logprobs: bool) -> list[dict[str, Any]]:
    """A piece as chat chunks: its text (with its tokens' logprobs), then the finish if it is the last."""
    out = []
    if piece.text or (logprobs and piece.logprobs):
        out.append(
            chat_chunk(
                meta,
                piece.index,
                {"content": piece.text},
                logprobs=chat_logprobs(piece.logprobs, tok) if logprobs else None,
            )
        )
    if piece.finish_reason is not None:
        out.append(chat_chunk(meta, piece.index, {}, piece.finish_reason))
    return out


def _install_chat(app: FastAPI, served: Served) -> None:
    tok = served.tok

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> Any:
        check_model(body.model, served.name)
        if served.template is None:
            raise APIError(
                400,
                f"{served.name} is a base model (no chat template: it was not fine-tuned on "
                f"conversations); use /v1/completions for plain text",
                param="messages",
                code="no_chat_template",
            )
        choices, prompt_tokens = await asyncio.to_thread(chat_choices, body, tok, served.template, served.context)
        job = _submit(served, choices)
        meta = Meta.new("chatcmpl", served.name)
        if not body.stream:
            return JSONResponse(chat_response(meta, await _collect(job), prompt_tokens, tok, body.logprobs))
        usage = body.stream_options is not None and body.stream_options.include_usage
        opening = [chat_chunk(meta, i, {"role": "assistant", "content": ""}) for i in range(body.n)]
        first = iter([opening])  # the role before anything else, once per choice

        def chunks(piece: Piece) -> list[dict[str, Any]]:
            return next(first, []) + _chat_chunks(meta, piece, tok, body.logprobs)

        return await _sse(
            job, chunks, lambda n: [usage_chunk(meta, "chat.completion.chunk", prompt_tokens, n)] if usage else []
        )


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True  # accepted as vLLM's; our tokenizers add no special tokens to text
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[int]


def _install_tokenizer(app: FastAPI, served: Served) -> None:
    """vLLM's tokenizer endpoints, as lm-eval's RemoteTokenizer calls them."""
    tok = served.tok

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt (text) or messages (a conversation)", param="prompt")
        if body.messages is not None:
            if served.template is None:
                raise APIError(400, f"{served.name} is a base model (no chat template)", param="messages")
            try:
                ids = served.template.prompt(tok, body.messages)
            except TemplateError as e:
                raise APIError(400, f"messages: {e}", param="messages") from None
        else:
            ids = encode_with_specials(tok, body.prompt)
        return {
            "count": len(ids),
            "max_model_len": served.context,
            "tokens": ids,
            "token_strs": [tok.decode([t]) for t in ids] if body.return_token_strs else None,
        }

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        bad = [t for t in body.tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is out of range 0..{tok.n_vocab - 1}", param="tokens")
        return {"prompt": tok.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return {
            "tokenizer_class": tok.name,
            "eos_token": EOT_TEXT,
            "bos_token": None,
            "pad_token": None,
            "model_max_length": served.context,
            "vocab_size": tok.n_vocab,
            "chat_template": served.template.jinja() if served.template is not None else None,
        }


def _install_page(app: FastAPI, served: Served, needs_key: bool) -> None:
    """GET /: the chat page (a completion page for a base model), the served model's facts written into it."""
    facts = {"model": served.name, "chat": served.template is not None, "context": served.context, "key": needs_key}
    # Inside <script>, "</script>" in a model name would end the JSON early: "<" is written as \u003c.
    page = PAGE.read_text(encoding="utf-8").replace("__CONFIG__", json.dumps(facts).replace("<", "\\u003c"))

    @app.get("/")
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)


def create_app(served: Served, api_key: str | None = None, max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The app over a started engine; it stops the engine when uvicorn shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(served.worker.stop)  # after uvicorn has let the requests in flight end

    app = FastAPI(title="jaxgpt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    _install_errors(app)
    _install_auth(app, api_key)
    app.add_middleware(BodyLimit, limit=max_request_bytes)

    @app.get("/health")
    @app.get("/healthz")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served.name, **served.worker.status()}

    model = {
        "id": served.name,
        "object": "model",
        "created": 0,
        "owned_by": "jaxgpt",
        "max_model_len": served.context,
        "root": served.where,
    }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> dict[str, Any]:
        check_model(name, served.name)
        return model

    _install_page(app, served, api_key is not None)
    _install_completions(app, served)
    _install_chat(app, served)
    _install_tokenizer(app, served)
    return app


class _Server(uvicorn.Server):
    """uvicorn's server, told when it listens (the "Serving" line is printed then, not before) and when its
    shutdown starts (the worker answers what still waits and ends what runs before the grace is out)."""

    def __init__(self, config: uvicorn.Config, served: Served, announce: Callable[[], None], stopped: Any) -> None:
        super().__init__(config)
        self.served, self.announce, self.stopped = served, announce, stopped

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.stopped():  # a SIGTERM while loading or compiling: shut down at once, serving nothing
            self.should_exit = True
        elif self.started:
            self.announce()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.served.worker.begin_shutdown(self.config.timeout_graceful_shutdown)
        await super().shutdown(sockets=sockets)


def run(
    served: Served,
    sock: socket.socket,
    api_key: str | None,
    *,
    grace: float = GRACE_S,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    announce: Callable[[], None] = lambda: None,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Serve on a bound socket until SIGTERM or Ctrl-C: uvicorn stops accepting, the requests still
    waiting are answered 503, those in flight may finish for `grace` seconds (then end with an error),
    and the engine thread ends; returns normally. announce(): called once the socket accepts."""
    app = create_app(served, api_key, max_request_bytes)
    config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=grace)
    _Server(config, served, announce, stopped).run(sockets=[sock])
