"""Document-aligned rows (jaxgpt/data/samplers/documents.py, train.json "packing": "documents") on real shards:
every row starts at a document's start and is full, whole documents stay whole, a cropped one
gives its beginning, best fit as nanochat's loop packs (a plain reference written here), each epoch
its own order, a pure function of (seed, step), the one-line errors; and a training run with it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SLOW, write_run

import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, TrainConfig
from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.documents import DocumentSampler, best_fit, document_units
from jaxgpt.data.storage.shards import open_dataset, write_dataset
from jaxgpt.data.tokenizer import BytesTokenizer
from jaxgpt.tracking.history import read_record

EOT = 256


def corpus(tmp_path: Path, n_docs: int = 300, seed: int = 0, first_eot: bool = False) -> Path:
    """A bytes-tokenizer dataset of documents of 3..60 tokens, each followed by end-of-text (as
    download_dataset.py writes them), every document's tokens telling its number and position."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        n = int(rng.integers(3, 61))
        doc = (np.arange(n) * 7 + d) % 250  # recognisable, never the end-of-text id
        docs.append(np.append(doc, EOT).astype(np.uint16))
    if first_eot:
        docs.insert(0, np.array([EOT], np.uint16))
    root = tmp_path / "ds"
    write_dataset(
        root,
        source="test",
        options={},
        fingerprint="fp",
        tokenizer=BytesTokenizer(),
        splits={"train": docs, "val": docs[:20]},
    )
    return root


def nanochat_best_fit(lengths: list[int], capacity: int, buffer: int) -> list[list[tuple[int, int]]]:
    """nanochat's loop as it reads (dataloader.py): scan the buffer for the largest unit that fits
    (the first of equals), else crop the shortest (the first of equals); rows of (unit, tokens)."""
    pending, buf, rows = list(range(len(lengths))), [], []
    while True:
        row, room = [], capacity
        while room:
            while len(buf) < buffer and pending:
                buf.append(pending.pop(0))
            if not buf:
                return rows
            best = max((i for i in buf if lengths[i] <= room), key=lambda i: (lengths[i], -i), default=None)
            if best is None:
                best = min(buf, key=lambda i: (lengths[i], i))
            buf.remove(best)
            take = min(lengths[best], room)
            row.append((best, take))
            room -= take
        rows.append(row)


@pytest.mark.parametrize("buffer", [1, 4, 50])
def test_best_fit_packs_as_nanochats_loop(buffer: int) -> None:
    rng = np.random.default_rng(buffer)
    lengths = rng.integers(2, 90, 400)
    row_ptr, unit, take = best_fit(lengths, 65, buffer)
    got = [list(zip(unit[a:b], take[a:b])) for a, b in zip(row_ptr, row_ptr[1:])]
    # Ties: nanochat takes the first in its buffer's order, which is arrival order here.
    assert got == nanochat_best_fit(lengths.tolist(), 65, buffer)
    assert all(sum(t for _, t in row) == 65 for row in got) and len(got) > 100


def test_units_start_at_each_end_of_text(tmp_path: Path) -> None:
    for first_eot in (False, True):
        ds = open_dataset(corpus(tmp_path / str(first_eot), n_docs=5, first_eot=first_eot))
        starts, lengths = document_units(ds.train, EOT)
        tokens = ds.train.read(0, ds.train.n_tokens)
        assert starts[0] == 0 and all(tokens[s] == EOT for s in starts[1:])
        assert (tokens[starts] == EOT).all() == first_eot
        assert lengths.sum() == ds.train.n_tokens - 1  # the split's final end-of-text alone: a unit of 1, left out


def test_every_row_is_full_starts_a_document_and_keeps_documents_whole(tmp_path: Path) -> None:
    ds = open_dataset(corpus(tmp_path))
    sampler = DocumentSampler(ds.train, microbatch_size=4, seq_len=64, seed=3, eot_id=EOT)
    plan = sampler.plan(0)
    whole = cropped = 0
    tokens = ds.train.read(0, ds.train.n_tokens)
    starts, lengths = document_units(ds.train, EOT)
    unit_length = dict(zip(starts.tolist(), lengths.tolist()))
    for r in range(plan.rows):
        lo, hi = plan.row_ptr[r], plan.row_ptr[r + 1]
        segs = list(zip(plan.start[lo:hi], plan.length[lo:hi]))
        assert sum(n for _, n in segs) == 65
        assert segs[0][0] == 0 or tokens[segs[0][0]] == EOT  # the row opens with a document's start
        for start, n in segs[:-1]:
            assert n == unit_length[start]  # all but the last segment: whole units
            whole += 1
        cropped += segs[-1][1] < unit_length[segs[-1][0]]
    used = plan.start.tolist()
    assert len(used) == len(set(used))  # a unit once per epoch
    assert whole > plan.rows and cropped > 0
    assert plan.cropped == lengths.sum() - plan.length.sum() > 0
    x, y = sampler.batch(0, 2)[:2]
    assert x.shape == y.shape == (2, 4, 64) and (x[:, :, 1:] == y[:, :, :-1]).all()
    first = sampler.plan(0).start[sampler.plan(0).row_ptr[:8]]
    np.testing.assert_array_equal(x.reshape(8, 64)[:, 0], tokens[first])
    line = sampler.describe()
    assert "documents of the train split into" in line and "% of their tokens cropped" in line


