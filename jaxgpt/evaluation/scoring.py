"""Scoring a model on the device: loss, perplexity and bits per byte over a split, HellaSwag's endings.

    r = evaluate(model, tok, dataset.val, batch_size=8, seq_len=256)   # {"loss", "perplexity", "bits_per_byte", ...}
    r = hellaswag_score(model, examples, tok)                           # {"acc", "acc_norm", ...}
    r = core_score(model, core.prepare(tasks, tok, ...))                # {"core", "tasks": {...}}

The split is read in order as windows of sequence_length + 1 tokens overlapping by one, and scored
whole: every token but the split's first is a target exactly once (padding has weight 0;
max_batches stops earlier). loss: mean next-token cross-entropy in nats; perplexity: exp(loss);
bits per byte: loss x tokens / (ln 2 x bytes), bytes = the UTF-8 bytes the scored targets decode to
(end-of-text counts 0), comparable across tokenizers. The compiled programs (eval_sums,
ending_losses, continuation_stats) use the model's own head and loss_chunk.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from jaxgpt.data.samplers.windows import WholeSplit
from jaxgpt.data.storage.shards import TokenSplit
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.evaluation import core, hellaswag
from jaxgpt.model.gpt import head_logits, head_weight
from jaxgpt.model.loss import loss_sum


@nnx.jit
def eval_sums(
    model: nnx.Module, inputs: jax.Array, targets: jax.Array, weights: jax.Array, segments: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """(sum of the weighted losses, sum of the weights) of one (B, T) microbatch, dropout off:
    summed over batches, their ratio is the exact mean over every scored token (batches.WholeSplit;
    packed conversations, their answer tokens: jaxgpt/conversations/rows.py, with their segments)."""
    return loss_sum(model, inputs, targets, weights, segments), weights.sum()


@nnx.jit
def ending_losses(model: nnx.Module, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """HellaSwag's per-row figures (jaxgpt/evaluation/hellaswag.py): (N, T) int32 rows and (N, T) float32 0/1 masks
    of the tokens to score -> (N,) summed next-token losses of the masked tokens and (N,) their
    counts. Position t predicts token t + 1, so the mask is read from position 1 on (llm.c's
    shift_mask). The head runs one row at a time: (T, V) logits, never (N, T, V)."""
    feats = model.features(tokens)[:, :-1]  # (N, T-1, C)
    targets, weights = tokens[:, 1:], mask[:, 1:]  # (N, T-1)
    w = head_weight(model)

    def row(xs: tuple[jax.Array, ...]) -> jax.Array:
        x, y, m = xs
        logits = head_logits(model.ops, model.cfg, w, x)  # (T-1, V) float32
        return (optax.losses.softmax_cross_entropy_with_integer_labels(logits, y) * m).sum()

    return jax.lax.map(row, (feats, targets, weights)), weights.sum(-1)


@nnx.jit
def continuation_stats(model: nnx.Module, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """CORE's per-row figures (jaxgpt/evaluation/core.py): (N, T) int32 rows and (N, T) float32 0/1
    masks of the tokens scored -> (N,) summed next-token losses of those tokens, (N,) their counts
    and (N,) how many of them the model's argmax predicts. As ending_losses, one row of logits at a time."""
    feats = model.features(tokens)[:, :-1]  # (N, T-1, C)
    targets, weights = tokens[:, 1:], mask[:, 1:]  # (N, T-1)
    w = head_weight(model)

    def row(xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        x, y, m = xs
        logits = head_logits(model.ops, model.cfg, w, x)  # (T-1, V) float32
        loss = optax.losses.softmax_cross_entropy_with_integer_labels(logits, y)
        return (loss * m).sum(), ((jnp.argmax(logits, -1) == y) * m).sum()  # argmax ties: the first id

    sums, hits = jax.lax.map(row, (feats, targets, weights))
    return sums, weights.sum(-1), hits


def token_bytes(tok: Tokenizer) -> np.ndarray:
    """(n_vocab,) UTF-8 byte length of each token id; end-of-text is 0."""
    if tok.name == "bytes":
        lengths = np.ones(tok.n_vocab, np.int64)
    elif tok.name == "gpt2":
        import tiktoken  # tokenizer.py has loaded the encoding already: this is a registry lookup

        enc = tiktoken.get_encoding("gpt2")
        lengths = np.array([len(enc.decode_single_token_bytes(i)) for i in range(tok.n_vocab)], np.int64)
    elif hasattr(tok, "token_bytes"):  # a trained byte-level BPE knows its tokens' bytes (tokenizer.py)
        lengths = tok.token_bytes()
    else:  # any other tokenizer: decoding each id alone is exact for whole-character tokens
        lengths = np.array([len(tok.decode([i]).encode("utf-8")) for i in range(tok.n_vocab)], np.int64)
    lengths[tok.eot_id] = 0
    return lengths


def evaluate(
    model: Any,
    tok: Tokenizer,
    split: TokenSplit,
    *,
    batch_size: int,
    seq_len: int,
    targets: str = "next",
    max_batches: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Score `split` in order with the training loss (eval_sums: validation's program, the
    model's loss_chunk included), the whole split exactly (batches.WholeSplit: every target token
    once, the last batch's padding weighted 0) unless max_batches stops it earlier; returns
    loss, perplexity, bits_per_byte and the counts behind them."""
    windows = -(-max(split.n_tokens - int(targets == "next"), 1) // seq_len)
    batches = WholeSplit(split, microbatch_size=min(batch_size, windows), seq_len=seq_len, targets=targets)
    n_batches = batches.n_batches if max_batches is None else min(batches.n_batches, max_batches)
    nbytes_of = token_bytes(tok)
    total, tokens, nbytes = 0.0, 0, 0
    bar = tqdm(
        range(n_batches),
        unit="batch",
        desc=f"{split.name} split",
        dynamic_ncols=True,
        disable=None if progress is None else not progress,
    )
    for i in bar:
        x, y, w = batches.microbatch(i)[:3]
        total += float(eval_sums(model, *map(jax.device_put, (x, y, w)))[0])
        tokens += int(w.sum())
        nbytes += int(nbytes_of[y[w > 0]].sum())
        bar.set_postfix(loss=f"{total / tokens:.4f}", refresh=False)
    bar.close()
    loss = total / max(tokens, 1)
    return {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "bits_per_byte": total / (math.log(2) * nbytes) if nbytes else math.nan,
        "tokens": tokens,
        "bytes": nbytes,
        "batches": n_batches,
        "batch_size": batches.microbatch_size,
        "seq_len": seq_len,
        "whole_split": n_batches == batches.n_batches,
        "split_tokens": split.n_tokens,
        "split_batches": batches.n_batches,
    }


def hellaswag_score(
    model: Any, examples: list[Any], tok: Tokenizer, *, batch_examples: int = 16, progress: bool | None = None
) -> dict[str, Any]:
    """HellaSwag acc and acc_norm of `model` (hellaswag.py: llm.c's scoring), many examples per
    device call (ending_losses), with the per-ending figures behind them."""
    calls, info = hellaswag.batches(
        examples,
        tok,
        context_length=model.cfg.context_length,
        vocab_size=model.cfg.vocab_size,
        batch_examples=batch_examples,
    )
    sums, counts = np.zeros((len(examples), 4)), np.zeros((len(examples), 4))
    for chunk, tokens, mask in tqdm(
        calls, unit="batch", desc="HellaSwag", dynamic_ncols=True, disable=None if progress is None else not progress
    ):
        # numpy in: uncommitted, so jit places it beside the parameters, wherever (however sharded) they are.
        s, c = jax.device_get(ending_losses(model, tokens, mask))
        sums[chunk], counts[chunk] = s.reshape(-1, 4)[: len(chunk)], c.reshape(-1, 4)[: len(chunk)]
    return hellaswag.accuracy(examples, sums, counts) | info | {"tokenizer": tok.name}


def core_score(
    model: Any, prepared: list[core.PreparedTask], *, rows_per_call: int = 64, progress: bool | None = None
) -> dict[str, Any]:
    """CORE and each task's accuracy and centred accuracy (core.py: nanochat's scoring) of `model`
    over the prepared rows of every task, `rows_per_call` rows per device call (continuation_stats)."""
    work = core.Calls(prepared, context_length=model.cfg.context_length, rows_per_call=rows_per_call)
    n = sum(len(p.rows) for p in prepared)
    sums, counts, hits = np.zeros(n), np.zeros(n), np.zeros(n)
    for chunk, tokens, mask in tqdm(
        work, unit="batch", desc="CORE", dynamic_ncols=True, disable=None if progress is None else not progress
    ):
        s, c, h = jax.device_get(continuation_stats(model, tokens, mask))  # numpy in: placed beside the params
        sums[chunk], counts[chunk], hits[chunk] = s[: len(chunk)], c[: len(chunk)], h[: len(chunk)]
    return core.results(prepared, sums, counts, hits) | {
        "rows": n,
        "calls": len(work),
        "sums": sums,
        "counts": counts,
        "hits": hits,
    }


def report_line(r: dict[str, Any], split: str, targets: str) -> str:
    """How many tokens the figures are over, and which ones."""
    if r["whole_split"]:
        which = (
            f"the whole {split} split of {r['split_tokens']:,} tokens, every one but the first"
            if targets == "next"
            else f"the whole {split} split of {r['split_tokens']:,} tokens"
        )
    else:
        which = f"the first {r['batches']} of the {split} split's {r['split_batches']} batches"
    return (
        f"Scored {r['tokens']:,} tokens ({r['bytes']:,} bytes; {r['batches']} batches x {r['batch_size']} "
        f"x {r['seq_len']}): {which}"
    )
