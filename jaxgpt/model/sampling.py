"""Sample from a trained model: a KV cache, a compiled one-token decode step, batched prompts.

    from jaxgpt.checkpoints.store import load_model
    from jaxgpt.model.sampling import generate_batch
    model, cfg, tok, path = load_model(Path("runs/tiny"))      # run dir, checkpoint or latest/best link
    texts = generate_batch(model, [tok.encode("Every effort moves you")], max_new_tokens=50)

    uv run -m bench generate        # ours vs transformers' generate on a 124M-shaped GPT-2 (random weights)

How decoding works (used by test_generation.py); both programs call the model's own forward pass
(model.GPT.cached_features, with a model.KVCache), so there is no second copy of a block here:
  prefill  the prompts, right-padded to 16, 32 or 64 tokens or a multiple of 64 (prefill_length: a
           handful of programs, each compiled once), go through the model once; every layer's
           keys and values land in a cache of (L, B, H, D, S) keys and (L, B, H, S, D) values,
           S = context_length, and the logits at each row's last prompt token give its first
           new token.
  step     a program compiled ahead of time (it refuses other shapes rather than recompile)
           feeds one token per row at that row's own position, writes its key/value into the
           cache in place and attends to positions 0..pos of the row, reading only the first
           128, 256, 512, ... slots that hold every row: at most log2(S / 128) + 1 programs,
           each compiled once when first needed. Prompts of different lengths need nothing more.
           It runs `decoding_model`, a copy of the model made when the decoder is built: its
           layers unrolled (no step slices a scan_layers model's stacked weights) and its dense
           weights already in the compute dtype (no step casts a weight; ops.for_decoding). On
           the CPU a bfloat16 model's dense layers run the native kernel of jaxgpt/cpu/matvec.py, and
           on the CPU prefills run that copy too (weights cast once; a bfloat16 model's short
           prompt through the native kernel; a scanned model's prefill sliced no layer).
  full     the default `slide`: when a row's cache holds context_length tokens, the row is
           re-prefilled with its last context_length // 2 tokens (positions restart at 0, as in
           any window), so a long generation costs one prefill per context_length / 2 tokens and
           every other row keeps its whole window. `stop` instead ends a row once prompt + new
           tokens fill context_length.

Sampling (temperature, top-k, top-p) runs on the host in numpy from a seeded generator.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgpt.config import ModelConfig
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.model.gpt import KVCache, abstract_model, head_weight, unstack_layer_weights
from jaxgpt.ops import Ops

BUCKET = 64  # prefill lengths are rounded up to a multiple of this: few compiles, little padding
SHORTEST_PREFILL = 16  # ... and shorter prompts to 16, 32 or 64 tokens (prefill_length)
ON_FULL = ("slide", "stop")
# How often each program was traced (a Python side effect that runs only while tracing): the
# tests use it to check that decoding never recompiles.
TRACES: collections.Counter[str] = collections.Counter()


# ----------------------------------------------------------------------------- prefill and decode step


def _prefill(
    graphdef: nnx.GraphDef, state: nnx.State, cache_k: jax.Array, cache_v: jax.Array, tokens: jax.Array, last: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The model over right-padded prompts, keeping every layer's keys and values.

    tokens: (B, P) int32, position p of a row in column p; last: (B,) each row's last real column.
    Slots 0..P-1 of the caches are overwritten (padding columns too: they stay masked until a
    decode step writes over them). Returns the caches and the logits (B, V) at `last`.
    """
    TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    x, cache = model.cached_features(tokens, KVCache(cache_k, cache_v))  # (B, P, C)
    x = x[jnp.arange(tokens.shape[0]), last]  # (B, C): only each row's last token needs logits
    return cache.k, cache.v, model.logits(x)


