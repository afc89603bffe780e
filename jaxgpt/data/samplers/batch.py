"""One optimiser step's rows: the one batch type every sampler gives and the train step takes.

    batch = Batch(inputs, targets)                           # (k, B, T) int32 each: pre-training
    batch = Batch(inputs, targets, weights, segments)        # packed conversations: their answers only
    batch = Batch(inputs, targets, weights, advantages=adv)  # RL: the sampled tokens, each its advantage

A NamedTuple, so a JAX pytree as it is (an absent field, None, is an empty subtree): numpy arrays on the
host, placed on the mesh field by field (sharding.put_batch), scanned over its leading k axis by the step.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Batch(NamedTuple):
    inputs: Any  # (k, B, T) int32 token ids
    targets: Any  # (k, B, T) int32: the token each position predicts
    weights: Any = None  # (k, B, T) float32: the loss counts these targets (answers) and is their mean
    segments: Any = None  # (k, B, T) int32: packed conversations' ids; attention stays within one
    advantages: Any = None  # (k, B, T) float32, RL: each sampled token's advantage (weights mark them)
    old_logprobs: Any = None  # (k, B, T) float32, RL with several updates per batch: the samplers' logprobs

    def map(self, fn: Any) -> Batch:
        """fn applied to every field that is there."""
        return Batch(*(None if a is None else fn(a) for a in self))
