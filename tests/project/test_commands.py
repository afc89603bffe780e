"""The card's commands that show a run: model.py (its model), data.py (its dataset), checkpointing.py
(its checkpoints), on a real run trained here; each figure checked against the thing itself."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from conftest import write_run
from safetensors.numpy import load_file

import checkpointing
import data
import model
import train
from jaxgpt.checkpoints import layout
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.preparation.prepare import dataset_dir

MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 32, "emb_dim": 32, "n_heads": 2, "n_layers": 2}
TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "train_steps": 4,
    "checkpoint_interval": 2,
    "validation_batches": 1,
    "keep_last_checkpoints": 5,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("cmd") / "run", MODEL, TRAIN)
    assert train.main([str(run_dir), "--data-dir", str(data_root)]) == 0
    return run_dir


def test_model_lists_every_tensor_of_the_checkpoint_with_its_shape_and_count(run: Path, capsys) -> None:
    d = model.describe(run)
    weights = load_file(str(layout.latest_checkpoint(run) / layout.WEIGHTS))
    assert {t["name"]: tuple(t["shape"]) for t in d["tensors"]} == {k: v.shape for k, v in weights.items()}
    assert d["params"] == sum(v.size for v in weights.values())
    C, L, V, T = MODEL["emb_dim"], MODEL["n_layers"], MODEL["vocab_size"], MODEL["context_length"]
    assert d["flops_per_token"] == 6 * (V * C + 12 * L * C * C) + 12 * L * T * C  # 6N + 12LTC, N: matmul weights
    assert d["kv_cache_bytes_per_token"] == 2 * L * C * 4 and d["backend"] == "cpu"
    # AdamW decays the matrices only: every kernel and embedding, no bias or norm scale.
    parts = d["routing"]
    assert parts["decayed"]["params"] + parts["not decayed"]["params"] == d["params"]
    assert all(n.endswith(("kernel", "embedding")) for n in parts["decayed"]["names"])
    assert all(n.endswith(("bias", "scale")) for n in parts["not decayed"]["names"])
    assert model.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert f"{d['params']:,} parameters" in out and "blocks.*.attn.qkv.kernel" in out and "32x96" in out
    assert model.main([str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == d["params"]


def test_model_shows_the_muon_routing_of_a_muon_run(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "muon", {**MODEL, "tie_embeddings": False}, {**TRAIN, "optimizer": "muon"})
    d = model.describe(run_dir)
    assert set(d["routing"]) >= {"muon", "embed", "head"} and d["optimizer"] == "muon"
    assert sum(p["params"] for p in d["routing"].values()) == d["params"]
    assert d["peak_rates"]["muon"] > 0 and d["peak_rates"]["embed"] > 0


def test_model_counts_grouped_heads_and_windows_in_flops_and_the_kv_cache(tmp_path: Path) -> None:
    """Grouped-query attention: 2 C K D key/value weights a layer and K heads of cache; a window of w
    tokens: 12 w C attention FLOPs for that layer instead of 12 T C (nanochat's count)."""
    C, L, V, T, K, w = MODEL["emb_dim"], MODEL["n_layers"], MODEL["vocab_size"], MODEL["context_length"], 1, 8
    run_dir = write_run(
        tmp_path / "gqa",
        {**MODEL, "n_kv_heads": K, "window_pattern": "S", "short_window": w, "value_embeds": True},
        TRAIN,
    )
    d = model.describe(run_dir)
    D = C // MODEL["n_heads"]
    assert d["flops_per_token"] == 6 * (V * C + L * (10 * C * C + 2 * C * K * D)) + 12 * (w + T) * C  # layer 1: full
    assert d["kv_cache_bytes_per_token"] == 2 * L * K * D * 4
    assert any(t["name"] == "connections.value_tables" for t in d["tensors"])


def test_model_refuses_bad_input_in_one_line(tmp_path: Path, capsys) -> None:
    assert model.main([str(tmp_path / "missing")]) == 2
    write_run(tmp_path / "bad", {**MODEL, "n_heads": 3}, TRAIN)
    assert model.main([str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err) and "n_heads" in err[1]


def test_data_summarises_verifies_and_samples_a_run_dataset(run: Path, data_root: Path, capsys) -> None:
    ds = open_dataset(dataset_dir(data_root, "builtin", "bytes"))
    s = data.summary(ds)
    assert s["splits"]["train"]["tokens"] == ds.train.n_tokens and s["splits"]["val"]["tokens"] == ds.val.n_tokens
    assert s["tokenizer"] == "bytes" and s["vocab_size"] == 257
    assert data.main([str(run), "--data-dir", str(data_root), "--verify", "--sample", "40", "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert f"{ds.val.n_tokens:,} tokens" in out and "verified sha256" in out
    expected = bytes(t for t in ds.val.read(0, 40).tolist() if t < 256).decode("utf-8", "replace")
    assert expected.strip()[:20] in out
    assert data.main([str(dataset_dir(data_root, "builtin", "bytes")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"]["val"]["tokens"] == ds.val.n_tokens


def test_data_names_a_damaged_shard_and_a_wrong_path(tmp_path: Path, data_root: Path, capsys) -> None:
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir(data_root, "builtin", "bytes"), copy)
    shard = sorted(copy.glob("val-*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert data.main([str(copy)]) == 0  # the summary reads the manifest ...
    capsys.readouterr()
    assert data.main([str(copy), "--verify"]) == 2  # ... --verify hashes every shard
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and shard.name in err and "\n" not in err
    assert data.main([str(tmp_path / "nothing")]) == 2 and "neither a dataset folder" in capsys.readouterr().err


def test_checkpointing_lists_each_checkpoint_and_flags_a_damaged_one(run: Path, capsys) -> None:
    rows = checkpointing.inventory(run)
    metas = [layout.read_meta(c) for c in layout.list_checkpoints(run)]
    assert [r["step"] for r in rows] == [m["step"] for m in metas] == [2, 4]
    assert [r["val_loss"] for r in rows] == [m["val_loss"] for m in metas]
    assert [r["tokens"] for r in rows] == [m["tokens_seen"] for m in metas]
    assert [r["latest"] for r in rows] == [False, True] and sum(r["best"] for r in rows) == 1
    assert all(r["problem"] is None for r in rows) and all(math.isfinite(r["train_loss"]) for r in rows)
    assert checkpointing.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 2 and "(latest" in out
    weights = layout.list_checkpoints(run)[0] / layout.WEIGHTS
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    weights.write_bytes(bytes(raw))
    try:
        assert checkpointing.main([str(run)]) == 1  # damaged: named, and nothing changed on disk
        assert "DAMAGED" in capsys.readouterr().out and weights.exists()
        assert checkpointing.main([str(run), "--json"]) == 1
        rows = json.loads(capsys.readouterr().out)
        assert "sha256" in rows[0]["problem"] and rows[1]["problem"] is None
    finally:
        raw[len(raw) // 2] ^= 0xFF
        weights.write_bytes(bytes(raw))
    assert checkpointing.main([str(run.parent / "missing")]) == 2
    assert "run directory not found" in capsys.readouterr().err


def test_checkpointing_of_a_run_without_checkpoints(tmp_path: Path, capsys) -> None:
    run_dir = write_run(tmp_path / "new", MODEL, TRAIN)
    assert checkpointing.main([str(run_dir)]) == 0 and "no checkpoint yet" in capsys.readouterr().out
    assert sorted(os.listdir(run_dir)) == ["model.json", "train.json"]  # nothing made or changed
