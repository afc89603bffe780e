"""evaluate.py on a tiny bytes model: loss, perplexity and bits per byte against a numpy
computation over the same in-order batches; a uniform model's exact figures; CLI errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, write_run
from flax import nnx

import evaluate
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ModelConfig
from jaxgpt.data.samplers.windows import BatchSampler, WholeSplit
from jaxgpt.data.storage.shards import open_dataset, write_dataset
from jaxgpt.data.tokenizer import BytesTokenizer
from jaxgpt.evaluation import scoring
from jaxgpt.model.gpt import build_model
from jaxgpt.preparation.prepare import dataset_dir

MODEL = {
    "architecture": "gpt2",
    "vocab_size": 257,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 2,
    "n_layers": 1,
    "qkv_bias": True,
    "tie_embeddings": True,
}
TRAIN = {"dataset": {"source": "builtin"}, "tokenizer": "bytes", "microbatch_size": 4, "train_steps": 1}


# The modern recipe's options (model.json); the soft-cap is in the scored logits too.
MODERN = {
    **MODEL,
    "positions": "rotary",
    "norm": "rmsnorm",
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "logit_softcap": 3.0,
    "tie_embeddings": False,
    "qkv_bias": False,
    "bias": False,
    "loss_chunk": 40,
}


def make_run(tmp_path: Path, *, zero: bool = False, model_json: dict = MODEL) -> tuple[Path, nnx.Module]:
    run = write_run(tmp_path / "run", model_json, TRAIN)
    model = build_model(ModelConfig(**model_json), seed=1)
    if zero:  # every parameter 0: logits are all 0, the model is uniform over the vocabulary
        nnx.update(model, jax_tree_zeros(nnx.state(model, nnx.Param)))
    folder = run / "checkpoints" / "20260101T000000Z-step-1"
    folder.mkdir(parents=True)
    ckpt.save_weights(model, folder / ckpt.WEIGHTS)
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    return run, model


def jax_tree_zeros(state: nnx.State) -> nnx.State:
    import jax

    return jax.tree.map(jnp.zeros_like, state)


@pytest.mark.parametrize("model_json", [pytest.param(MODEL, id="gpt2", marks=SLOW), pytest.param(MODERN, id="modern")])
def test_figures_match_a_numpy_computation(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture, model_json: dict
) -> None:
    run, model = make_run(tmp_path, model_json=model_json)
    assert evaluate.main([str(run), "--data-dir", str(data_root), "--max-batches", "3"]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("loss "))
    val = open_dataset(dataset_dir(data_root, "builtin", "bytes")).val
    sampler = BatchSampler(val, microbatch_size=4, seq_len=32, seed=123, shuffle=False)  # in order: seed unused
    nats, tokens, nbytes = 0.0, 0, 0
    for i in range(3):
        x, y = sampler.microbatch(i)[:2]
        assert np.array_equal(x[0], val.read(i * 4 * 32, 32))  # window i*B, from the split's start
        logits = np.asarray(model(jnp.asarray(x)), np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        nats -= np.take_along_axis(logp, y[..., None], -1).sum()
        tokens += y.size
        nbytes += int((y != 256).sum())  # bytes tokenizer: one byte per id, end-of-text none
    loss = nats / tokens
    r = scoring.evaluate(model, BytesTokenizer(), val, batch_size=4, seq_len=32, max_batches=3)
    assert r["tokens"] == tokens == 3 * 4 * 32 and r["bytes"] == nbytes
    assert r["loss"] == pytest.approx(loss, abs=1e-5)
    assert r["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert r["bits_per_byte"] == pytest.approx(nats / (nbytes * math.log(2)), rel=1e-5)
    assert line == f"loss {r['loss']:.4f} | perplexity {r['perplexity']:.3f} | bits per byte {r['bits_per_byte']:.4f}"


def test_a_uniform_model_scores_log_vocab(tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    run, model = make_run(tmp_path, zero=True)
    assert (
        evaluate.main(
            [
                str(run),
                "--data-dir",
                str(data_root),
                "--split",
                "train",
                "--max-batches",
                "2",
                "--batch-size",
                "3",
                "--sequence-length",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "train split" in out and "Scored 96 tokens (" in out and "2 batches x 3 x 16): the first 2 of" in out
    train = open_dataset(dataset_dir(data_root, "builtin", "bytes")).train
    r = scoring.evaluate(model, BytesTokenizer(), train, batch_size=3, seq_len=16, max_batches=2)
    assert r["loss"] == pytest.approx(math.log(257), rel=1e-6)
    assert r["perplexity"] == pytest.approx(257, rel=1e-5)
    assert r["bits_per_byte"] == pytest.approx(math.log2(257) * r["tokens"] / r["bytes"], rel=1e-6)


def test_token_bytes_of_the_gpt2_tokenizer() -> None:
    from jaxgpt.data.tokenizer import TokenizerError, get_tokenizer

    try:
        tok = get_tokenizer("gpt2")
    except TokenizerError as e:
        pytest.skip(str(e))
    lengths = scoring.token_bytes(tok)
    text = "Every effort moves you, naïvely"
    ids = tok.encode(text)
    assert lengths[ids].sum() == len(text.encode("utf-8")) and lengths[tok.eot_id] == 0


def test_errors_are_one_line_exit_2(tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    run, _model = make_run(tmp_path)
    cases = {
        "neither a checkpoint": [str(tmp_path / "missing")],
        "unknown dataset source 'nope'": [str(run), "--dataset", "nope"],
        "exceeds the model's context_length=32": [str(run), "--sequence-length", "33"],
    }
    for needle, args in cases.items():
        assert evaluate.main([*args, "--data-dir", str(data_root)]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as info:
        evaluate.main([str(run), "--max-batches", "0"])
    assert info.value.code == 2
    # A prepared dataset folder works in place of a source name.
    folder = dataset_dir(data_root, "builtin", "bytes")
    assert evaluate.main([str(run), "--dataset", str(folder), "--max-batches", "1"]) == 0


def test_scores_with_the_training_loss_loss_chunk_included(tmp_path: Path, data_root: Path) -> None:
    """evaluate() runs validation's own program (step.eval_sums), so a model.json loss_chunk runs
    the chunked head there too: per batch exactly what eval_sums returns, and the same loss as the
    unchunked model within float32 rounding."""
    import jax

    from jaxgpt.evaluation.scoring import eval_sums

    val = open_dataset(dataset_dir(data_root, "builtin", "bytes")).val
    figures = {}
    for chunk in (None, 24):
        model = build_model(ModelConfig(**{**MODEL, "loss_chunk": chunk}), seed=1)
        figures[chunk] = scoring.evaluate(
            model, BytesTokenizer(), val, batch_size=4, seq_len=32, max_batches=2, progress=False
        )
        batches = WholeSplit(val, microbatch_size=4, seq_len=32)
        want = sum(float(eval_sums(model, *map(jax.device_put, batches.microbatch(i)[:3]))[0]) for i in range(2))
        assert figures[chunk]["loss"] == want / (2 * 4 * 32)
    assert figures[24]["loss"] == pytest.approx(figures[None]["loss"], rel=1e-6)


def np_loss_sum(model: nnx.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Summed cross-entropy of one unpadded window, in float64 numpy over the model's logits."""
    logits = np.asarray(model(jnp.asarray(x[None], jnp.int32)), np.float64)[0]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[:, None], -1).sum())


