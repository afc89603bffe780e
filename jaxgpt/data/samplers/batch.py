"""One optimiser step's rows: the one batch type every sampler gives and the train step takes, and the
interface every sampler implements.

    batch = Batch(inputs, targets)                           # (k, B, T) int32 each: pre-training
    batch = Batch(inputs, targets, weights, segments)        # packed conversations: their answers only
    batch = Batch(inputs, targets, weights, advantages=adv)  # RL: the sampled tokens, each its advantage
    batch = batch._replace(ref_logprobs=ref, mix=rows)       # RL's leashes: KL to a reference, fine-tuning rows

A NamedTuple, so a JAX pytree as it is (an absent field, None, is an empty subtree): numpy arrays on the
host, placed on the mesh field by field (sharding.put_batch), scanned over its leading k axis by the step.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Protocol

import numpy as np


class Batch(NamedTuple):
    inputs: Any  # (k, B, T) int32 token ids
    targets: Any  # (k, B, T) int32: the token each position predicts
    weights: Any = None  # (k, B, T) float32: the loss counts these targets (answers) and is their mean
    segments: Any = None  # (k, B, T) int32: packed conversations' ids; attention stays within one
    advantages: Any = None  # (k, B, T) float32, RL: each sampled token's advantage (weights mark them)
    old_logprobs: Any = None  # (k, B, T) float32, RL with several updates per batch: the samplers' logprobs
    ref_logprobs: Any = None  # (k, B, T) float32, RL with a KL term: the reference weights' logprobs
    # RL with fine-tuning rows: a Batch of (k, B', T') inputs, targets, weights, segments trained beside the
    # samples (its own row count and width: the rows as the fine-tuning run packed them)
    mix: Any = None

    def map(self, fn: Any) -> Batch:
        """fn applied to every array that is there (a mix's too)."""
        return Batch(*(None if a is None else a.map(fn) if isinstance(a, Batch) else fn(a) for a in self))


def stack(parts: list[Batch]) -> Batch:
    """k microbatches of (B, T) fields as one (k, B, T) Batch."""
    return Batch(*(None if part is None else np.stack([p[j] for p in parts]) for j, part in enumerate(parts[0])))


class Sampler(Protocol):
    """What a split gives training and validation (windows.py, documents.py, conversations/rows.py): row s
    of the run is a pure function of (seed, s), so resuming needs only the step."""

    microbatch_size: int
    seq_len: int
    n_windows: int  # rows per epoch

    def microbatch(self, index: int, rows: slice = slice(None)) -> Batch:
        """(B, T) fields of microbatch `index` (only `rows` of them: a process's own)."""
        ...

    def batch(self, step: int, accum_steps: int, rows: slice = slice(None)) -> Batch:
        """(k, B, T) fields: microbatches step*k .. step*k + k - 1."""
        ...

    def epoch_of(self, step: int, accum_steps: int) -> int:
        """The epoch of optimiser step `step`'s first row."""
        ...

    def validation_count(self, asked: int | Literal["all"]) -> int:
        """Microbatches one validation reads when train.json asks for `asked` (validation_batches)."""
        ...

    def targets_in(self, n_batches: int) -> int:
        """Targets the first `n_batches` microbatches score: what a validation's loss is the mean over."""
        ...

    def describe(self) -> str | None:
        """A line for the start of a run (how rows were packed), or None."""
        ...
