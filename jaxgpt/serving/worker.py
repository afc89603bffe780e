"""serve.py's engine thread: the generation engine (jaxgpt/generation/engine.py) turned on one thread,
its outputs handed to the asyncio side as each HTTP request's pieces.

    worker = Worker(model, tok, max_batch=16, max_queue=64)
    worker.start()                                     # compiles the first programs, starts the thread
    job = Job(loop, [Choice(prompt_ids, params, n=2)])
    worker.submit(job)                                 # QueueFull when max_queue requests wait already
    async for piece in job.pieces(): ...               # text, logprobs, then a finish_reason per answer
    job.cancel()                                       # the client went away: its rows are freed next turn
    worker.stop()

Everything that touches the model runs on this thread; the asyncio side only receives pieces, all of
a turn's in one loop.call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from flax import nnx

from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.generation.engine import Engine, Output, Request
from jaxgpt.generation.sampling import SamplingParams, TokenLogprob

log = logging.getLogger("jaxgpt.serving")


class QueueFull(Exception):
    """max_queue requests are waiting already (the server answers 503 with Retry-After)."""


class ShuttingDown(RuntimeError):
    """The server is shutting down: a request still waiting for a row is answered 503; an answer still
    being drawn when the grace runs out ends with an error event (a stream) or a 503."""


CUT_MARGIN_S = 2.0  # answers still running are ended this long before uvicorn's grace runs out


@dataclass
class Piece:
    """What one answer of a request receives: new text, its tokens' logprobs, and on its last piece why
    it ended and how many tokens it drew."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


@dataclass
class Choice:
    """One prompt of a request and its n answers (numbered first_index .. first_index + n - 1)."""

    prompt: list[int]
    params: SamplingParams
    n: int = 1
    first_index: int = 0
    prompt_text: str = ""  # echo: the prompt's text, before its answers' text


class Job:
    """One HTTP request's answers and the asyncio queue their pieces arrive on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, choices: list[Choice]) -> None:
        self.loop, self.choices = loop, choices
        self.queue: asyncio.Queue[Piece | Exception] = asyncio.Queue()
        self.requests: list[Request] = []  # the engine's, once submitted
        self.answers = sum(c.n for c in choices)
        self._cancel: Any = None

    def cancel(self) -> None:
        """The client went away (or the request ended): its rows are freed at the engine's next turn."""
        if self._cancel is not None:
            self._cancel(self.requests)

    @property
    def waiting(self) -> bool:
        """No answer of it was started yet, and it was not cancelled."""
        return not any(r.started or r.cancelled for r in self.requests)

    async def batches(self) -> AsyncIterator[list[Piece]]:
        """The pieces as they arrive, all those waiting at once (a stream writes them in one send),
        until each answer has finished; raises what the engine failed with."""
        left = self.answers
        while left:
            items = [await self.queue.get()]
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            failed = [item for item in items if isinstance(item, Exception)]
            if failed:
                raise failed[0]
            left -= sum(item.finish_reason is not None for item in items)
            yield items

    async def pieces(self) -> AsyncIterator[Piece]:
        async for items in self.batches():
            for item in items:
                yield item