@pytest.fixture
def small_split(tmp_path: Path):
    """A val split of 1,013 tokens: 1,012 targets = 31 windows of 32 + one of 20; batches of 5
    windows leave the 7th batch two real rows (one of them short) and three padding rows."""
    rng = np.random.default_rng(0)
    val = rng.integers(0, 256, 1013)
    write_dataset(
        tmp_path / "ds",
        source="test",
        options={},
        fingerprint="x",
        tokenizer=BytesTokenizer(),
        splits={"train": [rng.integers(0, 256, 500)], "val": [val]},
        shard_tokens=400,
    )  # 3 shards
    return open_dataset(tmp_path / "ds").val, val


def test_whole_split_scores_every_token_but_the_first_once(small_split) -> None:
    split, val = small_split
    batches = WholeSplit(split, microbatch_size=5, seq_len=32)
    assert (batches.n_targets, batches.n_windows, batches.n_batches) == (1012, 32, 7)
    parts = [batches.microbatch(i) for i in range(7)]
    assert all(x.shape == y.shape == w.shape == (5, 32) for x, y, w in (p[:3] for p in parts))  # one shape: one compile
    xs, ys = (np.concatenate([p[k][p[2] > 0] for p in parts]) for k in (0, 1))
    assert np.array_equal(ys, val[1:]) and np.array_equal(xs, val[:-1])  # tiled in order, each once
    w_last = parts[-1][2]
    assert w_last[0].sum() == 32 and w_last[1].sum() == 20 and not w_last[2:].any()
    same = WholeSplit(split, microbatch_size=5, seq_len=32, targets="same")
    assert same.n_targets == 1013
    assert np.array_equal(np.concatenate([b[1][b[2] > 0] for b in map(same.microbatch, range(same.n_batches))]), val)
    with pytest.raises(Exception, match="microbatch 7 outside 0..6"):
        batches.microbatch(7)


@SLOW  # a training and evaluate.py end to end
def test_evaluate_scores_the_whole_split_exactly(small_split) -> None:
    split, val = small_split
    model = build_model(ModelConfig(**MODEL), seed=2)
    r = scoring.evaluate(model, BytesTokenizer(), split, batch_size=5, seq_len=32, progress=False)
    assert r["tokens"] == split.n_tokens - 1 == 1012 and r["whole_split"] and r["bytes"] == 1012
    nats = sum(
        np_loss_sum(model, val[j * 32 : min(j * 32 + 32, 1012)], val[j * 32 + 1 : min(j * 32 + 33, 1013)])
        for j in range(32)
    )
    assert r["loss"] == pytest.approx(nats / 1012, rel=1e-5)
    line = scoring.report_line(r, "val", "next")
    assert line.startswith("Scored 1,012 tokens (1,012 bytes; 7 batches x 5 x 32): the whole val split of 1,013")
    part = scoring.evaluate(model, BytesTokenizer(), split, batch_size=5, seq_len=32, max_batches=2, progress=False)
    assert part["tokens"] == 320 and not part["whole_split"]
