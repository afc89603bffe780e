"""The deterministic batch sampler that feeds training, and whole-split windows for validation.

    ds = open_dataset(Path("data/builtin-bytes"))                 # jaxgpt/data/storage/shards.py
    sampler = BatchSampler(ds.train, microbatch_size=8, seq_len=256, seed=0)
    batch = sampler.batch(step, accum_steps)       # Batch: (k, B, T) int32 inputs and targets

Pure numpy: nothing here imports jax.
"""

from __future__ import annotations

import threading
from typing import Literal

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.batch import Batch, stack
from jaxgpt.data.storage.shards import TokenSplit


def check_ids(split: TokenSplit, tokens: np.ndarray, starts: np.ndarray) -> None:
    """DataError naming the shard if a (rows, width) batch read from positions `starts` holds an id
    above the manifest's max_token_id.

    A shard changed in place keeps its size, so only --verify's hashes would notice; an id above
    the manifest's bound (which train.py checks against the model's vocab_size) would make the
    embedding lookup read out of range silently. One max() per batch catches it.
    """
    limit = split.max_token_id
    if limit is None or not tokens.size or int(tokens.max()) <= limit:
        return
    row, col = (int(i) for i in np.argwhere(tokens > limit)[0])
    file, offset = split.locate(int(starts[row]) + col)
    raise DataError(
        f"{file}: token id {int(tokens[row, col])} at offset {offset} exceeds the manifest's "
        f"max_token_id {limit} (shard changed or corrupt; check with download_dataset.py --verify)"
    )


