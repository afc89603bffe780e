"""Instruction fine-tuning: packed conversation rows (jaxgpt/conversations/rows.py), the loss on answers
only against a numpy reference, no attention across conversations in a row, and a fine-tuning run
killed with SIGKILL that resumes exactly."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, SLOW, cases, wait_for_step, write_run
from flax import nnx

import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.config import ModelConfig, TrainConfig
from jaxgpt.conversations.rows import ConversationRows, pack_padded
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.model.gpt import build_model
from jaxgpt.model.loss import loss_fn
from jaxgpt.ops import select
from jaxgpt.preparation.prepare import prepare_dataset
from jaxgpt.tracking.history import read_record
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.train_step import step_key, train_step

SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
INSTRUCTIONS = {"source": "instructions", "options": {"examples": 400, "validation_examples": 40, "template": SHORT}}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 96, "emb_dim": 32, "n_heads": 2, "n_layers": 2}
TRAIN = {
    "dataset": INSTRUCTIONS,
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "gradient_accumulation_steps": 2,
    "train_steps": 30,
    "learning_rate": 0.003,
    "checkpoint_interval": 10,
    "validation_batches": "all",
    "keep_last_checkpoints": 5,
}


@pytest.fixture(scope="module")
def chat_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-data")
    prepare_dataset("instructions", "bytes", root, options=INSTRUCTIONS["options"], log=lambda _m: None)
    return root


@pytest.fixture(scope="module")
def dataset(chat_root: Path):
    return open_dataset(chat_root / "instructions-bytes")


# ----------------------------------------------------------------------------- rows


def test_pack_padded_places_every_conversation_once_in_rows_that_fit() -> None:
    lengths = np.random.default_rng(0).integers(1, 50, size=300)
    row_ptr, unit = pack_padded(lengths, 64, buffer=20)
    assert sorted(unit) == list(range(300))  # each once, none cut
    sizes = [lengths[unit[a:b]].sum() for a, b in itertools.pairwise(row_ptr)]
    assert max(sizes) <= 64 and min(b - a for a, b in itertools.pairwise(row_ptr)) >= 1
    assert sum(sizes) / (64 * len(sizes)) > 0.9  # best fit leaves little padding with short conversations


def test_rows_hold_whole_conversations_with_their_own_segments_and_answer_weights(dataset) -> None:
    rows = ConversationRows(dataset.train, microbatch_size=4, seq_len=95, seed=0)
    x, y, w, seg = rows.batch(3, 2)[:4]
    assert x.shape == y.shape == w.shape == seg.shape == (2, 4, 95)
    starts = dataset.train.conversation_starts
    lengths = dict(zip(starts.tolist(), np.diff(np.append(starts, dataset.train.n_tokens)).tolist()))
    for xr, yr, wr, sr in zip(x.reshape(-1, 95), y.reshape(-1, 95), w.reshape(-1, 95), seg.reshape(-1, 95)):
        ids = sorted(set(sr[sr > 0].tolist()))
        assert ids == list(range(1, len(ids) + 1))  # 1, 2, ... in order, then padding (0)
        assert (np.diff(sr[sr > 0]) >= 0).all() and (sr[len(sr[sr > 0]) :] == 0).all()
        for s in ids:  # each segment is one whole conversation of the split
            at = np.flatnonzero(sr == s)
            n = len(at)
            # Its last token is the next input, or (it fills the row) the last target.
            found = [
                a
                for a, length in lengths.items()
                if (length == n or (length == n + 1 and at[-1] == 94))
                and a + length <= dataset.train.n_tokens
                and np.array_equal(dataset.train.read(a, n), xr[at])
                and (length == n or dataset.train.read(a + n, 1)[0] == yr[94])
            ]
            assert found, "a segment that is no whole conversation of the split"
            mask = np.empty(lengths[found[0]], np.uint8)
            dataset.train.read_mask_into(found[0], mask)
            # target t is trained on when it is an answer token of input t's own conversation
            np.testing.assert_array_equal(wr[at], [mask[j + 1] if j + 1 < len(mask) else 0 for j in range(n)])
        assert (wr[sr == 0] == 0).all()
    # A pure function of (seed, step): a new sampler (a resumed run) gives the same batch.
    again = ConversationRows(dataset.train, microbatch_size=4, seq_len=95, seed=0).batch(3, 2)
    for a, b in zip((x, y, w, seg), again):
        np.testing.assert_array_equal(a, b)


def test_an_epoch_trains_every_conversation_once_and_validation_every_held_out_one(dataset) -> None:
    rows = ConversationRows(dataset.train, microbatch_size=4, seq_len=95, seed=1)
    n = rows.n_windows
    trained = sum(
        int(((seg[:, 1:] != seg[:, :-1]) & (seg[:, 1:] > 0)).sum() + (seg[:, 0] > 0).sum())
        for seg in (rows.microbatch(i)[3] for i in range(-(-n // 4)))
    )
    assert trained >= 400  # the epoch's rows hold all 400 (the last microbatch may run into the next epoch)
    val = ConversationRows(dataset.val, microbatch_size=4, seq_len=95, seed=0, shuffle=False)
    answer_tokens = int(sum(np.asarray(m).sum() for m in dataset.val.masks))
    assert val.targets_in(val.n_batches) == answer_tokens  # every held-out answer token scored once
    assert val.microbatch(val.n_batches)[2].sum() == 0  # past the end: padding rows


def test_conversations_longer_than_a_row_are_dropped_or_cropped_and_counted(dataset) -> None:
    lengths = np.diff(np.append(dataset.train.conversation_starts, dataset.train.n_tokens))
    seq = int(np.median(lengths))  # about half the conversations are longer than seq + 1
    long = int((lengths > seq + 1).sum())
    dropped = ConversationRows(dataset.train, microbatch_size=4, seq_len=seq, seed=0)
    assert dropped.too_long_count == long and len(dropped.starts) == len(lengths) - long
    assert f"{long:,} longer than a row: dropped" in dropped.describe()
    cropped = ConversationRows(dataset.train, microbatch_size=4, seq_len=seq, seed=0, too_long="crop")
    assert len(cropped.starts) > len(dropped.starts) and cropped.lengths.max() == seq + 1


# ----------------------------------------------------------------------------- the model and the loss


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**MODEL, **kw})


def _numpy_ce(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], -1)[..., 0]


def test_the_step_loss_is_the_mean_over_every_answer_token_of_the_step(dataset) -> None:
    """Against numpy: the step's loss (k = 2 microbatches with different numbers of answer tokens)
    is sum(CE x weight) / sum(weight) over both, and each microbatch's own mean is reported beside it."""
    cfg = _cfg(n_layers=1)  # one block: the loss and its normalisation are what is checked
    model = build_model(cfg, seed=3)
    x, y, w, seg = ConversationRows(dataset.train, microbatch_size=4, seq_len=95, seed=0).batch(0, 2)[:4]
    w[1, :, 40:] = 0  # microbatch 1 trains on fewer tokens: a mean of means would differ
    logits = np.stack([np.asarray(model(jnp.asarray(x[i]), segments=jnp.asarray(seg[i]))) for i in range(2)])
    ce = _numpy_ce(logits.astype(np.float64), y)
    want = (ce * w).sum() / w.sum()
    optimizer = make_optimizer(model, TrainConfig(microbatch_size=4, gradient_accumulation_steps=2, train_steps=10), 10)
    losses, stats = train_step(model, optimizer, Batch(x, y, w, seg).map(jnp.asarray), step_key(0, 0))
    assert float(stats["loss"]) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(np.asarray(losses), [(ce[i] * w[i]).sum() / w[i].sum() for i in range(2)], rtol=1e-5)
    assert abs(want - np.mean(np.asarray(losses))) > 1e-4  # the step's mean is not the microbatches' mean


