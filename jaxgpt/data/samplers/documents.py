"""Document-aligned training rows (train.json "packing": "documents"): nanochat's BOS-aligned best-fit
packing, made a pure function of (seed, step) like BatchSampler's windows.

    sampler = DocumentSampler(ds.train, microbatch_size=8, seq_len=256, seed=0, eot_id=ds.eot_id)
    batch = sampler.batch(step, accum_steps)       # Batch: (k, B, T) int32 inputs and targets

A unit is an end-of-text id and the document after it (it plays nanochat's beginning-of-sequence
token; units of fewer than two tokens are left out). Epoch e takes the units in an order shuffled by
(seed, e) and packs rows of T + 1 tokens by best fit from up to `buffer` waiting units; when none
fits, the shortest is cropped to fill the row. Every token is trained on (no padding); describe()
reports the cropped fraction. Sequence s of the run is row s of the concatenated epochs. Validation
reads windows (windows.py). How and why: docs/data.md "Document-aligned rows". Pure numpy.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.data.samplers.windows import check_ids
from jaxgpt.data.storage.shards import TokenSplit

BUFFER = 1000  # units waiting to be packed (nanochat's buffer_size)
_SCAN = 1 << 24  # tokens read at a time when looking for end-of-text ids (64 MiB of int32 at most)


@dataclass(frozen=True)
class Plan:
    """One epoch's rows: row r is segments row_ptr[r] .. row_ptr[r+1]-1, each `length` tokens from `start`."""

    row_ptr: np.ndarray  # (R + 1,) int64
    start: np.ndarray  # (S,) int64: a global token position in the split
    length: np.ndarray  # (S,) int64
    cropped: int  # tokens of this epoch's units that no row holds

    @property
    def rows(self) -> int:
        return len(self.row_ptr) - 1