class BatchSampler:
    """Deterministic (inputs, targets) batches: a pure function of (seed, index), so resuming needs only the step.

    The split is cut into n_windows = (n_tokens - 1) // seq_len non-overlapping windows starting
    at i*seq_len. Sequence s (s = index*B + b) is window perm(seed, epoch)[s % n_windows] with
    epoch = s // n_windows, so each epoch visits every window exactly once.
    """

    def __init__(
        self,
        split: TokenSplit,
        *,
        microbatch_size: int,
        seq_len: int,
        seed: int,
        targets: str = "next",
        shuffle: bool = True,
    ) -> None:
        if targets not in ("next", "same"):
            raise DataError(f"{split.name} split: targets must be 'next' or 'same', got {targets!r}")
        if microbatch_size < 1 or seq_len < 1:
            raise DataError(
                f"{split.name} split: microbatch_size and seq_len must be >= 1, got {microbatch_size}, {seq_len}"
            )
        if seed < 0:  # numpy's SeedSequence rejects negative entropy
            raise DataError(f"{split.name} split: seed must be >= 0, got {seed}")
        self.split = split
        self.microbatch_size = microbatch_size
        self.seq_len = seq_len
        self.seed = seed
        self.targets = targets
        self.shuffle = shuffle
        self.n_windows = max(0, (split.n_tokens - 1) // seq_len)
        if self.n_windows < microbatch_size:
            raise DataError(
                f"{split.name} split: dataset too small: {split.n_tokens} tokens make {self.n_windows} windows of "
                f"seq_len {seq_len}, fewer than microbatch_size {microbatch_size}"
            )
        # Windows read seq_len+1 tokens for "next" targets (y is x shifted by one).
        self._width = seq_len + 1 if targets == "next" else seq_len
        self._perms: dict[int, np.ndarray] = {}  # epoch -> permutation; a permutation of millions costs ~0.1 s
        self._lock = threading.Lock()  # a prefetch thread may call batch() while the main thread does too

    def _perm(self, epoch: int) -> np.ndarray:
        with self._lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
                if len(self._perms) >= 2:  # consecutive batches touch at most two epochs; bound the memory
                    self._perms.pop(min(self._perms))
                self._perms[epoch] = perm
            return perm

    def _windows(self, seqs: np.ndarray) -> np.ndarray:
        """Window indices of the given global sequence numbers."""
        count = len(seqs)
        if not self.shuffle:
            return seqs % self.n_windows
        epochs, pos = np.divmod(seqs, self.n_windows)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._perm(int(epoch))[pos[mask]]
        return out

    def _sequences(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.empty((len(seqs), self._width), dtype=np.int32)
        windows = self._windows(seqs)
        for row, window in zip(tokens, windows):
            self.split.read_into(int(window) * self.seq_len, row)
        self._check_ids(tokens, windows)
        if self.targets == "next":
            return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
        return tokens, tokens.copy()

    def _check_ids(self, tokens: np.ndarray, windows: np.ndarray) -> None:
        check_ids(self.split, tokens, windows * self.seq_len)

    def microbatch(self, index: int, rows: slice = slice(None)) -> Batch:
        """(B, T) int32 inputs and targets of microbatch `index` (only `rows` of them, if given)."""
        if index < 0:
            raise DataError(f"{self.split.name} split: microbatch index must be >= 0, got {index}")
        return Batch(*self._sequences(index * self.microbatch_size + self._row_ids(rows)))

    def batch(self, step: int, accum_steps: int, rows: slice = slice(None)) -> Batch:
        """(k, B, T) int32 inputs and targets: microbatches step*k .. step*k+k-1 (k = accum_steps).

        rows: in a multi-process run each process reads only its own rows of every microbatch.
        """
        if step < 0 or accum_steps < 1:
            raise DataError(f"{self.split.name} split: need step >= 0 and accum_steps >= 1, got {step}, {accum_steps}")
        b, k = self.microbatch_size, accum_steps
        ids = self._row_ids(rows)
        seqs = ((step * k + np.arange(k, dtype=np.int64))[:, None] * b + ids[None, :]).reshape(-1)
        x, y = self._sequences(seqs)
        return Batch(x.reshape(k, len(ids), -1), y.reshape(k, len(ids), -1))

    def _row_ids(self, rows: slice) -> np.ndarray:
        return np.arange(self.microbatch_size, dtype=np.int64)[rows]

    def epoch_of(self, step: int, accum_steps: int) -> int:
        """Epoch of the first sequence of optimiser step `step` (0-based)."""
        return (step * accum_steps * self.microbatch_size) // self.n_windows

    def validation_count(self, asked: int | Literal["all"]) -> int:
        assert asked != "all", "validation_batches 'all' reads a WholeSplit"
        return asked

    def targets_in(self, n_batches: int) -> int:
        return n_batches * self.microbatch_size * self.seq_len

    def describe(self) -> str | None:
        return None


class WholeSplit:
    """The whole split in order, every target token scored exactly once: (B, T) microbatches of
    inputs, targets and 0/1 weights, the same shapes for every index (one compiled program).

    Window j holds inputs tokens[j*T : j*T+T] and targets one further on (targets "same": the same
    tokens), as BatchSampler(shuffle=False) reads them; the last window stops at the split's end, the
    padding after it weighted 0. n_targets: the split's tokens minus its first ("next"), or all ("same").
    """

    def __init__(self, split: TokenSplit, *, microbatch_size: int, seq_len: int, targets: str = "next") -> None:
        if targets not in ("next", "same") or microbatch_size < 1 or seq_len < 1:
            raise DataError(
                f"{split.name} split: need targets 'next' or 'same' and sizes >= 1, got "
                f"{targets!r}, microbatch_size {microbatch_size}, seq_len {seq_len}"
            )
        self.split, self.microbatch_size, self.seq_len, self.targets = split, microbatch_size, seq_len, targets
        self.shift = int(targets == "next")
        self.n_targets = max(0, split.n_tokens - self.shift)
        if self.n_targets == 0:
            raise DataError(f"{split.name} split: {split.n_tokens} token(s), nothing to score")
        self.n_windows = -(-self.n_targets // seq_len)
        self.n_batches = -(-self.n_windows // microbatch_size)

    def microbatch(self, index: int, rows: slice = slice(None)) -> Batch:
        """(B, T) int32 inputs, int32 targets and float32 weights of microbatch `index` (its `rows`)."""
        if not 0 <= index < self.n_batches:
            raise DataError(f"{self.split.name} split: microbatch {index} outside 0..{self.n_batches - 1}")
        T = self.seq_len
        windows = index * self.microbatch_size + np.arange(self.microbatch_size, dtype=np.int64)[rows]
        tokens = np.zeros((len(windows), T + self.shift), np.int32)
        weights = np.zeros((len(windows), T), np.float32)
        for row, window in enumerate(windows):
            n = int(min(T, self.n_targets - window * T))  # targets in this window; <= 0: a padding row
            if n > 0:
                self.split.read_into(int(window) * T, tokens[row, : n + self.shift])
                weights[row, :n] = 1.0
        check_ids(self.split, tokens, windows * T)
        if self.shift:
            return Batch(np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:]), weights)
        return Batch(tokens, tokens.copy(), weights)

    def batch(self, step: int, accum_steps: int, rows: slice = slice(None)) -> Batch:
        return stack([self.microbatch(step * accum_steps + i, rows) for i in range(accum_steps)])

    def epoch_of(self, step: int, accum_steps: int) -> int:
        return 0  # read once, in order

    def validation_count(self, asked: int | Literal["all"]) -> int:
        return self.n_batches  # the whole split, whatever is asked

    def targets_in(self, n_batches: int) -> int:
        return (
            self.n_targets
            if n_batches >= self.n_batches
            else int(sum(self.microbatch(i).weights.sum() for i in range(n_batches)))
        )

    def describe(self) -> str | None:
        return None
