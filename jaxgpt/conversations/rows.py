"""Rows of whole conversations for instruction fine-tuning: packed by best fit, padded, never cut
across, each token attending to its own conversation only.

    rows = ConversationRows(ds.train, microbatch_size=8, seq_len=256, seed=0, too_long="drop")
    batch = rows.batch(step, accum_steps)     # Batch of (k, B, T): inputs, targets, loss weights, segments

A row holds T + 1 tokens: whole conversations by best fit, then padding (token 0, segment 0,
weight 0). Each conversation has its own segment id (1, 2, ...), so a packed row trains as one row per
conversation would; only answer tokens carry weight 1. A conversation longer than a row is dropped
(too_long "crop": cut), counted in describe(). Epoch e is shuffled by (seed, e); validation in order.
Pure numpy. More: docs/fine-tuning.md "Fine-tuning".
"""

from __future__ import annotations

import bisect
import threading
from typing import Literal

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.batch import Batch, stack
from jaxgpt.data.samplers.documents import BUFFER
from jaxgpt.data.samplers.windows import check_ids
from jaxgpt.data.storage.shards import TokenSplit


def pack_padded(lengths: np.ndarray, capacity: int, buffer: int = BUFFER) -> tuple[list[int], list[int]]:
    """Best fit without cropping: rows of at most `capacity` tokens from units of these lengths (each at
    most `capacity`), in this order. Returns (row_ptr, unit): row r holds units unit[row_ptr[r]:row_ptr[r+1]]."""
    waiting: list[tuple[int, int]] = []  # (length, arrival), sorted: ties go to the earliest arrival
    arrived, n = 0, len(lengths)
    row_ptr, unit = [0], []
    while True:
        room, first = capacity, len(unit)
        while True:
            while len(waiting) < buffer and arrived < n:
                bisect.insort(waiting, (int(lengths[arrived]), arrived))
                arrived += 1
            fits = bisect.bisect_right(waiting, (room, n)) - 1  # the longest that fits, if any
            if fits < 0:
                break
            length, index = waiting.pop(bisect.bisect_left(waiting, (waiting[fits][0], -1)))
            unit.append(index)
            room -= length
        if len(unit) == first:
            return row_ptr, unit
        row_ptr.append(len(unit))