def test_accumulated_gradients_are_those_of_the_whole_steps_token_mean(dataset) -> None:
    cfg = _cfg(n_layers=1)
    model = build_model(cfg, seed=4)
    x, y, w, seg = (
        jnp.asarray(a) for a in ConversationRows(dataset.train, microbatch_size=4, seq_len=95, seed=0).batch(1, 2)[:4]
    )
    total = w.sum()

    def accumulated(m):  # what train_step's microbatches average: each scaled by k / the step's weight
        return sum(loss_fn(m, x[i], y[i], None, w[i], seg[i], 2 / total) for i in range(2)) / 2

    def whole(m):  # one batch of all the rows: the mean over every trained token
        def flat(a: jax.Array) -> jax.Array:
            return a.reshape(-1, a.shape[-1])

        return loss_fn(m, flat(x), flat(y), None, flat(w), flat(seg), 1 / total)

    ga, gb = nnx.jit(nnx.grad(accumulated))(model), nnx.jit(nnx.grad(whole))(model)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-7)


VARIANTS = {
    "gpt2": {},
    "rotary": {"positions": "rotary", "norm": "rmsnorm", "qk_norm": True, "mlp": "relu2"},
    "per-head": {"attention": "per_head"},
    "scanned-windows-gqa": {
        "scan_layers": True,
        "window_pattern": "SL",
        "short_window": 8,
        "n_kv_heads": 1,
        "positions": "rotary",
        "value_embeds": True,
    },
    "remat-chunked": {"remat": True, "loss_chunk": 64},
}


