"""HellaSwag (hellaswag.py, evaluate.py --hellaswag) against an independent scorer written here:
plain numpy over a model's logits, one example and one ending at a time, as llm.c's
dev/data/hellaswag.py computes it; on a random GPT-2 and on an imported one (whose logits come
from the numpy GPT-2 of test_import_gpt2); malformed files, the offline path, the download."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, write_run
from flax import nnx
from model_reference import randomise
from test_import_gpt2 import hf_forward, hf_weights, write_hf

import evaluate
from jaxgpt.config import ModelConfig
from jaxgpt.data.tokenizer import BytesTokenizer, TokenizerError, get_tokenizer
from jaxgpt.evaluation import hellaswag, scoring
from jaxgpt.model.gpt import build_model

WORDS = [
    "the",
    "man",
    "then",
    "woman",
    "slowly",
    "picks",
    "up",
    "a",
    "ball",
    "and",
    "throws",
    "it",
    "over",
    "fence",
    "while",
    "dog",
    "runs",
    "after",
]


def fixture_records(n: int = 9) -> list[dict]:
    """rowanz-format records of varied lengths (contexts of 3 to ~70 words: several row buckets)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        ctx = " ".join(rng.choice(WORDS, size=3 + (i * 37) % 70)).capitalize() + "."
        endings = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 14)))) + "." for _ in range(4)]
        out.append(
            {
                "ind": i,
                "activity_label": "Test",
                "ctx_a": ctx,
                "ctx_b": "",
                "ctx": ctx,
                "split": "val",
                "split_type": "indomain",
                "label": int(rng.integers(0, 4)),
                "endings": endings,
                "source_id": f"test~{i}",
            }
        )
    return out


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in fixture_records()))
    return path


def small_run(tmp_path: Path) -> Path:
    """A run with one checkpoint of a bytes A-to-A model: enough for evaluate.py's command line."""
    from jaxgpt.checkpoints import store as ckpt

    cfg = {"architecture": "a-to-a", "vocab_size": 257, "context_length": 64, "emb_dim": 8}
    run = write_run(tmp_path / "run", cfg, {"microbatch_size": 2, "train_steps": 1})
    folder = run / "checkpoints" / "20260101T000000Z-step-1"
    folder.mkdir(parents=True)
    ckpt.save_weights(build_model(ModelConfig(**cfg)), folder / ckpt.WEIGHTS)
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    return run


def gpt2_tok():
    try:
        return get_tokenizer("gpt2")
    except TokenizerError as e:
        pytest.skip(str(e))


def np_scorer(records: list[dict], encode, logits_of, context_length: int) -> dict:
    """The reference: per ending, context + " " + ending, losses of the ending's tokens only (a row
    over the context keeps its last context_length ids, hellaswag.py's documented rule)."""
    sums, means, labels = [], [], []
    for r in records:
        ctx = encode(r["ctx"])
        s, m = [], []
        for ending in r["endings"]:
            end = encode(" " + ending)
            ids = np.array(ctx + end)[-context_length:]
            n_end = min(len(end), len(ids) - 1)  # ending tokens that have a token before them
            logits = np.asarray(logits_of(ids), np.float64)  # (T, V)
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            nll = -logp[np.arange(len(ids) - 1), ids[1:]]  # nll[k]: predicting ids[k + 1]
            s.append(nll[-n_end:].sum())
            m.append(nll[-n_end:].mean())
        sums.append(s)
        means.append(m)
        labels.append(r["label"])
    sums, means, labels = np.array(sums), np.array(means), np.array(labels)
    return {
        "acc": float((sums.argmin(1) == labels).mean()),
        "acc_norm": float((means.argmin(1) == labels).mean()),
        "sum_losses": sums,
        "mean_losses": means,
    }


def assert_same(got: dict, want: dict) -> None:
    np.testing.assert_allclose(got["sum_losses"], want["sum_losses"], rtol=2e-5)
    np.testing.assert_allclose(got["mean_losses"], want["mean_losses"], rtol=2e-5)
    for key in ("sum_losses", "mean_losses"):  # no near-ties: the argmins below are not luck
        gaps = np.diff(np.sort(want[key], 1)[:, :2], axis=1)
        assert (gaps > 1e-3 * np.abs(want[key]).max()).all(), gaps
    assert got["acc"] == want["acc"] and got["acc_norm"] == want["acc_norm"]
    assert 0 < want["acc"] < 1 or 0 < want["acc_norm"] < 1  # the fixture is not trivially all right or wrong


# The modern recipe's options (model.json): the soft-cap in the head, rotary positions in each row.
MODERN = {
    "positions": "rotary",
    "norm": "rmsnorm",
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "logit_softcap": 4.0,
    "tie_embeddings": False,
    "qkv_bias": False,
    "bias": False,
}