def _shuffled_rows(row_ptr: np.ndarray, unit: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The same rows (row r: unit[row_ptr[r]:row_ptr[r+1]]) in a random order."""
    sizes = np.diff(row_ptr)
    order = rng.permutation(len(sizes))
    new_ptr = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int64)
    return new_ptr, np.concatenate([unit[row_ptr[r] : row_ptr[r + 1]] for r in order]) if len(order) else unit


class ConversationRows:
    """Training (shuffle=True) or validation (shuffle=False) rows of a conversation split (module docstring)."""

    def __init__(
        self,
        split: TokenSplit,
        *,
        microbatch_size: int,
        seq_len: int,
        seed: int,
        too_long: str = "drop",
        shuffle: bool = True,
        pack: bool = True,
        buffer: int = BUFFER,
    ) -> None:
        if split.conversation_starts is None or split.masks is None:
            raise DataError(
                f"{split.name} split: not a conversation dataset (no loss mask); prepare it with the "
                f"conversations or instructions source"
            )
        if microbatch_size < 1 or seq_len < 1 or seed < 0 or too_long not in ("drop", "crop"):
            raise DataError(
                f"{split.name} split: need microbatch_size, seq_len >= 1, seed >= 0 and too_long drop or "
                f"crop, got {microbatch_size}, {seq_len}, {seed}, {too_long!r}"
            )
        self.split, self.microbatch_size, self.seq_len, self.seed = split, microbatch_size, seq_len, seed
        self.shuffle, self.buffer, self.too_long, self.targets = shuffle, buffer, too_long, "next"
        self.pack = pack
        starts = split.conversation_starts
        lengths = np.diff(np.append(starts, split.n_tokens))
        self.n_conversations = len(starts)
        self.starts, self.lengths, self.too_long_count = self._fitting(starts, lengths)
        if not len(self.starts):
            raise DataError(
                f"{split.name} split: none of its {self.n_conversations} conversations fits a row of "
                f"{seq_len + 1} tokens; raise sequence_length (or context_length)"
            )
        self._plans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._rows_before: list[int] = [0]
        self._lock = threading.RLock()  # a prefetch thread may call batch() while the main thread does too
        self.n_windows = len(self.plan(0)[0]) - 1  # rows per epoch (the first's)
        if shuffle and self.n_windows < microbatch_size:
            raise DataError(
                f"{split.name} split: its conversations pack into {self.n_windows} rows of {seq_len + 1} "
                f"tokens, fewer than microbatch_size {microbatch_size}"
            )

    def _fitting(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """The conversations training uses: those that fit a row, and (crop) the cut ones with an answer
        left; and how many were longer than a row."""
        capacity = self.seq_len + 1
        fits = lengths <= capacity
        too_long = int((~fits).sum())
        if self.too_long == "crop":
            for i in np.flatnonzero(~fits):
                mask = np.empty(capacity, np.uint8)
                self.split.read_mask_into(int(starts[i]), mask)
                fits[i] = bool(mask[1:].any())  # a target left to train on
            lengths = np.minimum(lengths, capacity)
        return starts[fits], lengths[fits], too_long

    def plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch `epoch`'s rows as (row_ptr, conversation index per slot), planned once."""
        with self._lock:
            if epoch not in self._plans:
                order = (
                    np.random.default_rng([self.seed, epoch]).permutation(len(self.starts))
                    if self.shuffle
                    else np.arange(len(self.starts))
                )
                if self.pack:
                    row_ptr, unit = pack_padded(self.lengths[order], self.seq_len + 1, self.buffer)
                else:  # one conversation per row, padded (the book's collate)
                    row_ptr, unit = np.arange(len(order) + 1), np.arange(len(order))
                row_ptr, unit = np.asarray(row_ptr, np.int64), order[np.asarray(unit, np.int64)]
                if self.shuffle:  # rows in a shuffled order too: best fit leaves the short conversations
                    row_ptr, unit = _shuffled_rows(row_ptr, unit, np.random.default_rng([self.seed, epoch, 1]))
                self._plans[epoch] = (row_ptr, unit)  # to the epoch's last rows, a batch of one task
                if len(self._plans) > 2:  # consecutive batches touch at most two epochs
                    self._plans.pop(max((e for e in self._plans if e != epoch), key=lambda e: abs(e - epoch)))
            return self._plans[epoch]

    def _locate(self, seq: int) -> tuple[int, int]:
        with self._lock:
            while self._rows_before[-1] <= seq:
                e = len(self._rows_before) - 1
                self._rows_before.append(self._rows_before[-1] + len(self.plan(e)[0]) - 1)
            e = bisect.bisect_right(self._rows_before, seq) - 1
            return e, seq - self._rows_before[e]

    def _row(self, seq: int | None, out: tuple[np.ndarray, ...]) -> None:
        """Fill one row's (T+1,) tokens, mask and segments (seq None: a padding row)."""
        tokens, mask, seg = out
        tokens[:], mask[:], seg[:] = 0, 0, 0
        if seq is None:
            return
        epoch, row = self._locate(seq) if self.shuffle else (0, seq)
        row_ptr, units = self.plan(epoch)
        pos = 0
        for number, c in enumerate(units[row_ptr[row] : row_ptr[row + 1]], start=1):
            start, length = int(self.starts[c]), int(self.lengths[c])
            self.split.read_into(start, tokens[pos : pos + length])
            self.split.read_mask_into(start, mask[pos : pos + length])
            seg[pos : pos + length] = number
            pos += length

    def _rows(self, seqs: list[int | None]) -> Batch:
        T1 = self.seq_len + 1
        tokens, mask, seg = (
            np.empty((len(seqs), T1), np.int32),
            np.empty((len(seqs), T1), np.uint8),
            np.empty((len(seqs), T1), np.int32),
        )
        for i, seq in enumerate(seqs):
            self._row(seq, (tokens[i], mask[i], seg[i]))
        if self.split.max_token_id is not None and tokens.size and int(tokens.max()) > self.split.max_token_id:
            r, c = (int(i) for i in np.argwhere(tokens > self.split.max_token_id)[0])
            check_ids(self.split, tokens[r : r + 1, c : c + 1], np.zeros(1, np.int64))
        same = (seg[:, :-1] == seg[:, 1:]) & (seg[:, :-1] > 0)  # target t belongs to input t's conversation
        weights = (mask[:, 1:] * same).astype(np.float32)
        return Batch(
            np.ascontiguousarray(tokens[:, :-1]),
            np.ascontiguousarray(tokens[:, 1:]),
            weights,
            np.ascontiguousarray(seg[:, :-1]),
        )

    def microbatch(self, index: int, rows: slice = slice(None)) -> Batch:
        """(B, T) inputs, targets, float32 weights and int32 segments of microbatch `index` (its `rows`);
        validation rows past the split's last are padding (weight 0)."""
        if index < 0:
            raise DataError(f"{self.split.name} split: microbatch index must be >= 0, got {index}")
        seqs = index * self.microbatch_size + np.arange(self.microbatch_size)[rows]
        return self._rows([int(s) if self.shuffle or s < self.n_windows else None for s in seqs])

    def batch(self, step: int, accum_steps: int, rows: slice = slice(None)) -> Batch:
        """(k, B, T) arrays of microbatches step*k .. step*k+k-1."""
        if step < 0 or accum_steps < 1:
            raise DataError(f"{self.split.name} split: need step >= 0 and accum_steps >= 1, got {step}, {accum_steps}")
        return stack([self.microbatch(step * accum_steps + i, rows) for i in range(accum_steps)])

    def epoch_of(self, step: int, accum_steps: int) -> int:
        return self._locate(step * accum_steps * self.microbatch_size)[0]

    @property
    def n_batches(self) -> int:
        """Validation: microbatches that hold every row once."""
        return -(-self.n_windows // self.microbatch_size)

    def validation_count(self, asked: int | Literal["all"]) -> int:
        return self.n_batches if asked == "all" else min(asked, self.n_batches)

    def targets_in(self, n_batches: int) -> int:
        """Validation: tokens scored by the first n_batches microbatches."""
        return int(sum(self.microbatch(i).weights.sum() for i in range(min(n_batches, self.n_batches))))

    def describe(self) -> str:
        """One line for the start of a run: conversations, rows, padding and what did not fit."""
        row_ptr, units = self.plan(0)
        used = int(self.lengths[units].sum())
        rows = len(row_ptr) - 1
        dropped = ""
        if self.too_long_count:
            kept = len(self.starts) - int(
                (np.diff(np.append(self.split.conversation_starts, self.split.n_tokens)) <= self.seq_len + 1).sum()
            )
            dropped = f"; {self.too_long_count:,} longer than a row: " + (
                f"cropped ({self.too_long_count - kept:,} of them dropped, no answer left in the row)"
                if self.too_long == "crop"
                else "dropped (dataset option too_long)"
            )
        return (
            f"packing conversations: {len(self.starts):,} of {self.n_conversations:,} in the {self.split.name} split "
            f"into {rows:,} rows of {self.seq_len + 1} tokens, {1 - used / max(rows * (self.seq_len + 1), 1):.1%} "
            f"padding{dropped}"
        )
