"""Trained tokenizers (jaxgpt/preparation/bpe.py, tokenizer.py's TrainedTokenizer): trained on Tiny Shakespeare's
train split through download_dataset.py's main; vocabulary size, exact round trips, "<|endoftext|>" as
ordinary text, determinism, pickling, the compression figure against counts made here, errors; and end
to end: prepare, train, sample and evaluate (loss and HellaSwag) with a trained tokenizer."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from conftest import SHARED, SLOW, write_run
from tokenizers import Tokenizer as HFTokenizer

import data as data_command
import download_dataset as dd
from jaxgpt.data.sources import files as sources
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import EOT_TEXT, ROLE_TOKENS, TokenizerError, TrainedTokenizer, get_tokenizer, special_tokens
from jaxgpt.preparation.prepare import prepare_dataset

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
VOCAB = 600
TEXTS = [
    "Every effort moves you",
    "héllo wörld — 日本語 🙂\n\ttabs",
    "",
    " ",
    "\x00\x01\x7f\r\n \u200b e\u0301 ﷽",
    "a" * 300 + " 1234567890 3.14159",
    "<|endoftext|> is plain text here<|endoftext|>",
    "👩‍👩‍👧‍👦 𝔘𝔫𝔦",
]

pytestmark = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no Tiny Shakespeare at {SHAKESPEARE}")


def train_cli(data_root: Path, name: str = "shakes", *extra: str, vocab: int = VOCAB) -> int:
    return dd.main(
        [
            "tokenizer",
            name,
            "tinyshakespeare",
            "--from",
            str(SHAKESPEARE),
            "--vocab-size",
            str(vocab),
            "--data-dir",
            str(data_root),
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the tokenizer "shakes" (vocab 600), trained once for the module."""
    root = tmp_path_factory.mktemp("bpe-data")
    assert train_cli(root) == 0
    return root


@pytest.fixture
def tok(trained: Path) -> TrainedTokenizer:
    t = get_tokenizer("shakes", trained)
    assert isinstance(t, TrainedTokenizer)
    return t


def test_the_asked_vocabulary_then_end_of_text_and_the_role_tokens_last(tok: TrainedTokenizer, trained: Path) -> None:
    first = VOCAB - 1 - len(ROLE_TOKENS)  # end-of-text, then nanochat's four role tokens
    assert (tok.name, tok.n_vocab, tok.eot_id) == ("shakes", VOCAB, first)
    assert special_tokens(tok) == {EOT_TEXT: first, **{t: first + 1 + i for i, t in enumerate(ROLE_TOKENS)}}
    meta = json.loads((trained / "tokenizers" / "shakes" / "meta.json").read_text())
    assert (meta["n_vocab"], meta["eot_id"], meta["vocab_size"], meta["source"]) == (
        VOCAB,
        first,
        VOCAB,
        "tinyshakespeare",
    )
    assert meta["sha256"] == tok.sha256
    # Learned merges, not just the bytes: a common word is one token.
    assert len(tok.encode(" the")) == 1 and len(tok.encode("zqxj")) > 1


