"""The KV cache of a fixed number of rows, and the compiled programs that fill and advance it.

    dec = KVDecoder(model, rows=16, n_vocab=tok.n_vocab)
    logits = dec.prefill_row(3, prompt_ids)       # (V,): row 3 restarts from this prompt, alone
    dec.copy_row(3, 4)                            # row 4 becomes row 3 (n samples of a prompt: one prefill)
    logits = dec.step(tokens, advance=busy)       # (rows, V): one token per advancing row
    ids, logits = dec.steps(tokens, 16, busy)     # 16 greedy steps in one program: (rows, 16) ids
    rows = dec.step_top(tokens, 64, busy)         # step(), each row's 64 likeliest tokens: [TopCandidates]
    logits = dec.prefill(windows)                 # (rows, V): every row at once
    scores = dec.prompt_logprobs(prompt_ids, 5)   # each prompt token's logprob, the top 5 (echo)
    dec.set_weights(model)                        # new weights, the same programs (RL)

Every program runs the model's own forward with one KVCache; a row's numbers never depend on its
neighbours. Steps run `decoding_model`, an unrolled, untied copy (docs/evaluation.md "Sampling").
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import abstract_model, head_logits, head_weight, unstack_layer_weights
from jaxgpt.model.kv_cache import KVCache
from jaxgpt.ops import Ops

BUCKET = 64  # prefill lengths are rounded up to a multiple of this: few compiles, little padding
SHORTEST_PREFILL = 16  # ... and shorter prompts to 16, 32 or 64 tokens (prefill_length)
MAX_SCORED = 20  # alternatives per prompt token the scoring program ranks (sampling.MAX_LOGPROBS)
# How often each program was traced (a Python side effect that runs only while tracing): the
# tests use it to check that decoding never recompiles.
TRACES: collections.Counter[str] = collections.Counter()


# ----------------------------------------------------------------------------- the programs


def _prefill(
    graphdef: nnx.GraphDef, state: nnx.State, cache_k: jax.Array, cache_v: jax.Array, tokens: jax.Array, last: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every row's right-padded prompt (B, P) through the model; slots 0..P-1 of the caches are
    overwritten (padding too: masked until a step writes over it). Logits (B, V) at `last` (B,)."""
    TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    x, cache = model.cached_features(tokens, KVCache(cache_k, cache_v))  # (B, P, C)
    x = x[jnp.arange(tokens.shape[0]), last]  # (B, C): only each row's last token needs logits
    return cache.k, cache.v, model.logits(x)


def _prefill_row(
    graphdef: nnx.GraphDef,
    treedef: Any,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    last: jax.Array,
    row: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One right-padded prompt (1, P) through the model with a (L, 1, K, D, P) cache of its own,
    whose slots then overwrite slots 0..P-1 of `row` of the shared caches (donated: in place).
    Returns the caches and the (1, V) logits at `last`."""
    TRACES["prefill_row"] += 1
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    L, _, K, D, _ = cache_k.shape
    P_ = tokens.shape[1]
    small = KVCache(jnp.zeros((L, 1, K, D, P_), cache_k.dtype), jnp.zeros((L, 1, K, P_, D), cache_v.dtype))
    x, small = model.cached_features(tokens, small)  # (1, P, C)
    cache_k = jax.lax.dynamic_update_slice(cache_k, small.k, (0, row, 0, 0, 0))
    cache_v = jax.lax.dynamic_update_slice(cache_v, small.v, (0, row, 0, 0, 0))
    return cache_k, cache_v, model.logits(x[jnp.arange(1), last])  # (1, V)


def _copy_row(cache_k: jax.Array, cache_v: jax.Array, src: jax.Array, dst: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row `dst` of both caches becomes row `src` (donated: in place)."""
    take = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=src, slice_size=1, axis=1)
    put = functools.partial(jax.lax.dynamic_update_slice_in_dim, start_index=dst, axis=1)
    return put(cache_k, take(cache_k)), put(cache_v, take(cache_v))


