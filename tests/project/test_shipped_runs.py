"""The shipped runs (runs/): every one loads as written; the named ones are what they claim to be
(GPT-2 small's shape and budget, nanoGPT's Shakespeare recipes prepared from the shared copy, the
2026 runs as their modern runs plus the 2026 keys, the tenth-budget run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, SHARED

import download_dataset as dd
from jaxgpt.config import load_run_configs, to_dict
from jaxgpt.data.sources import fineweb
from jaxgpt.training import run as run_setup

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
RUN_DIRS = sorted(p for p in (ROOT / "runs").glob("*/") if p.is_dir())


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=[p.name for p in RUN_DIRS])
def test_shipped_runs_load(run_dir: Path) -> None:
    if not any((run_dir / f).exists() for f in ("model.json", "train.json")):
        pytest.skip(f"{run_dir.name}: no config files (not a run)")
    model, train = load_run_configs(run_dir)
    # What was written is what was loaded (no key silently dropped or altered).
    for cfg, name in ((model, "model.json"), (train, "train.json")):
        raw = json.loads((run_dir / name).read_text())
        assert_written(raw, json.loads(json.dumps(to_dict(cfg))), name)
    assert train.total_steps(model, rows_per_epoch=train.sequences_per_step) >= 1  # rows: for train_epochs


def assert_written(raw: dict, resolved: dict, where: str) -> None:
    """Every key written has its value in the resolved config (nested configs: defaults filled in beside)."""
    for key, value in raw.items():
        if isinstance(value, dict) and key != "options" and isinstance(resolved[key], dict):
            assert_written(value, resolved[key], f"{where}: {key}")
        else:
            assert resolved[key] == value, (where, key)


def test_known_runs_are_shipped() -> None:
    names = {p.name for p in RUN_DIRS}
    assert {"a-to-a", "a-to-a-gpt2"} <= names


def test_shipped_gpt2_small() -> None:
    model, cfg = load_run_configs(ROOT / "runs" / "gpt2-small")
    assert (model.vocab_size, model.context_length, model.emb_dim, model.n_heads, model.n_layers) == (
        50304,
        1024,
        768,
        12,
        12,
    )
    assert model.tie_embeddings and cfg.tokenizer == "gpt2" and cfg.dataset.source == fineweb.SOURCE
    assert cfg.tokens_per_step(model) == 2**19  # ~0.5M tokens per optimiser step
    tokens = cfg.total_steps(model) * cfg.tokens_per_step(model)
    assert 9.9e9 < tokens <= 1e10  # ~10B tokens: 100 of the 103 train files


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no offline copy at {SHAKESPEARE}")
def test_shipped_shakespeare_prepares_from_the_shared_copy(tmp_path: Path) -> None:
    model, cfg = load_run_configs(ROOT / "runs" / "shakespeare")
    assert cfg.dataset.source == "tinyshakespeare" and cfg.tokenizer == "bytes" and model.vocab_size == 257
    # Small enough for ~10-15 minutes on 2 CPU cores at ~5-8k tokens/s.
    assert cfg.total_steps(model) * cfg.tokens_per_step(model) <= 8e3 * 15 * 60
    run_dir = tmp_path / "shakespeare"
    run_dir.mkdir()
    for name in ("model.json", "train.json"):
        shutil.copy(ROOT / "runs" / "shakespeare" / name, run_dir / name)
    data = tmp_path / "data"
    assert dd.main(["run", str(run_dir), "--from", str(SHAKESPEARE), "--data-dir", str(data)]) == 0
    run = run_setup.prepare_run(run_dir, data_root=data, restart=False)
    assert run.dataset.path == data / "tinyshakespeare-bytes"
    assert run.train_batches.n_windows == (run.dataset.train.n_tokens - 1) // 128 > 7000


def test_shipped_shakespeare_char_is_nanogpts_cpu_recipe(tmp_path: Path) -> None:
    """runs/shakespeare-char = nanoGPT README's CPU command: `train.py config/train_shakespeare_char.py
    --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
    --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`."""
    from jaxgpt.training import optimizer as optim

    model, cfg = load_run_configs(ROOT / "runs" / "shakespeare-char")
    assert (model.n_layers, model.n_heads, model.emb_dim, model.context_length) == (4, 4, 128, 64)
    assert (model.bias, model.qkv_bias, model.drop_rate, model.tie_embeddings) == (False, False, 0.0, True)
    assert (cfg.microbatch_size, cfg.gradient_accumulation_steps, cfg.seq_len(model)) == (12, 1, 64)
    assert cfg.total_steps(model) == 2000 and cfg.validation_batches == 20  # eval_iters
    assert (cfg.adam_b1, cfg.adam_b2, cfg.weight_decay, cfg.clipping_max_norm) == (0.9, 0.99, 0.1, 1.0)
    assert cfg.dataset.source == "tinyshakespeare" and cfg.dataset.options["split"] == "nanogpt"
    schedule = optim.make_schedule(cfg, 2000)
    # nanoGPT's get_lr: warm-up to 1e-3 over 100 iterations, cosine to min_lr 1e-4 at lr_decay_iters.
    assert float(schedule(100)) == pytest.approx(1e-3) and float(schedule(2000)) == pytest.approx(1e-4)
    assert float(schedule(1050)) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4), rel=1e-5)
    assert float(schedule(0)) == pytest.approx(1e-3 / 101, rel=0.02)  # lr * (it + 1) / (warmup + 1)
    if SHAKESPEARE.is_file():  # the whole set-up, as train.py runs it, on the shared copy
        run_dir = tmp_path / "shakespeare-char"
        run_dir.mkdir()
        for name in ("model.json", "train.json"):
            shutil.copy(ROOT / "runs" / "shakespeare-char" / name, run_dir / name)
        assert dd.main(["run", str(run_dir), "--from", str(SHAKESPEARE), "--data-dir", str(tmp_path / "data")]) == 0
        run = run_setup.prepare_run(run_dir, data_root=tmp_path / "data", restart=False)
        assert (run.dataset.train.n_tokens, run.dataset.val.n_tokens) == (1_003_854, 111_540)


@pytest.mark.parametrize("corpus", ["shakespeare-char", "builtin-gpt2"])
def test_shipped_2026_runs_are_their_modern_runs_plus_the_2026_keys(corpus: str) -> None:
    """runs/<corpus>-2026 trains what runs/<corpus>-modern trains (data, batch, steps, seed), with the
    options the ablation kept and only the schedule and rate changes docs/recipes.md gives and
    measures for it: so the two compare like with like."""

    def raw(run: str, name: str) -> dict:
        return json.loads((ROOT / "runs" / run / name).read_text())

    modern, new = f"{corpus}-modern", f"{corpus}-2026"
    added = {"value_embeds": True, "unet_skips": True, "window_pattern": "SSSL"}
    assert raw(new, "model.json") == {**raw(modern, "model.json"), **added}
    train_new, train_modern = raw(new, "train.json"), raw(modern, "train.json")
    assert train_new.pop("muon") == {**train_modern.pop("muon"), "coefficients": "polar_express", "normuon": True}
    retuned = {
        "shakespeare-char": {"cooldown_percent": 60},
        "builtin-gpt2": {"warmup_percent": 1, "learning_rate": 0.02},
    }[corpus]
    assert {k: train_new[k] for k in retuned} == retuned
    assert {k: v for k, v in train_new.items() if k not in retuned} == {
        k: v for k, v in train_modern.items() if k not in retuned
    }
    assert all(train_modern[k] != v for k, v in retuned.items())
    model, cfg = load_run_configs(ROOT / "runs" / new)
    assert model.layer_windows() == (model.context_length // 4,) * 3 + (model.context_length,)
    assert cfg.total_steps(model) == load_run_configs(ROOT / "runs" / modern)[1].total_steps(model)


def test_builtin_gpt2_2026_tenth_is_the_2026_run_budgeted_to_a_tenth_of_gpt2s_tokens() -> None:
    """runs/builtin-gpt2-2026-tenth is runs/builtin-gpt2-2026 with only the budget (a tenth of the
    tokens runs/builtin-gpt2 reads, its schedule ending there), 8-token windows, the two rates and
    Muon's momentum docs/recipes.md measures for it changed; data, batch, schedule shape and seed
    are the same."""

    def raw(run: str, name: str) -> dict:
        return json.loads((ROOT / "runs" / run / name).read_text())

    base, tenth = "builtin-gpt2-2026", "builtin-gpt2-2026-tenth"
    assert raw(tenth, "model.json") == {**raw(base, "model.json"), "short_window": 8}
    train_tenth, train_base = raw(tenth, "train.json"), raw(base, "train.json")
    assert train_tenth.pop("muon") == {
        **train_base.pop("muon"),
        "head_learning_rate": 0.006,
        "momentum": 0.7,
        "momentum_warmup_steps": 0,
    }
    changed = {"train_steps": 120, "learning_rate": 0.03, "checkpoint_interval": 60, "validation_interval": 40}
    assert {k: train_tenth[k] for k in changed} == changed
    assert {k: v for k, v in train_tenth.items() if k not in changed} == {
        k: v for k, v in train_base.items() if k not in changed
    }

    def tokens(run: str) -> int:
        model, cfg = load_run_configs(ROOT / "runs" / run)
        return cfg.total_steps(model) * cfg.tokens_per_step(model)

    assert tokens(tenth) * 10 == tokens("builtin-gpt2") == 1_228_800
    model, cfg = load_run_configs(ROOT / "runs" / tenth)
    assert model.layer_windows() == (8, 8, 8, model.context_length)
    assert cfg.total_steps(model) % cfg.validation_interval == 0  # the last step is validated