def test_a_pure_function_of_seed_and_step_across_epochs(tmp_path: Path) -> None:
    ds = open_dataset(corpus(tmp_path))
    make = lambda seed: DocumentSampler(ds.train, microbatch_size=4, seq_len=64, seed=seed, eot_id=EOT)  # noqa: E731
    a = make(0)
    rows = a.plan(0).rows
    steps = range(0, 3 * rows // 8 + 2)  # well into the third epoch (k = 2: 8 rows a step)
    batches = [a.batch(s, 2) for s in steps]
    fresh = make(0)  # a resumed run: a new sampler asked for a late step first
    for s in reversed(steps):
        for got, want in zip(fresh.batch(s, 2)[:2], batches[s][:2]):
            np.testing.assert_array_equal(got, want)
    assert a.epoch_of(0, 2) == 0 and a.epoch_of(steps[-1], 2) >= 2  # epochs differ a little in rows
    assert a.plan(1).start.tolist() != a.plan(2).start.tolist()  # each epoch its own order
    assert not np.array_equal(make(1).batch(0, 2)[0], batches[0][0])
    rows_part = a.batch(5, 2, rows=slice(1, 3))  # a process's own rows of every microbatch
    np.testing.assert_array_equal(rows_part[0], batches[5][0][:, 1:3])


def test_a_corpus_without_documents_is_a_one_line_error(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    text = (np.arange(5000) % 250).astype(np.uint16)  # one long text, no end-of-text (nanoGPT's Shakespeare cut)
    write_dataset(
        root,
        source="test",
        options={},
        fingerprint="fp",
        tokenizer=BytesTokenizer(),
        splits={"train": [text], "val": [text[:500]]},
    )
    with pytest.raises(DataError, match=r"holds 1 document\(s\) .* packing 'documents' needs a corpus of many") as e:
        DocumentSampler(open_dataset(root).train, microbatch_size=2, seq_len=32, seed=0, eot_id=EOT)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"packing='documents' packs documents for next-token targets"):
        TrainConfig(microbatch_size=2, train_steps=3, targets="same", packing="documents")


@SLOW  # three trainings end to end
def test_a_packed_run_trains_resumes_exactly_and_says_what_cropping_cost(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture
) -> None:
    model = {
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 32,
        "emb_dim": 32,
        "n_heads": 2,
        "n_layers": 1,
    }
    cfg = {
        "dataset": {"source": "builtin"},
        "microbatch_size": 4,
        "train_steps": 6,
        "packing": "documents",
        "checkpoint_interval": 3,
        "validation_batches": 1,
        "learning_rate": 0.003,
    }
    whole = write_run(tmp_path / "whole", model, cfg)
    assert train.main([str(whole), "--data-dir", str(data_root)]) == 0
    assert "packing documents:" in capsys.readouterr().out
    # A run resumed from the step-3 checkpoint trains steps 4-6 on the very rows the whole run did.
    resumed = write_run(tmp_path / "resumed", model, cfg)
    step3 = next(p for p in ckpt.list_checkpoints(whole) if ckpt.step_of(p) == 3)
    shutil.copytree(step3, resumed / "checkpoints" / step3.name)
    assert train.main([str(resumed), "--data-dir", str(data_root)]) == 0
    steps, losses = read_record(resumed).series("train/loss")
    want = dict(zip(*read_record(whole).series("train/loss")))
    assert steps == [4, 5, 6] and losses == [want[s] for s in steps]
    (resumed / "train.json").write_text(json.dumps({**cfg, "train_steps": 9, "packing": "windows"}))
    capsys.readouterr()
    assert train.main([str(resumed), "--data-dir", str(data_root)]) == 2
    err = capsys.readouterr().err
    assert "packing='windows' differs from checkpoint" in err and err.count("\n") == 1
