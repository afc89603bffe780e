"""The server's engine: one thread that decodes every request's answers together, in one KV cache.

    engine = Engine(model, tok, max_batch=16, max_queue=64)
    engine.start()                                   # compiles the first programs, starts the thread
    job = Job(loop, [Choice(0, prompt_ids, Sampling(max_tokens=64, seed=1))])
    engine.submit(job)                           # QueueFull when max_queue requests wait already
    async for piece in job.pieces(): ...         # text, logprobs, then a finish_reason per choice
    engine.stop()

Continuous batching: the cache has `max_batch` rows (rows.RowDecoder). Each turn of the loop the
engine (1) starts waiting answers ("choices": a request asks for n per prompt) in free rows, each
prompt prefilled into its row alone while the other rows keep their state, (2) samples one token
for every busy row from its logits, hands the new text back and frees the rows that finished, and
(3) runs one decode step over all rows (KVDecoder.step: the idle ones are computed but not
advanced). So a new request waits at most one step and one prefill per request ahead of it, and
an answer never waits for a longer one beside it.

Each choice draws from its own generator, numpy's default_rng(seed + index) (test_generation.py's
`--seed` generator for choice 0), and each row's logits are computed by the same programs whatever
the other rows hold (rows.py), so a request with a seed gets the same text however many others run
beside it. Everything that touches the model runs on this thread; the asyncio side only receives
pieces, all of a turn's in one loop.call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flax import nnx

from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.model.sampling import sample_next
from jaxgpt.serving.rows import RowDecoder
from jaxgpt.serving.text import TextStream

log = logging.getLogger("jaxgpt.serving")


class QueueFull(Exception):
    """max_queue requests are waiting already (the server answers 503 with Retry-After)."""


@dataclass(frozen=True)
class Sampling:
    """How one answer is drawn and where it ends (sampling.sample_next: temperature 0 is greedy)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()  # text: the answer is cut before the first one
    stop_ids: frozenset[int] = frozenset()  # tokens that end the answer (end-of-text, a template's end)
    end: tuple[int, ...] = ()  # a template's end of several tokens: cut with what follows
    logprobs: int | None = None  # alternatives listed per token; None: no logprobs at all
    echo: bool = False  # the prompt's text (and with logprobs its tokens') before the answer


@dataclass
class TokenLogprob:
    """One token of a response's logprobs: its logprob (None for a prompt's first token), the most
    likely tokens at its position (ids, logprobs), and its first character in prompt + answer."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None
    offset: int


@dataclass
class Piece:
    """What the engine hands back for one choice: new text, the logprobs of its tokens, and on the
    choice's last piece why it ended and how many tokens it generated."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