def document_units(split: TokenSplit, eot_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the split's units: each end-of-text id with the document after it."""
    found = []
    for lo in range(0, split.n_tokens, _SCAN):
        found.append(lo + np.flatnonzero(split.read(lo, min(_SCAN, split.n_tokens - lo)) == eot_id))
    starts = np.concatenate([np.zeros(1, np.int64), *found]).astype(np.int64)
    starts = np.unique(starts)  # a split that starts with end-of-text: 0 once
    lengths = np.diff(np.append(starts, split.n_tokens))
    keep = lengths >= 2
    return starts[keep], lengths[keep]


def best_fit(lengths: np.ndarray, capacity: int, buffer: int = BUFFER) -> tuple[list[int], list[int], list[int]]:
    """Pack units of these lengths, in this order, into rows of `capacity` tokens (module docstring).
    Returns (row_ptr, unit, take): segment j is the first take[j] tokens of unit[j] (an index into
    `lengths`), row r its segments row_ptr[r] .. row_ptr[r+1]-1."""
    waiting: list[tuple[int, int]] = []  # (length, arrival), sorted: ties go to the earliest arrival
    arrived, n = 0, len(lengths)
    row_ptr, unit, take = [0], [], []
    while True:
        room, first = capacity, len(unit)
        while room:
            while len(waiting) < buffer and arrived < n:
                bisect.insort(waiting, (int(lengths[arrived]), arrived))
                arrived += 1
            if not waiting:
                break
            fits = bisect.bisect_right(waiting, (room, n)) - 1  # the longest that fits, if any
            if fits >= 0:
                length, index = waiting.pop(bisect.bisect_left(waiting, (waiting[fits][0], -1)))
            else:
                (length, index), length = waiting.pop(0), room  # the shortest, cropped to the room
            unit.append(index)
            take.append(length)
            room -= length
        if room:  # the units ran out: this last row is dropped
            del unit[first:], take[first:]
            return row_ptr, unit, take
        row_ptr.append(len(unit))


class DocumentSampler:
    """BatchSampler's interface over document-aligned rows (module docstring); a pure function of
    (seed, index), so resuming needs only the step."""

    def __init__(
        self,
        split: TokenSplit,
        *,
        microbatch_size: int,
        seq_len: int,
        seed: int,
        eot_id: int,
        targets: str = "next",
        buffer: int = BUFFER,
    ) -> None:
        if targets != "next":
            raise DataError(f"{split.name} split: packed documents have next-token targets, got {targets!r}")
        if microbatch_size < 1 or seq_len < 1 or seed < 0:
            raise DataError(
                f"{split.name} split: need microbatch_size, seq_len >= 1 and seed >= 0, got "
                f"{microbatch_size}, {seq_len}, {seed}"
            )
        self.split, self.microbatch_size, self.seq_len, self.seed = split, microbatch_size, seq_len, seed
        self.buffer, self.targets = buffer, "next"
        self.starts, self.lengths = document_units(split, eot_id)
        if len(self.starts) < 2:
            raise DataError(
                f"{split.files[0] if split.files else split.name}: the {split.name} split holds "
                f"{len(self.starts)} document(s) (no end-of-text id {eot_id} between texts); "
                f"packing 'documents' needs a corpus of many documents, use 'windows'"
            )
        self._plans: dict[int, Plan] = {}
        self._rows_before: list[int] = [0]  # rows in epochs 0 .. e-1, for each e planned so far
        self._lock = threading.RLock()  # a prefetch thread may call batch() while the main thread does too
        self.n_windows = self.plan(0).rows  # rows per epoch (the first's): what a run's length is checked against
        if self.n_windows < microbatch_size:
            raise DataError(
                f"{split.name} split: its {len(self.starts)} documents pack into {self.n_windows} rows "
                f"of {seq_len + 1} tokens, fewer than microbatch_size {microbatch_size}"
            )

    def plan(self, epoch: int) -> Plan:
        """Epoch `epoch`'s rows, planned once (and the epochs before it, for the row count)."""
        with self._lock:
            if epoch not in self._plans:
                order = np.random.default_rng([self.seed, epoch]).permutation(len(self.starts))
                row_ptr, unit, take = best_fit(self.lengths[order], self.seq_len + 1, self.buffer)
                units = order[np.asarray(unit, np.int64)]
                taken = np.asarray(take, np.int64)
                self._plans[epoch] = Plan(
                    np.asarray(row_ptr, np.int64), self.starts[units], taken, int(self.lengths.sum() - taken.sum())
                )
                if len(self._plans) > 2:  # consecutive batches touch at most two epochs; bound the memory
                    self._plans.pop(max((e for e in self._plans if e != epoch), key=lambda e: abs(e - epoch)))
            return self._plans[epoch]

    def _locate(self, seq: int) -> tuple[int, int]:
        """(epoch, row in it) of global sequence `seq`: epochs' row counts differ (cropping varies)."""
        with self._lock:
            while self._rows_before[-1] <= seq:
                e = len(self._rows_before) - 1
                self._rows_before.append(self._rows_before[-1] + self.plan(e).rows)
            e = bisect.bisect_right(self._rows_before, seq) - 1
            return e, seq - self._rows_before[e]

    def _segments(self, seq: int) -> tuple[list[int], list[int]]:
        """(starts, lengths) of the segments of global sequence `seq`'s row."""
        epoch, row = self._locate(seq)
        plan = self.plan(epoch)
        lo, hi = int(plan.row_ptr[row]), int(plan.row_ptr[row + 1])
        return plan.start[lo:hi].tolist(), plan.length[lo:hi].tolist()

    def _sequences(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.empty((len(seqs), self.seq_len + 1), np.int32)
        for out, seq in zip(tokens, seqs):
            pos = 0
            for start, length in zip(*self._segments(int(seq))):
                self.split.read_into(start, out[pos : pos + length])
                pos += length
        self._check_ids(tokens, seqs)
        return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])

    def _check_ids(self, tokens: np.ndarray, seqs: np.ndarray) -> None:
        """batches.check_ids for packed rows: the position named is the bad token's own."""
        limit = self.split.max_token_id
        if limit is None or not tokens.size or int(tokens.max()) <= limit:
            return
        row, col = (int(i) for i in np.argwhere(tokens > limit)[0])
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(*self._segments(int(seqs[row])))])
        check_ids(self.split, tokens[row : row + 1, col : col + 1], positions[col : col + 1])

    def microbatch(self, index: int, rows: slice = slice(None)) -> Batch:
        """(B, T) int32 inputs and targets of microbatch `index` (only `rows` of them, if given)."""
        if index < 0:
            raise DataError(f"{self.split.name} split: microbatch index must be >= 0, got {index}")
        return Batch(
            *self._sequences(index * self.microbatch_size + np.arange(self.microbatch_size, dtype=np.int64)[rows])
        )

    def batch(self, step: int, accum_steps: int, rows: slice = slice(None)) -> Batch:
        """(k, B, T) int32 inputs and targets: microbatches step*k .. step*k+k-1, as BatchSampler.batch."""
        if step < 0 or accum_steps < 1:
            raise DataError(f"{self.split.name} split: need step >= 0 and accum_steps >= 1, got {step}, {accum_steps}")
        b, k = self.microbatch_size, accum_steps
        ids = np.arange(b, dtype=np.int64)[rows]
        seqs = ((step * k + np.arange(k, dtype=np.int64))[:, None] * b + ids[None, :]).reshape(-1)
        x, y = self._sequences(seqs)
        return Batch(x.reshape(k, len(ids), -1), y.reshape(k, len(ids), -1))

    def epoch_of(self, step: int, accum_steps: int) -> int:
        """Epoch of the first sequence of optimiser step `step` (0-based)."""
        return self._locate(step * accum_steps * self.microbatch_size)[0]

    def validation_count(self, asked: int | Literal["all"]) -> int:
        assert asked != "all", "validation reads windows"
        return asked

    def targets_in(self, n_batches: int) -> int:
        return n_batches * self.microbatch_size * self.seq_len

    def describe(self) -> str:
        """One line for the start of a run: documents, rows and what cropping cost in epoch 0."""
        plan = self.plan(0)
        return (
            f"packing documents: {len(self.starts):,} documents of the train split into {plan.rows:,} rows of "
            f"{self.seq_len + 1} tokens an epoch, {plan.cropped / max(int(self.lengths.sum()), 1):.1%} of their "
            f"tokens cropped (epoch 0)"
        )