def _step(
    graphdef: nnx.GraphDef,
    span: int,
    state: nnx.State,
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One new token per row through the model. tokens, pos: (B,) int32; row b's token sits at
    position pos[b], its key/value go to cache slot pos[b] (in place: the caches are donated), and
    it attends to slots 0..pos[b] of its row, read from the first `span` slots only. Returns the
    caches and the next logits (B, V)."""
    TRACES["step"] += 1
    model = nnx.merge(graphdef, state)
    x, cache = model.cached_features(tokens[:, None], KVCache(cache_k, cache_v, pos=pos, span=span))  # (B, 1, C)
    return cache.k, cache.v, model.logits(x[:, 0])


def _step_on_leaves(
    graphdef: nnx.GraphDef,
    treedef: Any,
    span: int,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """_step over the state's leaves: at every call JAX flattens a list of arrays in C++, an nnx.State
    in Python (about half a millisecond for GPT-2's 149 arrays: a few percent of a step)."""
    return _step(graphdef, span, jax.tree.unflatten(treedef, leaves), cache_k, cache_v, tokens, pos)


def _full_forward(graphdef: nnx.GraphDef, state: nnx.State, window: jax.Array, last: jax.Array) -> jax.Array:
    """No cache: the model's own forward pass over (B, T) windows, logits (B, V) at `last`."""
    TRACES["full"] += 1
    model = nnx.merge(graphdef, state)
    return model(window)[jnp.arange(window.shape[0]), last].astype(jnp.float32)


_prefill_jit = jax.jit(_prefill, static_argnums=0, donate_argnums=(2, 3))
_full_forward_jit = jax.jit(_full_forward, static_argnums=0)


def decoding_model(model: nnx.Module, rows: int) -> nnx.Module:
    """The model as its decode step runs for `rows` tokens at once, made once per decoder.

    The same forward pass (gpt.py) over the same weights, in another layout: unrolled, so that
    no step slices a layer's weights out of a scan_layers model's stacked arrays (XLA copies such
    a slice); untied, so that the token embedding stays float32 for its lookups while the head
    multiplies compute-dtype values; every dense kernel converted once by the operations of
    ops.for_decoding(rows), so that no step casts a weight.
    """
    ops = model.ops.for_decoding(rows)
    graphdef, abstract, kernels = _decoding_structure(model.cfg, ops)
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    weights = unstack_layer_weights({".".join(map(str, path)): var.get_value() for path, var in flat})
    missing = [path for path, _ in abstract if ".".join(map(str, path)) not in weights]
    assert len(missing) == int(model.cfg.tie_embeddings), missing  # a tied model's head: the copy's one new kernel
    leaves = []
    for path, var in abstract:
        value = weights.get(".".join(map(str, path)))
        value = head_weight(model).T if value is None else value  # (C, V), as an untied head's kernel
        leaves.append((path, var.replace(ops.decode_kernel(value) if path in kernels else value)))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


@functools.lru_cache(maxsize=8)
def _decoding_structure(cfg: ModelConfig, ops: Ops) -> tuple[nnx.GraphDef, list[tuple[Any, Any]], frozenset[Any]]:
    """decoding_model's structure for a model config (tracing a model's init takes seconds): its graph,
    its abstract parameters (path, variable) and the paths of its dense kernels."""
    twin = abstract_model(dataclasses.replace(cfg, scan_layers=False, tie_embeddings=False, remat=False), ops)
    graphdef, params = nnx.split(twin, nnx.Param)  # raises if the model held other state
    kernels = frozenset((*path, "kernel") for path, module in nnx.iter_modules(twin) if isinstance(module, nnx.Linear))
    return graphdef, list(nnx.to_flat_state(params)), kernels


def prefill_length(n: int, context_length: int, bucket: int = BUCKET) -> int:
    """The padded length of a prefill whose longest prompt has n tokens: 16, 32, ... up to `bucket`,
    then a multiple of `bucket`, at most the context. Few programs (each length compiles once),
    and a short prompt, the usual one when sampling, is not padded to a whole bucket (a 16-token
    prompt costs a quarter of a 64-token prefill)."""
    size = SHORTEST_PREFILL
    while size < min(n, bucket):
        size *= 2
    return min(context_length, size if n <= size else -(-n // bucket) * bucket)


class KVDecoder:
    """A KV cache for `batch_size` rows of one model, with its prefill and decode programs.

        dec = KVDecoder(model, batch_size=2)
        logits = dec.prefill([[1, 2, 3], [4]])     # (B, V) numpy: next-token logits of each row
        logits = dec.step([5, 6])                  # feed one token per row at position dec.lengths

    A decode step attends over the shortest span of cache slots, a power of two times 128 up to
    context_length, that holds every row: a 1024-token model compiles at most 4 step programs,
    each once, ahead of time (a compiled program refuses other shapes rather than recompile).
    """

    def __init__(self, model: nnx.Module, batch_size: int, *, bucket: int = BUCKET) -> None:
        cfg = model.cfg
        self.cfg, self.batch_size, self.bucket = cfg, batch_size, bucket
        step_model = decoding_model(model, batch_size)
        self.step_graphdef, self.step_state = nnx.split(step_model)
        self._compiler_options = step_model.ops.decode_compiler_options()
        # Decode steps run the decoding_model copy. On the CPU prefills run it too: its weights are
        # in the compute dtype already (a bfloat16 model's own would be cast at every prefill, and
        # a short prompt's rows go through the native kernel: XLA:CPU's bfloat16 dots are slow
        # where the CPU has no bfloat16 instructions, a 16-token prompt took 4-6x a float32
        # prefill on an AVX2 CPU), and it is unrolled (a scan_layers model's prefill would copy
        # every layer's weights out of the stacked arrays), so a scanned model decodes with the
        # very programs of an unrolled one. Elsewhere prefills run the model as it is (each casts
        # or slices its weights once per call, for every prompt token at once).
        on_cpu = step_model.ops.backend == "cpu"
        self.graphdef, self.state = (self.step_graphdef, self.step_state) if on_cpu else nnx.split(model)
        self._step_leaves, self._step_treedef = jax.tree.flatten(self.step_state)
        cache = KVCache.zeros(cfg, batch_size)
        self._cache = (cache.k, cache.v)  # (L, B, H, D, S) keys, transposed; (L, B, H, S, D) values
        self.lengths = np.zeros(batch_size, np.int64)  # tokens held in each row's cache
        self._steps: dict[int, Any] = {}  # span -> compiled step
        self.compile_s = 0.0

    def _compiled_step(self, span: int) -> Any:
        if span not in self._steps:
            started = time.perf_counter()
            ids = jnp.zeros((self.batch_size,), jnp.int32)
            self._steps[span] = (
                jax.jit(_step_on_leaves, static_argnums=(0, 1, 2), donate_argnums=(4, 5))
                .lower(self.step_graphdef, self._step_treedef, span, self._step_leaves, *self._cache, ids, ids)
                .compile(compiler_options=self._compiler_options)
            )
            self.compile_s += time.perf_counter() - started
        return self._steps[span]

    def span_for(self, longest: int) -> int:
        """Cache slots a step reads when the longest advancing row holds `longest` tokens."""
        span = 128
        while span < longest:
            span *= 2
        return min(span, self.cfg.context_length)

    def prefill(self, windows: Sequence[Sequence[int]]) -> np.ndarray:
        """Restart every row from its window (1..context_length tokens, positions from 0);
        returns the next-token logits (B, V)."""
        n = np.array([len(w) for w in windows], np.int64)
        ctx = self.cfg.context_length
        if len(windows) != self.batch_size or n.min() < 1 or n.max() > ctx:
            raise ValueError(f"prefill: need {self.batch_size} windows of 1..{ctx} tokens, got lengths {n.tolist()}")
        P = prefill_length(int(n.max()), ctx, self.bucket)
        tokens = np.zeros((self.batch_size, P), np.int32)
        for row, window in zip(tokens, windows):
            row[: len(window)] = window
        *self._cache, logits = _prefill_jit(
            self.graphdef, self.state, *self._cache, jnp.asarray(tokens), jnp.asarray(n - 1, jnp.int32)
        )
        self.lengths = n
        return np.asarray(logits)

    def step(self, tokens: Sequence[int], advance: np.ndarray | None = None) -> np.ndarray:
        """Append one token per row at position self.lengths[row]; returns the next logits (B, V).

        Rows where `advance` is False (finished rows) are computed but not advanced; what they
        attend to does not matter.
        """
        advance = np.ones(self.batch_size, bool) if advance is None else np.asarray(advance, bool)
        if (self.lengths[advance] >= self.cfg.context_length).any():
            raise ValueError(
                f"step: a row's cache is full ({self.cfg.context_length} tokens); prefill a shorter window"
            )
        pos = np.minimum(self.lengths, self.cfg.context_length - 1).astype(np.int32)
        step = self._compiled_step(self.span_for(int(pos[advance].max(initial=0)) + 1))
        *self._cache, logits = step(self._step_leaves, *self._cache, jnp.asarray(tokens, jnp.int32), jnp.asarray(pos))
        self.lengths = self.lengths + advance
        return np.asarray(logits)


# ----------------------------------------------------------------------------- sampling


_TOP_P_SLACK = 1e-9  # mass this close to top_p counts as reaching it: float rounding adds no token


def filter_logits(logits: np.ndarray, top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """A float64 copy of 1-D logits with every token outside the kept set at -inf.

    top_k keeps exactly the k largest logits (ties go to the lower token id). top_p then keeps the
    smallest set of most likely tokens whose probabilities (renormalised after top_k) add up to
    >= top_p; the most likely token is always kept.
    """
    out = np.array(logits, dtype=np.float64)
    if (top_k is None or top_k >= out.size) and (top_p is None or top_p >= 1.0):
        return out  # nothing to filter: no sort (GPT-2's 50,257 logits take milliseconds to sort)
    order = np.argsort(-out, kind="stable")  # most likely first, ties by lower id
    if top_k is not None and top_k < out.size:
        out[order[top_k:]] = -np.inf
    if top_p is not None and top_p < 1.0:
        ranked = out[order]
        probs = np.exp(ranked - ranked[0])
        probs /= probs.sum()
        mass_before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        out[order[mass_before >= top_p - _TOP_P_SLACK]] = -np.inf
    return out


def sample_next(
    logits: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int | None, top_p: float | None
) -> int:
    """One token id from 1-D logits: argmax when temperature <= 0, else a filtered softmax draw."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    filtered = filter_logits(np.asarray(logits, np.float64) / temperature, top_k, top_p)
    probs = np.exp(filtered - filtered.max())
    return int(rng.choice(probs.size, p=probs / probs.sum()))


@dataclass
class GenerationStats:
    """Where the time of one generate call went (compile of the decode step reported apart)."""

    rows: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefills: int = 0  # the first one plus one per slide
    prefill_tokens: int = 0
    prefill_s: float = 0.0  # includes compiling each new prefill length bucket
    steps: int = 0
    decode_s: float = 0.0
    compile_s: float = 0.0  # the decode step programs (one per attention span), compiled when first needed

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.prefill_s + self.decode_s, 1e-9)

    def summary(self) -> str:
        step_rate = self.steps * self.rows / max(self.decode_s, 1e-9)
        return (
            f"{self.new_tokens} new tokens in {self.prefill_s + self.decode_s:.2f} s = "
            f"{self.tokens_per_s:,.1f} tok/s ({self.rows} row(s); {self.prefills} prefill(s) of "
            f"{self.prefill_tokens} tokens in {self.prefill_s:.2f} s; {self.steps} decode steps in "
            f"{self.decode_s:.2f} s = {step_rate:,.1f} tok/s; decode step compiled in {self.compile_s:.2f} s)"
        )


def stream(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] = 0,
    eot_id: int | Sequence[int] | None = None,
    n_vocab: int | None = None,
    on_full: str = "slide",
    stats: GenerationStats | None = None,
) -> Iterator[list[int | None]]:
    """Decode all prompts together; yield, per step, each row's new token (None once it finished).

    A row finishes at eot_id (not yielded; several ids: any of them, a chat template's end and
    end-of-text), after max_new_tokens, or with on_full="stop" once prompt + new tokens fill
    context_length. n_vocab: the tokenizer's vocabulary; ids past it (a vocab_size padded for
    speed) are never drawn. Each row draws from its own generator, seeded by `seed` (one per row,
    or the same for every row): a row's tokens do not depend on the rows decoded beside it.
    """
    rngs = _row_generators(prompts, seed, on_full)
    ctx, B = model.cfg.context_length, len(prompts)
    keep = max(1, ctx // 2)
    n_vocab = n_vocab or model.cfg.vocab_size
    stats = stats if stats is not None else GenerationStats()
    stats.rows, stats.prompt_tokens = B, sum(len(p) for p in prompts)
    stops = set() if eot_id is None else {eot_id} if isinstance(eot_id, int) else set(eot_id)
    seqs = [list(p) for p in prompts]
    start = [max(0, len(s) - ctx) for s in seqs]  # each row's window is seqs[b][start[b]:]
    done = np.array([on_full == "stop" and len(s) >= ctx for s in seqs])
    if max_new_tokens <= 0 or done.all():
        return

    dec = KVDecoder(model, B)
    logits = _timed_prefill(dec, [s[st:] for s, st in zip(seqs, start)], stats)
    for i in range(max_new_tokens):
        new: list[int | None] = [None] * B
        for b in np.flatnonzero(~done):
            token = sample_next(logits[b, :n_vocab], rngs[b], temperature, top_k, top_p)
            if token in stops:
                done[b] = True
                continue
            seqs[b].append(token)
            new[b] = token
            if on_full == "stop" and len(seqs[b]) - start[b] >= ctx:
                done[b] = True
        stats.new_tokens += sum(t is not None for t in new)
        if any(t is not None for t in new):
            yield new
        if done.all() or i == max_new_tokens - 1:
            return
        full = ~done & (dec.lengths >= ctx)
        if full.any():  # slide: those rows restart from their last `keep` tokens, the others as they are
            for b in np.flatnonzero(full):
                start[b] = len(seqs[b]) - keep
            logits = _timed_prefill(dec, [s[st:] for s, st in zip(seqs, start)], stats)
        else:
            logits = _timed_step(dec, [s[-1] for s in seqs], ~done, stats)


def _row_generators(
    prompts: Sequence[Sequence[int]], seed: int | Sequence[int], on_full: str
) -> list[np.random.Generator]:
    """stream's arguments checked; one seeded generator per row."""
    if on_full not in ON_FULL:
        raise ValueError(f"on_full={on_full!r} must be one of {', '.join(ON_FULL)}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt must hold at least one token")
    seeds = [seed] * len(prompts) if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
    return [np.random.default_rng(s) for s in seeds]


def _timed_prefill(dec: KVDecoder, windows: list[list[int]], stats: GenerationStats) -> np.ndarray:
    t0 = time.perf_counter()
    out = dec.prefill(windows)
    stats.prefill_s += time.perf_counter() - t0
    stats.prefills += 1
    stats.prefill_tokens += sum(map(len, windows))
    return out


def _timed_step(dec: KVDecoder, tokens: list[int], advance: np.ndarray, stats: GenerationStats) -> np.ndarray:
    """dec.step, its time split into compiling (a new attention span) and decoding."""
    t0, compiled = time.perf_counter(), dec.compile_s
    logits = dec.step(tokens, advance=advance)
    stats.compile_s += dec.compile_s - compiled
    stats.decode_s += time.perf_counter() - t0 - (dec.compile_s - compiled)
    stats.steps += 1
    return logits


def generate_batch(
    model: nnx.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, **kwargs: Any
) -> list[list[int]]:
    """The new tokens of each prompt (same keyword arguments as `stream`)."""
    out: list[list[int]] = [[] for _ in prompts]
    for new in stream(model, prompts, max_new_tokens=max_new_tokens, **kwargs):
        for row, token in zip(out, new):
            if token is not None:
                row.append(token)
    return out


def generate(model: nnx.Module, prompt: Sequence[int], *, max_new_tokens: int, **kwargs: Any) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids for one prompt (stops early at eot_id)."""
    for (token,) in stream(model, [prompt], max_new_tokens=max_new_tokens, **kwargs):
        yield token


def full_forward_logits(model: nnx.Module, windows: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Uncached next-token logits (B, V) at column `last` of each (B, T) window: the reference
    that the KV cache must match, and the baseline of the benchmark."""
    graphdef, state = nnx.split(model)
    return np.asarray(_full_forward_jit(graphdef, state, jnp.asarray(windows, jnp.int32), jnp.asarray(last, jnp.int32)))


# ----------------------------------------------------------------------------- command line helpers


def add_sampling_args(
    parser: argparse.ArgumentParser,
    *,
    max_new_tokens: int = 50,
    temperature: float = 0.0,
    top_k_note: str = "",
    on_full: bool = True,
) -> None:
    """The sampling flags of every command that samples; the defaults are the command's (test_generation.py:
    greedy; chat.py: temperature 0.6 and, when sampling, top-k 50, as nanochat's chat_cli)."""
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=f"(default {max_new_tokens})")
    parser.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help=f"0 = greedy, the most likely token every time (default {temperature:g})",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"sample from the k most likely tokens only{top_k_note}; needs --temperature > 0",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample from the smallest set of tokens with this much probability; needs --temperature > 0",
    )
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same text")
    if not on_full:
        return
    parser.add_argument(
        "--on-full",
        choices=ON_FULL,
        default="slide",
        help="when the context is full: slide (re-read the last context_length/2 tokens, default) or stop",
    )


def check_sampling_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 0")
    if args.temperature < 0 or not math.isfinite(args.temperature):
        parser.error(f"--temperature={args.temperature} must be a finite number >= 0")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k={args.top_k} must be >= 1")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p={args.top_p} must be in (0, 1]")
    if args.temperature == 0 and (args.top_p is not None or args.top_k is not None):
        # Greedy decoding takes the most likely token whatever the filters keep: they would be ignored.
        given = "--top-p" if args.top_p is not None else "--top-k"
        parser.error(
            f"{given} filters what is sampled, but --temperature is 0 (greedy, nothing is sampled); "
            f"give --temperature (e.g. 1.0) to sample, or drop {given}"
        )
    if args.seed < 0:
        parser.error(f"--seed={args.seed} must be >= 0")


def continuations(
    model: nnx.Module,
    tok: Tokenizer,
    prompts: Sequence[str],
    args: argparse.Namespace,
    stats: GenerationStats | None = None,
) -> list[str]:
    """Decoded continuations of text prompts, sampled as the command line asks."""
    new = generate_batch(
        model,
        [tok.encode(p) for p in prompts],
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        eot_id=tok.eot_id,
        n_vocab=tok.n_vocab,
        on_full=args.on_full,
        stats=stats,
    )
    return [tok.decode(ids) for ids in new]