class Job:
    """One HTTP request's choices (a job for the engine) and the asyncio queue their pieces arrive on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, choices: list[Choice]) -> None:
        self.loop, self.choices = loop, choices
        self.queue: asyncio.Queue[Piece | Exception] = asyncio.Queue()
        self.cancelled = False  # set by the asyncio side (client gone): the engine drops its rows
        self.started = False  # a choice has a row (or was scored): no longer counted as waiting
        for choice in choices:
            choice.job = self

    async def batches(self) -> AsyncIterator[list[Piece]]:
        """The pieces as they arrive, all those waiting at once (a stream writes them in one send),
        until each choice has finished; raises what the engine failed with."""
        left = len(self.choices)
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


@dataclass
class Choice:
    """One answer to draw: its prompt, how, and (on the engine thread) where it stands."""

    index: int
    prompt: list[int]
    sampling: Sampling
    prompt_text: str = ""
    job: Job | None = None
    rng: np.random.Generator | None = None
    text: TextStream | None = None
    logits: np.ndarray | None = None  # (V,) the next token's
    pending: list[TokenLogprob] = field(default_factory=list)  # logprobs of tokens whose text is held back
    generated: int = 0
    last: int = 0


class Engine:
    """The decoding thread, its waiting choices and its rows (see the module's docstring)."""

    def __init__(self, model: nnx.Module, tok: Tokenizer, *, max_batch: int, max_queue: int) -> None:
        self.tok, self.max_queue = tok, max_queue
        self.context = model.cfg.context_length
        self.decoder = RowDecoder(model, max_batch, tok.n_vocab)
        self._cv = threading.Condition()
        self._waiting: collections.deque[Choice] = collections.deque()
        self._rows: list[Choice | None] = [None] * max_batch
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="jaxgpt-engine", daemon=True)
        self.counts = collections.Counter(requests=0, prefills=0, steps=0, tokens=0)  # /health reports them
        self._outbox: list[tuple[Job, Piece | Exception]] = []  # handed to the event loop once per turn

    # ------------------------------------------------------------------ the asyncio side

    def start(self) -> float:
        """Compile the first programs (rows.RowDecoder.warm_up), then start the thread; returns the
        warm-up's seconds."""
        seconds = self.decoder.warm_up()
        self._thread.start()
        return seconds

    def stop(self, timeout: float = 30.0) -> None:
        """Fail what is still waiting or decoding (uvicorn has let the requests in flight finish
        first) and end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a request's choices; QueueFull when max_queue requests are waiting already."""
        with self._cv:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            waiting = {id(c.job): c.job for c in self._waiting}
            if sum(not j.started and not j.cancelled for j in waiting.values()) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are waiting already")
            self._waiting.extend(job.choices)
            self.counts["requests"] += 1
            self._cv.notify()

    def status(self) -> dict[str, Any]:
        with self._cv:
            waiting = {id(c.job) for c in self._waiting if not c.job.started}
            busy = sum(row is not None for row in self._rows)
            return {
                "waiting_requests": len(waiting),
                "waiting_choices": len(self._waiting),
                "busy_rows": busy,
                "rows": len(self._rows),
                **self.counts,
            }

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            admitted = self._admit()
            if admitted is None:
                break
            try:
                for choice in admitted:
                    self._start(choice)
                self._sample()
                self._deliver()  # before the step: a token goes out as soon as it is drawn
                if any(self._rows):
                    self._step()
            except Exception as e:  # a bug: say so loudly, fail what was being decoded, go on with the rest
                log.exception("the engine failed; failing the requests it was decoding")
                failed = RuntimeError(f"the engine failed: {type(e).__name__}: {e}")
                for choice in [*admitted, *(c for c in self._rows if c is not None)]:
                    self._outbox.append((choice.job, failed))
                self._rows = [None] * len(self._rows)
                self._deliver()
        self._fail_all(RuntimeError("the server is shutting down"))

    def _admit(self) -> list[Choice] | None:
        """Waiting choices for the free rows (waits while there is nothing to do); None: stop."""
        with self._cv:
            while not self._stopping and not self._waiting and not any(self._rows):
                self._cv.wait()
            if self._stopping:
                return None
            free = sum(row is None for row in self._rows)
            out = []
            while self._waiting and (free or self._waiting[0].sampling.max_tokens == 0):
                choice = self._waiting.popleft()
                if choice.job.cancelled:
                    continue
                choice.job.started = True
                free -= choice.sampling.max_tokens > 0
                out.append(choice)
            return out

    def _start(self, choice: Choice) -> None:
        """Echo the prompt (scored when logprobs are asked), then prefill the choice into a free row."""
        s = choice.sampling
        choice.rng = np.random.default_rng(s.seed + choice.index)
        choice.text = TextStream(self.tok, s.stop, s.end)
        if s.echo:
            entries = self._prompt_logprobs(choice.prompt, s.logprobs) if s.logprobs is not None else []
            self._outbox.append((choice.job, Piece(choice.index, choice.prompt_text, entries)))
        if s.max_tokens == 0 or len(choice.prompt) >= self.context:
            self._outbox.append((choice.job, Piece(choice.index, "", finish_reason="length")))
            return
        row = self._rows.index(None)
        choice.logits = self.decoder.prefill_row(row, choice.prompt)
        self.counts["prefills"] += 1
        self._rows[row] = choice

    def _prompt_logprobs(self, prompt: list[int], k: int) -> list[TokenLogprob]:
        scores = self.decoder.prompt_logprobs(prompt, k)
        entries = [TokenLogprob(prompt[0], None, None, 0)]
        for i in range(1, len(prompt)):
            top = list(zip(scores.top_ids[i - 1].tolist(), scores.top_logprobs[i - 1].tolist()))
            entries.append(
                TokenLogprob(prompt[i], float(scores.logprobs[i - 1]), top, len(self.tok.decode(prompt[:i])))
            )
        return entries

    def _sample(self) -> None:
        """One token for every busy row; hand back the new text; free the rows that finished."""
        n_vocab = self.tok.n_vocab
        for row, choice in enumerate(self._rows):
            if choice is None:
                continue
            if choice.job.cancelled:
                self._rows[row] = None
                continue
            s = choice.sampling
            token = sample_next(choice.logits[:n_vocab], choice.rng, s.temperature, s.top_k, s.top_p)
            entry = self._logprob(choice, token) if s.logprobs is not None else None
            if token in s.stop_ids:  # drawn, so counted in the usage as vLLM counts it, but not text
                choice.generated += 1
                self._finish(row, "stop", stop_token=entry)
                continue
            piece = choice.text.push(token)
            choice.generated += 1
            choice.last = token
            self.counts["tokens"] += 1
            if entry is not None:
                choice.pending.append(entry)
            if choice.text.stopped:
                self._finish(row, "stop", piece)
            elif choice.generated >= s.max_tokens or len(choice.prompt) + choice.generated >= self.context:
                self._finish(row, "length", piece)
            elif piece:
                self._outbox.append((choice.job, Piece(choice.index, piece, choice.pending)))
                choice.pending = []

    def _logprob(self, choice: Choice, token: int) -> TokenLogprob:
        """The token's logprob under the model (before temperature and filters, as vLLM reports)
        and the `logprobs` most likely tokens."""
        logits = choice.logits[: self.tok.n_vocab].astype(np.float64)
        shifted = logits - logits.max()
        logp = shifted - np.log(np.exp(shifted).sum())
        k = choice.sampling.logprobs
        best = np.argpartition(-logp, k)[:k] if 0 < k < logp.size else np.arange(logp.size if k else 0)
        best = best[np.argsort(-logp[best], kind="stable")]
        offset = len(choice.prompt_text) + len(choice.text.text)
        return TokenLogprob(token, float(logp[token]), [(int(i), float(logp[i])) for i in best], offset)

    def _finish(self, row: int, reason: str, text: str = "", stop_token: TokenLogprob | None = None) -> None:
        """The choice in `row` ended: the rest of its text (`text`: its last token's), its last
        logprobs, the row freed. A stop token is listed in the logprobs (not in the text), as OpenAI
        lists <|endoftext|>."""
        choice = self._rows[row]
        rest = text + choice.text.finish()
        kept = choice.text.kept
        done = len(choice.text.ids) - len(choice.pending)  # tokens whose logprobs went out already
        entries = choice.pending[: max(0, kept - done)]
        if stop_token is not None:
            entries.append(stop_token)
        self._outbox.append((choice.job, Piece(choice.index, rest, entries, reason, choice.generated)))
        self._rows[row] = None

    def _step(self) -> None:
        busy = np.array([c is not None for c in self._rows])
        tokens = np.array([c.last if c is not None else 0 for c in self._rows], np.int32)
        logits = self.decoder.step(tokens, busy)
        self.counts["steps"] += 1
        for row in np.flatnonzero(busy):
            self._rows[row].logits = logits[row]

    def _deliver(self) -> None:
        """Hand this turn's pieces to the event loop in one call (one wake-up per step, not one per
        row); the loop puts each on its job's queue."""
        if not self._outbox:
            return
        by_loop: dict[int, list[tuple[Job, Piece | Exception]]] = {}
        for item in self._outbox:
            by_loop.setdefault(id(item[0].loop), []).append(item)
        self._outbox = []
        for items in by_loop.values():
            try:
                items[0][0].loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: the server is gone, nobody is listening
                pass

    def _fail_all(self, error: Exception) -> None:
        with self._cv:
            for choice in [*self._waiting, *(c for c in self._rows if c is not None)]:
                self._outbox.append((choice.job, error))
            self._waiting.clear()
            self._rows = [None] * len(self._rows)
        self._deliver()


def _put_all(items: list[tuple[Job, Piece | Exception]]) -> None:
    """On the event loop: each piece onto its job's queue."""
    for job, item in items:
        job.queue.put_nowait(item)
