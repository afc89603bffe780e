"""The generation engine: every answer of every caller, drawn in one KV cache of a fixed number of rows.

    engine = Engine(model, tok, rows=16)
    done = engine.generate([prompt_ids, ...], SamplingParams(max_tokens=64, temperature=0))  # Requests
    done[0].text.text, done[0].sampled, done[0].finish_reason
    for piece in engine.stream(prompt_ids, params): print(piece, end="")      # one answer's text
    requests = engine.submit(prompt_ids, params, n=8)  # then engine.step() -> [Output, ...] until done

Every command and RL draw from this engine, in token ids; an answer's text is its TextStream
(text.py). A turn (`step`) starts waiting requests in free rows (a prompt's n samples share one
prefill), draws a token for every busy row, frees finished and cancelled rows, and decodes once.
Sample i of a prompt draws from a generator seeded params.seed + i, alike alone or among others.
Memory does not grow with the requests served. submit and cancel may be called from any thread;
step, run, generate and stream from one.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from flax import nnx

from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.generation.decoder import KVDecoder, TopCandidates
from jaxgpt.generation.sampling import SamplingParams, TokenLogprob, logprob_entry, sample_from_top, sample_next
from jaxgpt.generation.text import TextStream


@dataclass
class GenerationStats:
    """Where the engine's time went (compiles apart)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefills: int = 0  # one per request started, plus one per slide; a copied row is none
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    steps: int = 0
    decode_s: float = 0.0
    compile_s: float = 0.0  # programs compiled when first needed

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.prefill_s + self.decode_s, 1e-9)

    def summary(self) -> str:
        return (
            f"{self.new_tokens} new tokens in {self.prefill_s + self.decode_s:.2f} s = {self.tokens_per_s:,.1f} tok/s "
            f"({self.prefills} prefill(s) of {self.prefill_tokens} tokens in {self.prefill_s:.2f} s; {self.steps} "
            f"decode steps in {self.decode_s:.2f} s; programs compiled in {self.compile_s:.2f} s)"
        )


class Request:
    """One answer to draw: its prompt, how, and where it stands."""

    def __init__(
        self, rid: int, prompt: list[int], params: SamplingParams, index: int, group: int, tok: Tokenizer | None
    ) -> None:
        self.id, self.prompt, self.params, self.index, self.group = rid, prompt, params, index, group
        self.text = TextStream(tok, params.stop, params.end)  # the answer's text so far
        self.sampled: list[int] = []  # every token drawn, a stop token included
        self.logprobs: list[TokenLogprob] = []  # the answer's tokens' (and a stop token's), when asked
        self.prompt_logprobs: list[TokenLogprob] | None = None  # echo with logprobs
        self.finish_reason: str | None = None  # "stop", "length", "cancelled", "error"
        self.started = False  # taken from the queue (a row, or finished at once)
        self.cancelled = False
        self._rng = np.random.default_rng(params.seed + index)
        self._logits: np.ndarray | None = None  # (V,) the next token's
        self._pending: list[TokenLogprob] = []  # logprobs of tokens whose text is held back

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Output:
    """What one turn produced for one request: new text, its tokens' logprobs, and on the last one why
    it ended (prompt_logprobs: an echoed prompt's, on the first)."""

    request: Request
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


# Greedy steps per dispatch: when every busy row decodes greedily, a turn runs this many decode steps
# in one compiled program and hands back only the ids (a step's time on an accelerator is mostly the
# dispatch and the logits' trip to the host). The text is the same as one step per turn; a cancel or
# a new request waits for the burst to end.
BURST = 16
# Candidates a step hands back per row when every advancing row draws from its top_k alone (RL's 50):
# on an accelerator the host then moves and partitions (rows, TOP) values, not (rows, V).
TOP = 64