@pytest.mark.parametrize(
    "tok_name,context,options",
    [
        pytest.param("gpt2", 128, {}, id="gpt2", marks=SLOW),
        pytest.param("bytes", 160, {}, id="bytes", marks=SLOW),
        pytest.param("bytes", 160, MODERN, id="bytes-modern"),
    ],
)
def test_random_gpt2_matches_the_numpy_scorer(jsonl: Path, tok_name: str, context: int, options: dict) -> None:
    tok = gpt2_tok() if tok_name == "gpt2" else BytesTokenizer()
    cfg = ModelConfig(
        **{
            "architecture": "gpt2",
            "vocab_size": tok.n_vocab,
            "context_length": context,
            "emb_dim": 32,
            "n_heads": 4,
            "n_layers": 2,
            "qkv_bias": True,
            "tie_embeddings": True,
            **options,
        }
    )
    model = build_model(cfg, seed=0)
    randomise(model, seed=5)  # peaky logits: a random init is near uniform, every ending alike
    examples = hellaswag.read_examples(jsonl)
    got = scoring.hellaswag_score(model, examples, tok, batch_examples=3, progress=False)
    # One row at a time, unpadded in effect: the row goes in at the full context (one compiled
    # shape instead of one per length) and only its own positions are read; the model is causal.
    forward = nnx.jit(lambda m, x: m(x))

    def logits_of(ids: np.ndarray) -> np.ndarray:
        padded = np.zeros((1, context), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(forward(model, jnp.asarray(padded)))[0, : len(ids)]

    want = np_scorer(fixture_records(), tok.encode, logits_of, context)
    assert got["examples"] == 9 and got["tokenizer"] == tok_name
    assert len(got["row_lengths"]) >= 2  # several padded lengths, each compiled once
    if tok_name == "bytes":
        assert got["truncated"] > 0  # rows over the 160-byte context: cut as the reference cuts them
    assert_same(got, want)


@SLOW  # an import and evaluate.py end to end
def test_imported_gpt2_through_evaluate_matches_the_numpy_scorer(
    tmp_path: Path, jsonl: Path, capsys: pytest.CaptureFixture
) -> None:
    from jaxgpt.interop.gpt2 import import_run

    tok = gpt2_tok()
    sd = hf_weights(3, V=50257, ctx=128, C=32, L=2, H=4, buffers=False)
    import_run(write_hf(tmp_path / "hf" / "model.safetensors", sd), tmp_path / "gpt2", n_heads=4)
    assert evaluate.main([str(tmp_path / "gpt2"), "--hellaswag-file", str(jsonl), "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    acc, acc_norm = map(float, re.search(r"hellaswag acc (\S+) \| acc_norm (\S+)", out).groups())
    assert "Scored 9 examples" in out and "gpt2 tokenizer" in out
    want = np_scorer(fixture_records(), tok.encode, lambda ids: hf_forward(sd, 4, ids[None])[0], 128)
    assert (acc, acc_norm) == (round(want["acc"], 4), round(want["acc_norm"], 4))
    # The same figures, per ending, from the library call on the imported weights.
    from jaxgpt.checkpoints.store import load_model

    model, *_ = load_model(tmp_path / "gpt2")
    assert_same(scoring.hellaswag_score(model, hellaswag.read_examples(jsonl), tok, progress=False), want)
    # --limit: the first N examples only.
    assert evaluate.main([str(tmp_path / "gpt2"), "--hellaswag-file", str(jsonl), "--limit", "4"]) == 0
    assert "Scored 4 examples" in capsys.readouterr().out


def test_malformed_lines_are_one_line_errors_naming_file_and_line(
    tmp_path: Path, jsonl: Path, capsys: pytest.CaptureFixture
) -> None:
    good = [json.dumps(r) for r in fixture_records(3)]
    bad = {
        "{not json": "malformed JSON",
        json.dumps({**fixture_records(1)[0], "label": 4}): "'label' must be",
        json.dumps({**fixture_records(1)[0], "endings": ["a", "b", "c"]}): "'endings' must be a list of 4",
        json.dumps({"endings": ["a", "b", "c", "d"], "label": 0}): "'ctx' must be a string",
        "[1, 2]": "JSON object",
    }
    for line, needle in bad.items():
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join([good[0], "", good[1], line, good[2]]) + "\n")  # a blank line 2 is skipped
        with pytest.raises(hellaswag.HellaSwagError, match=re.escape(f"{path}:4: ") + ".*" + re.escape(needle)):
            hellaswag.read_examples(path)
    assert len(hellaswag.read_examples(path, limit=2)) == 2  # the bad line 4 is never read
    run = small_run(tmp_path)
    for args, needle in (([str(path)], f"{path}:4: "), ([str(tmp_path / "none.jsonl")], "HellaSwag file not found")):
        assert evaluate.main([str(run), "--hellaswag-file", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err


def test_offline_without_a_file_is_one_line(tmp_path: Path, no_network: None, capsys: pytest.CaptureFixture) -> None:
    run = small_run(tmp_path)
    assert evaluate.main([str(run), "--hellaswag", "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot download {hellaswag.VAL_URL} (" in err
    assert str(tmp_path / "data" / "downloads" / "hellaswag_val.jsonl") in err and "--hellaswag-file" in err
    assert list((tmp_path / "data" / "downloads").iterdir()) == []  # nothing half-written left


def test_download_is_atomic_counted_and_checksummed(tmp_path: Path, jsonl: Path) -> None:
    downloads = tmp_path / "downloads"
    url = jsonl.as_uri()  # file:// through the same urllib path
    with pytest.raises(hellaswag.HellaSwagError, match="9 examples downloaded, expected 10"):
        hellaswag.fetch_val(downloads, log=lambda _m: None, url=url, n_val=10)
    assert list(downloads.iterdir()) == []  # refused: nothing renamed into place
    path = hellaswag.fetch_val(downloads, log=lambda _m: None, url=url, n_val=9)
    assert path.read_bytes() == jsonl.read_bytes()
    recorded = (downloads / "hellaswag_val.jsonl.sha256").read_text().split()[0]
    assert recorded == hashlib.sha256(jsonl.read_bytes()).hexdigest()
    closed = "http://127.0.0.1:9/x"  # a closed port
    assert hellaswag.fetch_val(downloads, url=closed) == path  # downloaded once: no network the second time
    path.write_bytes(path.read_bytes()[:-10])  # truncated afterwards
    with pytest.raises(hellaswag.HellaSwagError, match="sha256 differs from the one recorded"):
        hellaswag.fetch_val(downloads, url=closed)


def test_vocabulary_too_small_for_the_tokenizer_is_one_line(jsonl: Path) -> None:
    cfg = ModelConfig(architecture="a-to-a", vocab_size=100, context_length=256, emb_dim=8)
    with pytest.raises(hellaswag.HellaSwagError, match=r"out of range for the model's vocab_size=100"):
        scoring.hellaswag_score(build_model(cfg), hellaswag.read_examples(jsonl), BytesTokenizer(), progress=False)


def test_rows_llm_c_style() -> None:
    """render: the ending's ids carry its leading space and only they are masked in; buckets."""
    ex = hellaswag.Example("A man sits.", ("stands up.", "b", "c", "d"), 0)
    rows, masks, cut = hellaswag.render(ex, BytesTokenizer(), 64)
    assert bytes(rows[0].astype(np.uint8)) == b"A man sits. stands up." and not cut
    assert masks[0].tolist() == [0] * 11 + [1] * 11
    rows, masks, cut = hellaswag.render(ex, BytesTokenizer(), 8)
    assert bytes(rows[0].astype(np.uint8)) == b"A man sits. stands up."[-8:] and cut and masks[0].sum() == 8
    assert [hellaswag.bucket(n, 1024) for n in (1, 32, 33, 100, 1000, 1024)] == [32, 32, 64, 128, 1024, 1024]
    assert hellaswag.bucket(100, 96) == 96 and math.isclose(hellaswag.N_VAL, 10_042)


def test_training_with_hellaswag_checks_the_file_before_compiling(
    tmp_path: Path, data_root: Path, no_network: None, capsys: pytest.CaptureFixture
) -> None:
    import train
    from jaxgpt.config import ConfigError, TrainConfig

    model = {
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 16,
        "emb_dim": 16,
        "n_heads": 2,
        "n_layers": 1,
    }
    run = write_run(
        tmp_path / "run",
        model,
        {"microbatch_size": 2, "train_steps": 4, "checkpoint_interval": 2, "hellaswag_interval": 2},
    )
    downloads = tmp_path / "data"
    downloads.mkdir()
    for name in data_root.iterdir():  # the prepared builtin corpus, without its downloads folder
        (downloads / name.name).symlink_to(name)
    assert train.main([str(run), "--data-dir", str(downloads)]) == 2
    err = capsys.readouterr().err
    assert f"cannot download {hellaswag.VAL_URL} (" in err and "Traceback" not in err
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="hellaswag_interval=3 must be a multiple of validation_interval=2"):
        TrainConfig(microbatch_size=2, train_steps=4, checkpoint_interval=2, hellaswag_interval=3)
