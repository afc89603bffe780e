"""A step's samples as what the update trains on: each sample's advantage within its group, and the rows
of prompt + sampled tokens with the sampled ones marked. Pure numpy.

    adv = group_advantages(rewards, normalise=False)        # (P, G): reward minus the group's mean
    batch = sample_rows(prompts, sampled, adv.reshape(-1), width=128, k=2)   # Batch of (k, B, T) arrays
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxgpt.data.samplers.batch import Batch

STD_EPS = 1e-4  # "mean_std": a group whose rewards are all equal has advantage 0, not 0/0


def group_advantages(rewards: np.ndarray, normalise: bool) -> np.ndarray:
    """(P, G) rewards -> (P, G) advantages: each reward minus the mean of its group (its prompt's G
    samples); normalise: then divided by the group's standard deviation (+ STD_EPS)."""
    rewards = np.asarray(rewards, np.float64)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if normalise:
        centred = centred / (rewards.std(axis=1, keepdims=True) + STD_EPS)
    return centred.astype(np.float32)


def sample_rows(
    prompts: Sequence[Sequence[int]], sampled: Sequence[Sequence[int]], advantages: np.ndarray, width: int, k: int
) -> Batch:
    """Row i: prompt i then its sampled tokens (a stop token included), inputs and targets shifted by one,
    weight 1 and advantage[i] on the targets that are sampled tokens, padding after; (k, B, T) fields,
    B = rows / k, T = width."""
    n = len(prompts)
    assert n == len(sampled) == len(advantages) and n % k == 0, (n, len(sampled), len(advantages), k)
    inputs, targets = np.zeros((n, width), np.int32), np.zeros((n, width), np.int32)
    weights, adv = np.zeros((n, width), np.float32), np.zeros((n, width), np.float32)
    for i, (prompt, answer) in enumerate(zip(prompts, sampled)):
        seq = [*prompt, *answer]
        if len(seq) - 1 > width:
            raise ValueError(f"row {i}: {len(prompt)} prompt + {len(answer)} sampled tokens exceed {width} + 1")
        inputs[i, : len(seq) - 1], targets[i, : len(seq) - 1] = seq[:-1], seq[1:]
        answer_targets = slice(len(prompt) - 1, len(seq) - 1)  # target t is token t + 1
        weights[i, answer_targets], adv[i, answer_targets] = 1.0, advantages[i]
    shape = (k, n // k, width)
    return Batch(inputs, targets, weights, advantages=adv).map(lambda a: a.reshape(shape))