def _step(
    graphdef: nnx.GraphDef,
    treedef: Any,
    span: int,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One new token per row: tokens, pos (B,) int32; row b's token sits at position pos[b], its
    key/value go to slot pos[b] (in place), and it attends to slots 0..pos[b] of its row, read from
    the first `span` slots only. Takes the state's leaves: JAX flattens a list in C++, an nnx.State
    in Python (about half a millisecond for GPT-2's 149 arrays). Returns the caches and (B, V) logits."""
    TRACES["step"] += 1
    return _decode(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), cache_k, cache_v, tokens, pos, span)


def _step_top(
    graphdef: nnx.GraphDef,
    treedef: Any,
    span: int,
    k: int,
    n_vocab: int,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, ...]:
    """_step, and what a top-k draw needs of each row's logits over ids < n_vocab: its k largest
    (B, k) float32 with their ids (B, k) int32, largest first, ties to the lower id (lax.top_k's
    order), and whether it holds a NaN (B,); the (B, n_vocab) logits stay on the device."""
    TRACES["step_top"] += 1
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    cache_k, cache_v, logits = _decode(model, cache_k, cache_v, tokens, pos, span)
    logits = logits[:, :n_vocab]
    values, ids = top_candidates(logits, k)
    return cache_k, cache_v, logits, values, ids, jnp.isnan(logits).any(axis=-1)


def top_candidates(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(..., V) logits -> their k largest and those ids, largest first, ties to the lower id; -0.0
    counted as 0.0, as numpy's comparisons count it (lax.top_k's order puts 0.0 above -0.0)."""
    return jax.lax.top_k(jnp.where(logits == 0, 0.0, logits), k)


def _decode(
    model: nnx.Module, cache_k: jax.Array, cache_v: jax.Array, tokens: jax.Array, pos: jax.Array, span: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """_step's body: the (B,) tokens at positions pos through the model; the caches and (B, V) logits."""
    x, cache = model.cached_features(tokens[:, None], KVCache(cache_k, cache_v, pos=pos, span=span))  # (B, 1, C)
    return cache.k, cache.v, model.logits(x[:, 0])


def _steps(
    graphdef: nnx.GraphDef,
    treedef: Any,
    span: int,
    n: int,
    n_vocab: int,
    leaves: list[jax.Array],
    cache_k: jax.Array,
    cache_v: jax.Array,
    tokens: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """n greedy steps in one program (a burst): _step's step n times, each feeding the argmax (over
    ids < n_vocab) of the last one's logits. Returns the caches, the (B, n) tokens drawn (column i:
    after feeding i tokens of the burst) and the (B, V) logits of the last step. Positions past the
    context are clipped: only rows the caller does not advance reach them."""
    TRACES["steps"] += 1
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    last_slot = model.cfg.context_length - 1

    def one(i: jax.Array, cache_k: jax.Array, cache_v: jax.Array, tokens: jax.Array) -> tuple[jax.Array, ...]:
        cache_k, cache_v, logits = _decode(model, cache_k, cache_v, tokens, jnp.minimum(pos + i, last_slot), span)
        ids = jnp.arange(logits.shape[-1])
        drawn = jnp.argmax(jnp.where(ids < n_vocab, logits, -jnp.inf), axis=-1).astype(jnp.int32)
        return cache_k, cache_v, drawn, logits

    def body(i: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        cache_k, cache_v, tokens, drawn, _ = carry
        cache_k, cache_v, nxt, logits = one(i, cache_k, cache_v, tokens)
        return cache_k, cache_v, nxt, drawn.at[:, i].set(nxt), logits

    cache_k, cache_v, nxt, logits = one(jnp.int32(0), cache_k, cache_v, tokens)
    drawn = jnp.zeros((tokens.shape[0], n), jnp.int32).at[:, 0].set(nxt)
    cache_k, cache_v, _, drawn, logits = jax.lax.fori_loop(1, n, body, (cache_k, cache_v, nxt, drawn, logits))
    return cache_k, cache_v, drawn, logits


def _score(
    graphdef: nnx.GraphDef, treedef: Any, n_vocab: int, leaves: list[jax.Array], tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(1, P) ids -> position t's logprob of token t + 1 (P - 1,) and its MAX_SCORED most likely next
    ids and their logprobs (P - 1, MAX_SCORED): the model's forward pass and head, as evaluate.py
    scores; ids past the tokenizer's n_vocab never rank."""
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    x = model.features(tokens)[0, :-1]  # (P-1, C)
    logits = head_logits(model.ops, model.cfg, head_weight(model), x)  # (P-1, V) float32
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[0, 1:, None], axis=-1)[:, 0]
    ranked = jnp.where(jnp.arange(logp.shape[-1]) < n_vocab, logp, -jnp.inf)
    top_logprobs, top_ids = jax.lax.top_k(ranked, min(MAX_SCORED, n_vocab))
    return chosen, top_ids, top_logprobs


def _full_forward(graphdef: nnx.GraphDef, state: nnx.State, window: jax.Array, last: jax.Array) -> jax.Array:
    """No cache: the model's own forward pass over (B, T) windows, logits (B, V) at `last`."""
    TRACES["full"] += 1
    model = nnx.merge(graphdef, state)
    return model(window)[jnp.arange(window.shape[0]), last].astype(jnp.float32)


_prefill_jit = jax.jit(_prefill, static_argnums=0, donate_argnums=(2, 3))
_full_forward_jit = jax.jit(_full_forward, static_argnums=0)


def full_forward_logits(model: nnx.Module, windows: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Uncached next-token logits (B, V) at column `last` of each (B, T) window: the reference that
    the KV cache must match, and the benchmark's baseline."""
    graphdef, state = nnx.split(model)
    return np.asarray(_full_forward_jit(graphdef, state, jnp.asarray(windows, jnp.int32), jnp.asarray(last, jnp.int32)))


# ----------------------------------------------------------------------------- the decoding copy


def decoding_model(model: nnx.Module, rows: int) -> nnx.Module:
    """The model as its decode step runs for `rows` tokens at once: the same forward pass over the
    same weights, unrolled, untied (the embedding stays float32 for its lookups while the head
    multiplies compute-dtype values), every dense kernel converted once by ops.for_decoding(rows)."""
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
    """decoding_model's structure for a config (tracing a model's init takes seconds): its graph, its
    abstract parameters (path, variable) and the paths of its dense kernels."""
    twin = abstract_model(dataclasses.replace(cfg, scan_layers=False, tie_embeddings=False, remat=False), ops)
    graphdef, params = nnx.split(twin, nnx.Param)  # raises if the model held other state
    kernels = frozenset((*path, "kernel") for path, module in nnx.iter_modules(twin) if isinstance(module, nnx.Linear))
    return graphdef, list(nnx.to_flat_state(params)), kernels


def prefill_length(n: int, context_length: int, bucket: int = BUCKET) -> int:
    """The padded length of a prefill whose longest prompt has n tokens: 16, 32, ... up to `bucket`,
    then a multiple of `bucket`, at most the context: few programs, and a short prompt is not padded
    to a whole bucket."""
    size = SHORTEST_PREFILL
    while size < min(n, bucket):
        size *= 2
    return min(context_length, size if n <= size else -(-n // bucket) * bucket)


@dataclass(frozen=True)
class TopCandidates:
    """One row's next token as a top-k draw needs it (KVDecoder.step_top): the k most likely ids of
    its logits with their values (largest first, ties to the lower id), whether the logits hold a
    NaN, and the whole logits, fetched from the device only when asked."""

    values: np.ndarray  # (k,) float32
    ids: np.ndarray  # (k,) int32
    nan: bool
    _logits: Any  # (B, n_vocab) on the device, this row's at _row
    _row: int

    def logits(self) -> np.ndarray:
        return np.asarray(self._logits[self._row])


@dataclass(frozen=True)
class PromptScores:
    """An echoed prompt's scores: for each token after the first, its logprob given the tokens before
    it and the `k` most likely tokens there (ids and logprobs, most likely first)."""

    logprobs: np.ndarray  # (n - 1,) float32
    top_ids: np.ndarray  # (n - 1, k) int32
    top_logprobs: np.ndarray  # (n - 1, k) float32


# ----------------------------------------------------------------------------- the decoder


class KVDecoder:
    """A KV cache of `rows` rows for one model, with its programs (see the module's docstring)."""

    def __init__(
        self, model: nnx.Module, rows: int, n_vocab: int | None = None, *, mesh: Any = None, bucket: int = BUCKET
    ) -> None:
        self.cfg, self.batch_size, self.bucket, self.mesh = model.cfg, rows, bucket, mesh
        self.n_vocab = n_vocab or model.cfg.vocab_size
        if mesh is not None and rows % mesh.shape["data"]:
            raise ValueError(f"{rows} rows do not divide by the mesh's data axis ({mesh.shape['data']} devices)")
        self.set_weights(model)
        self.reset()
        self._programs: dict[tuple[str, Any], Any] = {}  # (kind, span, (span, n) or padded length) -> compiled
        self.compile_s = 0.0

    def reset(self) -> None:
        """An empty cache (allocated once here; every program then updates it in place)."""
        cache = KVCache.zeros(self.cfg, self.batch_size, self._cache_dtype)
        self._cache = [self._put(cache.k, 1), self._put(cache.v, 1)]  # rows over the data axis
        self.lengths = np.zeros(self.batch_size, np.int64)  # tokens held in each row's cache

    def set_weights(self, model: nnx.Module) -> None:
        """Take `model`'s weights (the same structure: the compiled programs stay)."""
        step_model = decoding_model(model, self.batch_size)
        self.step_graphdef, self.step_state = nnx.split(step_model)
        self._compiler_options = step_model.ops.decode_compiler_options()
        self._cache_dtype = step_model.ops.kv_dtype()
        leaves, self._step_treedef = jax.tree.flatten(self.step_state)
        self._step_leaves = [self._put(leaf) for leaf in leaves]
        # On the CPU prefills run the decoding copy too: its weights are in the compute dtype already
        # and unrolled (a bfloat16 model's own would be cast, a scanned one's sliced, at every
        # prefill). Elsewhere prefills run the model as it is, all prompt tokens at once.
        on_cpu = self.on_cpu = step_model.ops.backend == "cpu"
        self.graphdef, self.state = (self.step_graphdef, self.step_state) if on_cpu else nnx.split(model)
        leaves, self._prefill_treedef = jax.tree.flatten(self.state)
        self._prefill_leaves = [self._put(leaf) for leaf in leaves]
        self._scoring_graphdef, scoring = nnx.split(model)  # echo's logprobs run the model itself
        leaves, self._scoring_treedef = jax.tree.flatten(scoring)
        self._scoring_leaves = [self._put(leaf) for leaf in leaves]

    def _put(self, array: Any, rows_axis: int | None = None) -> Any:
        """On the mesh (if any): replicated, or spread over the data axis along `rows_axis`."""
        if self.mesh is None:
            return array
        spec = [None] * np.ndim(array)
        if rows_axis is not None:
            spec[rows_axis] = "data"
        return jax.device_put(array, NamedSharding(self.mesh, P(*spec)))

    def _compiled(self, kind: str, size: Any) -> Any:
        """A program compiled ahead of time, once: a call then hashes no graph and flattens no state,
        and refuses other shapes rather than recompile."""
        if (kind, size) not in self._programs:
            started = time.perf_counter()
            # Example arguments placed as the calls place theirs (a compiled program takes no other).
            ids, one = self._put(np.zeros(self.batch_size, np.int32), 0), self._put(np.zeros(1, np.int32))
            scalar = self._put(np.int32(0))
            tokens = self._put(np.zeros((1, size), np.int32)) if kind in ("prefill", "score") else None
            if kind == "step":
                lowered = jax.jit(_step, static_argnums=(0, 1, 2), donate_argnums=(4, 5)).lower(
                    self.step_graphdef, self._step_treedef, size, self._step_leaves, *self._cache, ids, ids
                )
            elif kind in ("step_top", "steps"):  # size: (span, candidates k) or (span, steps n)
                program = _step_top if kind == "step_top" else _steps
                lowered = jax.jit(program, static_argnums=(0, 1, 2, 3, 4), donate_argnums=(6, 7)).lower(
                    self.step_graphdef,
                    self._step_treedef,
                    *size,
                    self.n_vocab,
                    self._step_leaves,
                    *self._cache,
                    ids,
                    ids,
                )
            elif kind == "prefill":
                lowered = jax.jit(_prefill_row, static_argnums=(0, 1), donate_argnums=(3, 4)).lower(
                    self.graphdef, self._prefill_treedef, self._prefill_leaves, *self._cache, tokens, one, scalar
                )
            elif kind == "copy":
                lowered = jax.jit(_copy_row, donate_argnums=(0, 1)).lower(*self._cache, scalar, scalar)
            else:
                lowered = jax.jit(_score, static_argnums=(0, 1, 2)).lower(
                    self._scoring_graphdef, self._scoring_treedef, self.n_vocab, self._scoring_leaves, tokens
                )
            options = self._compiler_options if kind in ("step", "step_top", "steps") else None
            self._programs[kind, size] = lowered.compile(compiler_options=options)
            self.compile_s += time.perf_counter() - started
        return self._programs[kind, size]

    def span_for(self, longest: int) -> int:
        """Cache slots a step reads when the longest advancing row holds `longest` tokens."""
        span = 128
        while span < longest:
            span *= 2
        return min(span, self.cfg.context_length)

    def prefill_row(self, row: int, prompt: Sequence[int]) -> np.ndarray:
        """Restart `row` from `prompt` (1..context_length ids, positions from 0); its next-token logits
        (V,). The other rows keep their caches and lengths."""
        n, ctx = len(prompt), self.cfg.context_length
        if not 0 <= row < self.batch_size or not 1 <= n <= ctx:
            raise ValueError(f"prefill_row: row {row} of {self.batch_size}, a prompt of 1..{ctx} ids, got {n}")
        tokens = np.zeros((1, prefill_length(n, ctx, self.bucket)), np.int32)
        tokens[0, :n] = prompt
        program = self._compiled("prefill", tokens.shape[1])
        last = self._put(np.asarray([n - 1], np.int32))
        *self._cache, logits = program(
            self._prefill_leaves, *self._cache, self._put(tokens), last, self._put(np.int32(row))
        )
        lengths = self.lengths.copy()  # step() replaces the array: never change one it handed out
        lengths[row] = n
        self.lengths = lengths
        return np.asarray(logits[0])

    def copy_row(self, src: int, dst: int) -> None:
        """Row `dst` becomes a copy of row `src` (cache and length)."""
        program = self._compiled("copy", 0)
        self._cache = list(program(*self._cache, self._put(np.int32(src)), self._put(np.int32(dst))))
        lengths = self.lengths.copy()
        lengths[dst] = lengths[src]
        self.lengths = lengths

    def step(self, tokens: Sequence[int], advance: np.ndarray | None = None) -> np.ndarray:
        """Append one token per row at position self.lengths[row]; the next logits (B, V). Rows where
        `advance` is False are computed but not advanced (what they attend to does not matter)."""
        advance, pos, span = self._positions(advance, 1, "step")
        program = self._compiled("step", span)
        tokens = self._put(np.asarray(tokens, np.int32), 0)
        *self._cache, logits = program(self._step_leaves, *self._cache, tokens, pos)
        self.lengths = self.lengths + advance
        return np.asarray(logits)

    def step_top(self, tokens: Sequence[int], k: int, advance: np.ndarray | None = None) -> list[TopCandidates]:
        """step(), handing back each row's k most likely tokens rather than its logits: on an
        accelerator a top-k draw then moves (B, k) values from the device, not (B, V), and the host
        partitions nothing."""
        advance, pos, span = self._positions(advance, 1, "step")
        program = self._compiled("step_top", (span, k))
        tokens = self._put(np.asarray(tokens, np.int32), 0)
        *self._cache, logits, values, ids, nan = program(self._step_leaves, *self._cache, tokens, pos)
        self.lengths = self.lengths + advance
        values, ids, nan = jax.device_get((values, ids, nan))
        return [TopCandidates(values[b], ids[b], bool(nan[b]), logits, b) for b in range(self.batch_size)]

    def _positions(self, advance: np.ndarray | None, n: int, caller: str) -> tuple[np.ndarray, Any, int]:
        """For n steps: the advancing rows (all when None), each row's next slot (placed), the span read."""
        advance = np.ones(self.batch_size, bool) if advance is None else np.asarray(advance, bool)
        if (self.lengths[advance] + n > self.cfg.context_length).any():
            raise ValueError(
                f"{caller}: a row's cache has no room for {n} more token(s) ({self.cfg.context_length} slots); "
                "prefill a shorter window"
            )
        pos = np.minimum(self.lengths, self.cfg.context_length - 1).astype(np.int32)
        return advance, self._put(pos, 0), self.span_for(int(pos[advance].max(initial=0)) + n)

    def steps(self, tokens: Sequence[int], n: int, advance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """n greedy steps in one program: the same as n calls of step(), each fed the argmax over ids
        < n_vocab of the last one's logits. Returns the (B, n) ids drawn and the last step's (B, V)
        logits; advancing rows' lengths grow by n (each must have room for n more)."""
        advance, pos, span = self._positions(advance, n, "steps")
        program = self._compiled("steps", (span, n))
        tokens = self._put(np.asarray(tokens, np.int32), 0)
        *self._cache, drawn, logits = program(self._step_leaves, *self._cache, tokens, pos)
        self.lengths = self.lengths + n * advance
        drawn, logits = jax.device_get((drawn, logits))
        return np.asarray(drawn), np.asarray(logits)

    def prefill(self, windows: Sequence[Sequence[int]]) -> np.ndarray:
        """Restart every row from its window (1..context_length tokens) in one program; (B, V) logits."""
        n = np.array([len(w) for w in windows], np.int64)
        ctx = self.cfg.context_length
        if len(windows) != self.batch_size or n.min() < 1 or n.max() > ctx:
            raise ValueError(f"prefill: need {self.batch_size} windows of 1..{ctx} tokens, got lengths {n.tolist()}")
        tokens = np.zeros((self.batch_size, prefill_length(int(n.max()), ctx, self.bucket)), np.int32)
        for row, window in zip(tokens, windows):
            row[: len(window)] = window
        *self._cache, logits = _prefill_jit(
            self.graphdef, self.state, *self._cache, self._put(tokens, 0), self._put((n - 1).astype(np.int32), 0)
        )
        self.lengths = n
        return np.asarray(logits)

    def prompt_logprobs(self, prompt: Sequence[int], k: int) -> PromptScores:
        """Each prompt token's logprob after the ones before it, and the `k` (<= MAX_SCORED) most
        likely tokens at each position (the padding after the prompt changes no scored position)."""
        n, ctx = len(prompt), self.cfg.context_length
        assert 1 <= n <= ctx and 0 <= k <= MAX_SCORED, (n, k)
        tokens = np.zeros((1, prefill_length(n, ctx, self.bucket)), np.int32)
        tokens[0, :n] = prompt
        program = self._compiled("score", tokens.shape[1])
        chosen, top_ids, top_lp = jax.device_get(program(self._scoring_leaves, self._put(tokens)))
        return PromptScores(chosen[: n - 1], top_ids[: n - 1, :k], top_lp[: n - 1, :k])

    def warm_up(self) -> float:
        """Compile what a first short request runs (a 16-token prefill, a row copy, the shortest span's
        step, a 16-token echo); the rest compiles when first needed. Returns the seconds."""
        started = time.perf_counter()
        self.prefill_row(0, [0])
        self.copy_row(0, 0)
        self.prompt_logprobs([0, 0], 1)
        self.step(np.zeros(self.batch_size, np.int32), np.zeros(self.batch_size, bool))
        self.lengths = np.zeros(self.batch_size, np.int64)
        return time.perf_counter() - started