@pytest.mark.parametrize("options", cases(VARIANTS, fast=["gpt2"]))
def test_no_token_attends_to_another_conversation_in_its_row(options: dict) -> None:
    """A row of two conversations computes each exactly as if it were alone at the start of a row
    (positions restart too), and changing one never changes the other's logits."""
    cfg = _cfg(**options)
    model = build_model(
        cfg, seed=5, ops=select(dataclasses.replace(cfg, attention="xla") if cfg.attention == "auto" else cfg)
    )
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, 30), rng.integers(0, 256, 50)
    row = np.concatenate([a, b, np.zeros(16, int)]).astype(np.int32)  # (96,)
    other = row.copy()
    other[:30] = rng.integers(0, 256, 30)  # the first conversation changed, the second the same
    seg = np.concatenate([np.full(30, 1), np.full(50, 2), np.zeros(16)]).astype(np.int32)
    packed, changed = np.asarray(model(jnp.asarray(np.stack([row, other])), segments=jnp.asarray(np.stack([seg, seg]))))
    alone = np.stack([np.pad(b, (0, 46)), np.pad(a, (0, 66))]).astype(np.int32)
    alone_b, alone_a = np.asarray(model(jnp.asarray(alone)))  # one text per row: the plain path
    np.testing.assert_allclose(packed[30:80], alone_b[:50], atol=2e-5)
    np.testing.assert_allclose(packed[:30], alone_a[:30], atol=2e-5)
    np.testing.assert_array_equal(changed[30:80], packed[30:80])
    assert np.abs(changed[:30] - packed[:30]).max() > 1e-3


# ----------------------------------------------------------------------------- a fine-tuning run


def _resumable_losses(run: Path) -> dict[int, float]:
    return dict(zip(*read_record(run).series("train/loss")))


@SLOW
def test_a_fine_tuning_run_killed_with_sigkill_resumes_exactly(tmp_path: Path, chat_root: Path) -> None:
    straight = write_run(tmp_path / "straight", MODEL, TRAIN)
    assert train.main([str(straight), "--data-dir", str(chat_root)]) == 0
    run = write_run(tmp_path / "run", MODEL, TRAIN)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(chat_root)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for_step(run, proc, 10)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: whatever was not saved is lost
    proc.communicate()
    assert 10 <= cf.step_of(cf.latest_checkpoint(run)) < 30
    assert train.main([str(run), "--data-dir", str(chat_root)]) == 0
    a, b = _resumable_losses(run), _resumable_losses(straight)
    assert sorted(b) == list(range(1, 31)) and set(a) == set(b)
    np.testing.assert_array_equal([a[s] for s in sorted(a)], [b[s] for s in sorted(b)])
    from safetensors.numpy import load_file

    wa = load_file(str(cf.latest_checkpoint(run) / cf.WEIGHTS))
    wb = load_file(str(cf.latest_checkpoint(straight) / cf.WEIGHTS))
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)
    assert (cf.latest_checkpoint(run) / "chat_template.json").is_file()  # every checkpoint carries the template