class Engine:
    """The cache's rows, the waiting requests and the turn that advances them (see the module's docstring)."""

    def __init__(
        self,
        model: nnx.Module,
        tok: Tokenizer | None,
        *,
        rows: int = 16,
        mesh: object = None,
        burst: int = BURST,
        top_on_device: bool | None = None,
        tail_bursts: bool | None = None,
    ) -> None:
        """tok None: token ids only (no text, no stop strings), every id of the model's vocab_size drawn.
        burst: greedy decode steps per program when every busy row decodes greedily (1: one per turn).
        top_on_device: top-k draws from candidates chosen on the device (None: on an accelerator;
        XLA:CPU's top_k is slower than numpy's partition); the same tokens either way.
        tail_bursts: a burst also when the longest answer wants only half of it, its last steps
        computed and dropped (None: on an accelerator, where a step's dispatch and its logits' trip
        to the host outweigh its compute; on the CPU a wasted step costs a whole step)."""
        self.tok, self.context, self.burst = tok, model.cfg.context_length, burst
        self.n_vocab = tok.n_vocab if tok is not None else model.cfg.vocab_size
        self.decoder = KVDecoder(model, rows, self.n_vocab, mesh=mesh)
        self.top_on_device = not self.decoder.on_cpu if top_on_device is None else top_on_device
        self.tail_bursts = not self.decoder.on_cpu if tail_bursts is None else tail_bursts
        self.rows: list[Request | None] = [None] * rows
        self._waiting: collections.deque[Request] = collections.deque()
        self._work = threading.Condition()
        self._ids = itertools.count()
        self.stats = GenerationStats()
        # cancelled: answers a cancel ended before they finished (a client gone, a chat page's stop button)
        self.counts = collections.Counter(
            requests=0, prefills=0, copies=0, steps=0, bursts=0, top_steps=0, tokens=0, cancelled=0
        )

    # ------------------------------------------------------------------ any thread

    def submit(self, prompt: Sequence[int], params: SamplingParams, n: int = 1) -> list[Request]:
        """Queue n answers to one prompt (seeds params.seed + 0..n-1); ValueError for a bad prompt."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("a prompt must hold at least one token")
        bad = next((t for t in prompt if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            whose = f"the {self.tok.name} tokenizer's" if self.tok is not None else "the model's"
            raise ValueError(f"token id {bad} is out of range: {whose} ids are 0..{self.n_vocab - 1}")
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        group = next(self._ids)
        requests = [Request(next(self._ids), prompt, params, i, group, self.tok) for i in range(n)]
        with self._work:
            self._waiting.extend(requests)
            self.counts["requests"] += 1
            self._work.notify_all()
        return requests

    def cancel(self, requests: Iterable[Request]) -> None:
        """Drop these requests: waiting ones are never started, running ones free their rows next turn."""
        with self._work:
            for request in requests:
                request.cancelled = True
            self._work.notify_all()

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until a request waits or a row is busy (or `timeout` seconds); whether there is work."""
        with self._work:
            return self._work.wait_for(self.has_work, timeout)

    def wake(self) -> None:
        """End a wait_for_work early (a server shutting down)."""
        with self._work:
            self._work.notify_all()

    def has_work(self) -> bool:
        return bool(self._waiting) or any(r is not None for r in self.rows)

    def status(self) -> dict[str, int]:
        with self._work:
            return {
                "waiting": sum(not r.cancelled for r in self._waiting),
                "busy_rows": sum(r is not None for r in self.rows),
                "rows": len(self.rows),
                **self.counts,
            }

    # ------------------------------------------------------------------ the engine's thread

    def step(self) -> list[Output]:
        """One turn: start waiting requests, draw a token for every busy row, advance the cache."""
        out: list[Output] = []
        for row, request in enumerate(self.rows):
            if request is not None and request.cancelled:
                request.finish_reason, self.rows[row] = "cancelled", None
                self.counts["cancelled"] += 1
        self._admit(out)
        self._sample(out)
        self._advance(out)
        return out

    def run(self, requests: Sequence[Request]) -> list[Request]:
        """Turn until every one of `requests` is done (the others in the engine advance too)."""
        try:
            while not all(r.done for r in requests):
                self.step()
        except BaseException:  # a Ctrl-C mid-turn may leave a donated cache unassigned: start clean
            self.reset()
            raise
        return list(requests)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams], n: int = 1
    ) -> list[Request]:
        """Every prompt's n answers, in prompt order (one params for all, or one per prompt)."""
        each = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(each) != len(prompts):
            raise ValueError(f"{len(each)} sampling parameters for {len(prompts)} prompts")
        requests = [r for prompt, p in zip(prompts, each) for r in self.submit(prompt, p, n)]
        return self.run(requests)

    def stream(self, prompt: Sequence[int], params: SamplingParams) -> Iterator[str]:
        """One answer's text, piece by piece as it becomes certain; stopping early cancels it."""
        (request,) = self.submit(prompt, params)
        try:
            while not request.done:
                try:
                    outputs = self.step()
                except BaseException:
                    self.reset()
                    raise
                for o in outputs:
                    if o.request is request and o.text:
                        yield o.text
        finally:
            if not request.done:
                self.cancel([request])

    def reset(self) -> list[Request]:
        """After a failed turn: the requests in rows end ("error"), the cache starts empty; returns them."""
        failed = [r for r in self.rows if r is not None]
        for request in failed:
            request.finish_reason = "error"
        self.rows = [None] * len(self.rows)
        self.decoder.reset()
        return failed

    def set_weights(self, model: nnx.Module) -> None:
        """Draw from these weights from now on (the same model structure; RL after each update)."""
        assert not any(r is not None for r in self.rows), "set_weights: rows are busy"
        self.decoder.set_weights(model)

    # ------------------------------------------------------------------ a turn's parts

    def _admit(self, out: list[Output]) -> None:
        """Waiting requests into free rows: a prefill, or a copy of the same prompt's row this turn."""
        with self._work:
            free = [row for row, r in enumerate(self.rows) if r is None]
            taken: list[tuple[Request, int | None]] = []
            while self._waiting:
                request = self._waiting[0]
                if request.cancelled:
                    self._waiting.popleft().finish_reason = "cancelled"
                    self.counts["cancelled"] += 1
                    continue
                needs_row = self._needs_row(request)
                if needs_row and not free:
                    break
                taken.append((self._waiting.popleft(), free.pop(0) if needs_row else None))
                taken[-1][0].started = True
        prefilled: dict[int, int] = {}  # group -> the row its prompt was prefilled into this turn
        for request, row in taken:
            self._start(request, row, prefilled, out)

    def _needs_row(self, request: Request) -> bool:
        p = request.params
        return p.max_tokens > 0 and (p.on_full == "slide" or len(request.prompt) < self.context)

    def _start(self, request: Request, row: int | None, prefilled: dict[int, int], out: list[Output]) -> None:
        p = request.params
        if p.echo:  # the prompt first (scored when logprobs are asked)
            request.prompt_logprobs = [] if p.logprobs is None else self._prompt_logprobs(request.prompt, p.logprobs)
            out.append(Output(request, prompt_logprobs=request.prompt_logprobs))
        if row is None:  # nothing to draw, or no room for it
            request.finish_reason = "length"
            out.append(Output(request, finish_reason="length"))
            return
        self.stats.prompt_tokens += len(request.prompt)
        src = prefilled.get(request.group)
        if src is not None and self.rows[src] is not None:
            started = time.perf_counter()
            self.decoder.copy_row(src, row)
            request._logits = self.rows[src]._logits
            self.counts["copies"] += 1
            self.stats.prefill_s += time.perf_counter() - started
        else:
            request._logits = self._prefill(row, request.prompt[-self.context :])
            prefilled[request.group] = row
        self.rows[row] = request

    def _prefill(self, row: int, window: list[int]) -> np.ndarray:
        started, compiled = time.perf_counter(), self.decoder.compile_s
        logits = self.decoder.prefill_row(row, window)
        self._timed(started, compiled, "prefill_s")
        self.stats.prefills += 1
        self.stats.prefill_tokens += len(window)
        self.counts["prefills"] += 1
        return logits

    def _timed(self, started: float, compiled: float, where: str) -> None:
        spent = self.decoder.compile_s - compiled
        self.stats.compile_s += spent
        setattr(self.stats, where, getattr(self.stats, where) + time.perf_counter() - started - spent)

    def _prompt_logprobs(self, prompt: list[int], k: int) -> list[TokenLogprob]:
        scores = self.decoder.prompt_logprobs(prompt[: self.context], k)
        entries = [TokenLogprob(prompt[0], None, None, 0)]
        for i in range(1, min(len(prompt), self.context)):
            top = list(zip(scores.top_ids[i - 1].tolist(), scores.top_logprobs[i - 1].tolist()))
            entries.append(
                TokenLogprob(
                    prompt[i], float(scores.logprobs[i - 1]), top, len(self.tok.decode(prompt[:i])) if self.tok else 0
                )
            )
        return entries

    def _sample(self, out: list[Output]) -> None:
        """One token for every busy row; the new text out; the rows that finished freed."""
        n_vocab = self.n_vocab
        for row, request in enumerate(self.rows):
            if request is None:
                continue
            p, held = request.params, request._logits
            if isinstance(held, TopCandidates):  # the step drew candidates (_top_k): no logprobs asked
                token = None if held.nan else sample_from_top(held.values, held.ids, n_vocab, request._rng, p)
                token = sample_next(held.logits(), request._rng, p) if token is None else token
                self._take(row, token, None, out)
                continue
            logits = held[:n_vocab]
            token = sample_next(logits, request._rng, p)
            entry = None if p.logprobs is None else logprob_entry(logits, token, p.logprobs, len(request.text.text))
            self._take(row, token, entry, out)

    def _take(self, row: int, token: int, entry: TokenLogprob | None, out: list[Output]) -> bool:
        """Row `row` drew `token`: its text out, the row freed if that ended it; whether it did."""
        request = self.rows[row]
        p = request.params
        request.sampled.append(token)
        if token in p.stop_ids:  # drawn, so counted as vLLM counts it, but not text
            self._finish(row, "stop", out, stop_entry=entry)
            return True
        piece = request.text.push(token)
        self.counts["tokens"] += 1
        self.stats.new_tokens += 1
        if entry is not None:
            request._pending.append(entry)
        full = p.on_full == "stop" and len(request.prompt) + len(request.sampled) >= self.context
        if request.text.stopped:
            self._finish(row, "stop", out, piece)
        elif len(request.sampled) >= p.max_tokens or full:
            self._finish(row, "length", out, piece)
        else:
            if piece:
                out.append(Output(request, piece, request._pending))
                request.logprobs.extend(request._pending)
                request._pending = []
            return False
        return True

    def _finish(
        self, row: int, reason: str, out: list[Output], text: str = "", stop_entry: TokenLogprob | None = None
    ) -> None:
        """The request in `row` ended: the rest of its text, its last logprobs (a stop token is listed
        in the logprobs, not the text, as OpenAI lists <|endoftext|>), the row freed."""
        request = self.rows[row]
        rest = text + request.text.finish()
        sent = len(request.text.ids) - len(request._pending)  # tokens whose logprobs went out already
        entries = request._pending[: max(0, request.text.kept - sent)]
        if stop_entry is not None:
            entries.append(stop_entry)
        request.logprobs.extend(entries)
        request._pending, request.finish_reason, self.rows[row] = [], reason, None
        out.append(Output(request, rest, entries, reason))

    def _advance(self, out: list[Output]) -> None:
        """Feed every busy row its last token: one decode step, or a burst of greedy ones; a full row
        of a sliding answer restarts from the last half of its context instead."""
        busy = np.array([r is not None for r in self.rows])
        if not busy.any():
            return
        full = busy & (self.decoder.lengths >= self.context)
        for row in np.flatnonzero(full):  # only sliding answers reach a full row
            request = self.rows[row]
            seq = request.prompt + request.sampled
            request._logits = self._prefill(row, seq[-max(1, self.context // 2) :])
        advance = busy & ~full
        if not advance.any():
            return
        tokens = np.array([r.sampled[-1] if r is not None else 0 for r in self.rows], np.int32)
        if not full.any() and self._can_burst(advance):
            self._burst(tokens, advance, out)
            return
        started, compiled = time.perf_counter(), self.decoder.compile_s
        top = self._top_k(advance)
        logits = self.decoder.step_top(tokens, top, advance) if top else self.decoder.step(tokens, advance)
        self._timed(started, compiled, "decode_s")
        self.stats.steps += 1
        self.counts["steps"] += 1
        self.counts["top_steps"] += bool(top)
        for row in np.flatnonzero(advance):
            self.rows[row]._logits = logits[row]

    def _top_k(self, advance: np.ndarray) -> int:
        """How many candidates the step may hand back per row rather than its logits: TOP (at most the
        vocabulary) on the device (top_on_device) when every advancing row draws from its top_k <= TOP
        alone (no top_p, allowed set or logprobs); else 0."""
        if not self.top_on_device:
            return 0
        for row in np.flatnonzero(advance):
            p = self.rows[row].params
            if not (p.temperature > 0 and p.top_k is not None and p.top_k <= TOP and p.top_k < self.n_vocab):
                return 0
            if (p.top_p is not None and p.top_p < 1.0) or p.allowed_ids is not None or p.logprobs is not None:
                return 0
        return min(TOP, self.n_vocab)

    def _can_burst(self, advance: np.ndarray) -> bool:
        """A burst draws what single steps would: every advancing row greedy, without logprobs or an
        allowed set, with room for the whole burst, and one of them wanting at least that many tokens
        (with tail_bursts, half as many: each row takes its tokens until its answer ends)."""
        n, rows = self.burst, [self.rows[row] for row in np.flatnonzero(advance)]
        if n < 2 or (self.decoder.lengths[advance] + n > self.context).any():
            return False
        plain = all(
            r.params.temperature <= 0 and r.params.logprobs is None and r.params.allowed_ids is None for r in rows
        )
        return plain and max(r.params.max_tokens - len(r.sampled) for r in rows) >= (n // 2 if self.tail_bursts else n)

    def _burst(self, tokens: np.ndarray, advance: np.ndarray, out: list[Output]) -> None:
        """burst greedy steps in one program; each row takes the ids drawn until one ends it, and the
        last step's logits for its next draw."""
        started, compiled = time.perf_counter(), self.decoder.compile_s
        drawn, logits = self.decoder.steps(tokens, self.burst, advance)
        self._timed(started, compiled, "decode_s")
        self.stats.steps += self.burst
        self.counts["steps"] += self.burst
        self.counts["bursts"] += 1
        for row in np.flatnonzero(advance):
            if not any(self._take(row, int(token), None, out) for token in drawn[row, :-1]):
                self.rows[row]._logits = logits[row]