@pytest.mark.parametrize("text", TEXTS)
def test_round_trips_any_text_and_never_forges_end_of_text(tok: TrainedTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.eot_id not in ids
    assert tok.decode(ids) == text
    (batch,) = tok.encode_batch([text])
    assert batch.dtype == np.uint16 and batch.tolist() == ids


def test_token_bytes_count_each_ids_bytes_exactly(tok: TrainedTokenizer) -> None:
    lengths = tok.token_bytes()
    assert lengths.shape == (VOCAB,) and (lengths[tok.eot_id :] == 0).all()
    assert lengths[: tok.eot_id].min() >= 1
    for text in TEXTS:
        assert int(lengths[tok.encode(text)].sum()) == len(text.encode("utf-8"))


def test_eot_decodes_as_text_and_bad_ids_are_one_line(tok: TrainedTokenizer) -> None:
    ids = tok.encode("To be")
    assert tok.decode([*ids, tok.eot_id]) == "To be<|endoftext|>"
    for bad in (VOCAB, -1):
        with pytest.raises(TokenizerError, match=f"cannot decode id {bad} .*0..{VOCAB - 1}"):
            tok.decode([ids[0], bad])


def test_pickles_with_its_behaviour(tok: TrainedTokenizer) -> None:
    copy = pickle.loads(pickle.dumps(tok))
    text = TEXTS[-2]
    assert (copy.name, copy.n_vocab, copy.eot_id, copy.sha256) == (tok.name, tok.n_vocab, tok.eot_id, tok.sha256)
    assert copy.encode(text) == tok.encode(text) and tok.eot_id not in copy.encode(text)
    assert [a.tolist() for a in copy.encode_batch(TEXTS)] == [a.tolist() for a in tok.encode_batch(TEXTS)]


def test_encodes_the_same_in_a_worker_process(tok: TrainedTokenizer) -> None:
    """What a parallel preparation does with it: pickled to a fresh (spawned) process, encoding there."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        got = pool.submit(tok.encode_batch, TEXTS).result(timeout=120)
    assert [a.tolist() for a in got] == [tok.encode(t) for t in TEXTS]


def test_deterministic_and_reused(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert train_cli(tmp_path) == 0
    for name in ("tokenizer.json", "meta.json"):
        first, second = (root / "tokenizers" / "shakes" / name for root in (trained, tmp_path))
        assert second.read_bytes() == first.read_bytes()
    before = (tmp_path / "tokenizers/shakes/tokenizer.json").stat().st_mtime_ns
    capsys.readouterr()
    assert train_cli(tmp_path) == 0
    assert "reusing tokenizer" in capsys.readouterr().out
    assert (tmp_path / "tokenizers/shakes/tokenizer.json").stat().st_mtime_ns == before


def test_compression_matches_an_independent_count(trained: Path) -> None:
    folder = trained / "tokenizers" / "shakes"
    meta = json.loads((folder / "meta.json").read_text())
    # nanoGPT's cut: the validation split is the last 10% of the characters (never trained on).
    text = SHAKESPEARE.read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    train, val = text[:cut], text[cut:]
    assert sources.nanogpt_split(text, 0.1) == (train, val)
    assert meta["train_split"] == {"documents": 1, "bytes": len(train.encode("utf-8"))}
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    n_bytes, n_mine = len(val.encode("utf-8")), len(hf.encode(val, add_special_tokens=False).ids)
    n_gpt2 = len(tiktoken.get_encoding("gpt2").encode_ordinary(val))
    c = meta["compression"]
    assert (c["documents"], c["bytes"], c["tokenizer"]["tokens"], c["gpt2"]["tokens"]) == (1, n_bytes, n_mine, n_gpt2)
    assert c["tokenizer"]["bytes_per_token"] == n_bytes / n_mine and c["gpt2"]["bytes_per_token"] == n_bytes / n_gpt2
    assert 1.5 < n_bytes / n_mine < n_bytes / n_gpt2  # a 600-token vocabulary compresses less than GPT-2's 50257


def test_the_text_source_trains_on_its_train_documents_only(tmp_path: Path) -> None:
    """Held-out documents are those of the dataset's validation split: a word only they hold is never merged."""
    corpus = tmp_path / "corpus.jsonl"
    docs = [f"document {i} about apples and pears, " * 20 for i in range(40)]
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    _train, val, _how = sources.hold_out(lambda: iter(docs), 0.05)
    val = list(val)
    assert dd.main(["tokenizer", "fruit", "text", str(corpus), "--vocab-size", "300", "--data-dir", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "tokenizers/fruit/meta.json").read_text())
    assert meta["train_split"]["documents"] == 40 - len(val) and meta["compression"]["documents"] == len(val)
    assert meta["compression"]["bytes"] == sum(len(d.encode()) for d in val)


def test_input_errors_are_one_line(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = {
        ("--vocab-size", "260"): "--vocab-size must be a whole number in 261..1048576",
        ("--vocab-size", "4000000"): "got 4000000",
    }
    for (flag, value), message in cases.items():
        assert dd.main(["tokenizer", "x", "builtin", flag, value, "--data-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert dd.main(["tokenizer", "gpt2", "builtin", "--vocab-size", "300", "--data-dir", str(tmp_path)]) == 2
    assert "'gpt2' is built in" in capsys.readouterr().err
    assert dd.main(["tokenizer", "a/b", "builtin", "--vocab-size", "300", "--data-dir", str(tmp_path)]) == 2
    assert "got 'a/b'" in capsys.readouterr().err
    assert not (tmp_path / "tokenizers").exists()  # nothing written before the checks
    # Another vocabulary under the same name: refused before training, the old files untouched.
    old = (trained / "tokenizers/shakes/tokenizer.json").read_bytes()
    assert train_cli(trained, vocab=700) == 2
    err = capsys.readouterr().err
    assert "already holds a different tokenizer 'shakes' (its vocab_size is 600, now 700)" in err
    assert "--force" in err and err.count("\n") == 1
    assert (trained / "tokenizers/shakes/tokenizer.json").read_bytes() == old
    # A damaged file, and a missing tokenizer: the folder and the command that makes it.
    bad = tmp_path / "tokenizers" / "broken" / "tokenizer.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(TokenizerError, match=r"broken/tokenizer.json: not a tokenizers tokenizer.json \("):
        get_tokenizer("broken", tmp_path)
    with pytest.raises(
        TokenizerError,
        match=r"tokenizer 'nosuch' not found: .*tokenizers/nosuch has no "
        r"tokenizer.json; train it with `download_dataset.py tokenizer nosuch",
    ):
        get_tokenizer("nosuch", tmp_path)


def test_a_retrained_tokenizer_rebuilds_its_datasets(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert train_cli(tmp_path, vocab=300) == 0
    first = prepare_dataset("tinyshakespeare", "shakes", tmp_path, log=lambda _: None)
    ds = open_dataset(first)
    sha = get_tokenizer("shakes", tmp_path).sha256
    assert (ds.tokenizer, ds.vocab_size, ds.eot_id, ds.manifest["tokenizer_sha256"]) == (
        "shakes",
        300,
        300 - 1 - len(ROLE_TOKENS),
        sha,
    )
    want = get_tokenizer("shakes", tmp_path).encode(SHAKESPEARE.read_text()[:2000])
    assert ds.train.shards[0][: len(want)].tolist() == want
    assert train_cli(tmp_path, "shakes", "--force", vocab=320) == 0
    log: list[str] = []
    prepare_dataset("tinyshakespeare", "shakes", tmp_path, log=log.append)
    assert any("tokenizer_sha256 changed" in line for line in log), log
    assert open_dataset(first).vocab_size == 320
    # data.py --sample finds the tokenizer beside the dataset, in the same data root.
    capsys.readouterr()
    assert data_command.main([str(first), "--sample", "40"]) == 0
    tok = get_tokenizer("shakes", tmp_path)
    assert tok.decode(open_dataset(first).train.shards[0][:40]) in capsys.readouterr().out


# ----------------------------------------------------------------------------- end to end

MODEL = {"architecture": "gpt2", "vocab_size": VOCAB, "context_length": 32, "emb_dim": 32, "n_heads": 2, "n_layers": 1}
TRAIN = {
    "dataset": {"source": "tinyshakespeare"},
    "tokenizer": "shakes",
    "microbatch_size": 4,
    "train_steps": 4,
    "checkpoint_interval": 2,
    "validation_batches": 1,
}


def test_train_json_errors_before_any_compile(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import train

    run = write_run(tmp_path / "missing", MODEL, {**TRAIN, "tokenizer": "nosuch"})
    assert train.main([str(run), "--data-dir", str(trained)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer 'nosuch' not found" in err and "download_dataset.py tokenizer nosuch" in err
    assert err.count("\n") == 1
    run = write_run(tmp_path / "small", {**MODEL, "vocab_size": 512}, TRAIN)
    assert train.main([str(run), "--data-dir", str(trained)]) == 2
    assert "vocab_size=512 is smaller than the shakes tokenizer's 600 ids" in capsys.readouterr().err
    run = write_run(tmp_path / "bad", MODEL, {**TRAIN, "tokenizer": "no spaces"})
    assert train.main([str(run), "--data-dir", str(trained)]) == 2
    assert "tokenizer='no spaces' must be 'bytes', 'gpt2' or a trained tokenizer's name" in capsys.readouterr().err


@SLOW  # trains a tiny model, then samples and evaluates it: compiles several programs
def test_end_to_end_prepare_train_sample_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_hellaswag import fixture_records

    import evaluate
    import test_generation
    import train
    from jaxgpt.checkpoints import store

    data = tmp_path / "data"
    assert train_cli(data) == 0
    assert (
        dd.main(["tinyshakespeare", "--from", str(SHAKESPEARE), "--tokenizer", "shakes", "--data-dir", str(data)]) == 0
    )
    jsonl = data / "downloads" / "hellaswag_val.jsonl"  # HellaSwag during training reads it offline from here
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in fixture_records()))
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "hellaswag_interval": 4})
    assert train.main([str(run), "--data-dir", str(data)]) == 0
    latest = store.latest_checkpoint(run)
    (during,) = store.read_meta(latest)["hellaswag"]
    saved = latest / "tokenizer.json"
    assert saved.read_bytes() == (data / "tokenizers/shakes/tokenizer.json").read_bytes()
    assert store.verify_checkpoint(latest) is None  # the copy is among the files meta.json vouches for
    # Moved away from the data root, with the data root's tokenizer gone: the checkpoint's copy decodes.
    moved = tmp_path / "moved"
    shutil.copytree(latest, moved)
    shutil.rmtree(data / "tokenizers")
    capsys.readouterr()
    assert test_generation.main([str(moved), "--max-new-tokens", "12", "--prompt", "ROMEO:"]) == 0
    out = capsys.readouterr().out
    model, _cfg, tok, _path = store.load_model(moved)
    assert isinstance(tok, TrainedTokenizer) and tok.sha256 == get_tokenizer("shakes", file=saved).sha256
    assert "\nROMEO:" in out and "11 decode steps" in out  # 12 new tokens, decoded with the copy
    # evaluate.py on the prepared validation split: bits per byte from the tokens' exact byte counts.
    dataset = data / "tinyshakespeare-shakes"
    assert evaluate.main([str(moved), "--dataset", str(dataset), "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    loss = float(out.split("loss ")[-1].split()[0])
    bpb = float(out.split("bits per byte ")[-1].split()[0])
    val = open_dataset(dataset).val
    val_tokens = np.concatenate(val.shards)
    n_bytes = len(tok.decode(val_tokens[1:]).encode("utf-8"))  # every token but the first is a target
    assert bpb == pytest.approx(loss * (val_tokens.size - 1) / n_bytes / np.log(2), rel=1e-3)
    # HellaSwag on the local fixture file, scored with the trained tokenizer as during training.
    assert evaluate.main([str(moved), "--hellaswag-file", str(jsonl)]) == 0
    out = capsys.readouterr().out
    assert "shakes tokenizer" in out and "Scored 9 examples" in out
    assert (during["step"], during["tokenizer"], during["examples"]) == (4, "shakes", 9)
    assert f"hellaswag acc {during['acc']:.4f} | acc_norm {during['acc_norm']:.4f}" in out
    # Retrained under the run's name: resuming is refused in one line (the ids would mean other tokens).
    assert train_cli(data, vocab=590) == 0
    capsys.readouterr()
    assert train.main([str(run), "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"tokenizer 'shakes' differs from the one checkpoint {latest.name} was trained with" in err
    assert err.count("\n") == 1 and store.latest_checkpoint(run) == latest
    del model