class Worker:
    """The engine on its thread, and which job each of its requests belongs to."""

    def __init__(self, model: nnx.Module, tok: Tokenizer, *, max_batch: int, max_queue: int) -> None:
        self.engine = Engine(model, tok, rows=max_batch)
        self.max_queue = max_queue
        self._jobs: dict[int, _Entry] = {}  # request id -> where its pieces go
        self._lock = threading.Lock()
        self._closing = False  # shutting down: no new request; waiting ones answered 503
        self._cut = threading.Event()  # the grace is running out: end the answers still drawn
        self._stopping = False  # the thread ends
        self._thread = threading.Thread(target=self._run, name="jaxgpt-engine", daemon=True)

    # ------------------------------------------------------------------ the asyncio side

    def start(self) -> float:
        """Compile the first programs (decoder.warm_up), then start the thread; the warm-up's seconds."""
        seconds = self.engine.decoder.warm_up()
        self._thread.start()
        return seconds

    def begin_shutdown(self, grace: float) -> None:
        """Shutdown starts: refuse new requests, answer the waiting ones 503 now, and end the answers still
        being drawn CUT_MARGIN_S before `grace` runs out (streams then close with an error event and [DONE])."""
        with self._lock:
            self._closing = True
            waiting = [rid for rid, e in self._jobs.items() if e.job.waiting]  # no answer of its request started
        self.engine.cancel([self._jobs[rid].request for rid in waiting])
        self._deliver([], {rid: ShuttingDown("the server is shutting down; send the request again") for rid in waiting})
        timer = threading.Timer(max(0.0, grace - CUT_MARGIN_S), self._cut_now)
        timer.daemon = True
        timer.start()

    def _cut_now(self) -> None:
        self._cut.set()
        self.engine.wake()

    def stop(self, timeout: float = 30.0) -> None:
        """Fail what is still waiting or drawing (uvicorn has let the requests in flight end first) and
        end the thread."""
        self._stopping = True
        self.engine.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a request's answers; QueueFull when max_queue requests are waiting already."""
        with self._lock:
            if self._closing or self._stopping:
                raise QueueFull("the server is shutting down")
            jobs = {id(e.job): e.job for e in self._jobs.values()}
            if sum(j.waiting for j in jobs.values()) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are waiting already")
            job._cancel = self.engine.cancel
            for choice in job.choices:
                params = dataclasses.replace(choice.params, seed=choice.params.seed + choice.first_index)
                echo = choice.prompt_text if params.echo else ""
                for request in self.engine.submit(choice.prompt, params, choice.n):
                    self._jobs[request.id] = _Entry(job, request, choice.first_index + request.index, echo)
                    job.requests.append(request)

    def status(self) -> dict[str, Any]:
        """/health's figures: requests and answers waiting, rows busy, the engine's counters."""
        figures = self.engine.status()
        with self._lock:
            jobs = {id(e.job): e.job for e in self._jobs.values()}
        return {
            "waiting_requests": sum(j.waiting for j in jobs.values()),
            "waiting_choices": figures.pop("waiting"),
        } | figures

    # ------------------------------------------------------------------ the engine's thread

    def _run(self) -> None:
        while not self._stopping:
            if self._cut.is_set():  # the grace is running out: every answer not finished ends now
                self._end_all(ShuttingDown("the server is shutting down: this answer was cut off"))
            if not self.engine.wait_for_work(timeout=1.0):
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # a bug: say so loudly, fail what was being drawn, go on with the rest
                log.exception("the engine failed; failing the requests it was drawing")
                failed = RuntimeError(f"the engine failed: {type(e).__name__}: {e}")
                self._deliver([], {r.id: failed for r in self.engine.reset()})
                continue
            self._deliver(outputs)
        self._end_all(ShuttingDown("the server is shutting down"))

    def _end_all(self, error: Exception) -> None:
        """Every request not finished, in a row or waiting, ends with `error`; the rows are freed."""
        with self._lock:
            left = {rid: e.request for rid, e in self._jobs.items()}
        self.engine.cancel(left.values())
        self.engine.reset()
        self._deliver([], {rid: error for rid in left})

    def _deliver(self, outputs: list[Output], errors: dict[int, Exception] | None = None) -> None:
        """This turn's outputs as pieces, handed to each event loop in one call (one wake-up per turn)."""
        by_loop: dict[int, list[tuple[Job, Piece | Exception]]] = {}
        with self._lock:
            for o in outputs:
                entry = self._jobs.get(o.request.id)
                if entry is None:  # cancelled meanwhile: nobody is listening
                    continue
                if o.finish_reason is not None:
                    del self._jobs[o.request.id]
                by_loop.setdefault(id(entry.job.loop), []).append((entry.job, entry.piece(o)))
            for rid, error in (errors or {}).items():
                entry = self._jobs.pop(rid, None)
                if entry is not None:
                    by_loop.setdefault(id(entry.job.loop), []).append((entry.job, error))
            for rid in [rid for rid, e in self._jobs.items() if e.request.cancelled]:
                del self._jobs[rid]
        for items in by_loop.values():
            try:
                items[0][0].loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: the server is gone, nobody is listening
                pass


@dataclass
class _Entry:
    """Where one engine request's pieces go: its job, its answer's index, an echoed prompt's text."""

    job: Job
    request: Request
    index: int
    echo: str

    def piece(self, o: Output) -> Piece:
        """An engine output as a piece: an echoed prompt's text and logprobs first, answer offsets after it."""
        if o.prompt_logprobs is not None:
            return Piece(self.index, self.echo, list(o.prompt_logprobs))
        shift = len(self.echo)
        entries = [dataclasses.replace(e, offset=e.offset + shift) for e in o.logprobs] if shift else o.logprobs
        done = len(o.request.sampled) if o.finish_reason is not None else 0
        return Piece(self.index, o.text, entries, o.finish_reason, done)


def _put_all(items: list[tuple[Job, Piece | Exception]]) -> None:
    """On the event loop: each piece onto its job's queue."""
    for job, item in items:
        job.queue.put_nowait(item)
