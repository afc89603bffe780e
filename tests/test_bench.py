"""The benchmarks (bench/) run end to end on a tiny configuration (figures only; timings are never asserted)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from bench import cli, compare, loader, train_step
from config import ModelConfig, load_run_configs
from conftest import write_run

TINY_MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 32, "emb_dim": 16, "n_heads": 2,
              "n_layers": 1}
TINY_TRAIN = {"microbatch_size": 2, "gradient_accumulation_steps": 3, "train_steps": 1}


def test_bench_data_runs(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", TINY_MODEL, TINY_TRAIN)
    lines: list[str] = []
    figures = loader.bench_data(run, seconds=0.0, min_steps=2, synthetic_tokens=4096, matmul_size=32,
                               log=lines.append)
    assert figures["tokens_per_step"] == 3 * 2 * 32 and figures["steps_timed"] == 2
    assert figures["data_tokens_per_s"] > 0 and figures["ratio"] > 0 and isinstance(figures["meets_target"], bool)
    assert "4 shard(s)" in figures["dataset"] and "ratio" in lines[0]
    json.dumps(figures)  # what --json writes
    given = loader.bench_data(run, seconds=0.0, min_steps=1, synthetic_tokens=4096, matmul_size=32,
                             train_tokens_per_s=1.0, log=lines.append)
    assert given["train_tokens_per_s"] == 1.0 and given["train_tokens_per_s_source"] == "given"


def test_train_flops_per_token() -> None:
    gpt2 = ModelConfig(architecture="gpt2", vocab_size=50304, context_length=1024, emb_dim=768, n_heads=12,
                       n_layers=12)
    # 6 x (85M block + 38.6M head matmul parameters) + attention: the usual ~0.85 GFLOP per token.
    assert train_step.train_flops_per_token(gpt2, 1024) == pytest.approx(6 * (12 * 12 * 768**2 + 50304 * 768)
                                                                    + 12 * 12 * 1024 * 768)


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["data", "--help"])
    assert info.value.code == 0 and "--json" in capsys.readouterr().out
    assert cli.main(["data", "--run", "/nonexistent-run"]) == 2


def test_bench_train_runs(tmp_path: Path) -> None:
    """The real train_step on a tiny run for 2 timed steps (and the extras): every figure present and sane."""
    model_cfg, train_cfg = load_run_configs(write_run(tmp_path / "run", TINY_MODEL, TINY_TRAIN))
    lines: list[str] = []
    r = train_step.bench_train(model_cfg, train_cfg, name="tiny", steps=1, warmup=0, windows=2, matmul_size=32,
                          xla_memory=True, breakdown=True, log=lines.append)
    assert r["tokens_per_step"] == 3 * 2 * 32 and r["accumulation_steps"] == 3
    assert len(r["window_tokens_per_s"]) == 2
    for key in ("first_step_s", "compile_s", "step_s_median", "tokens_per_s_median", "tokens_per_s_min",
                "tokens_per_s_max", "tokens_per_s_q25", "tokens_per_s_q75", "flops_per_token", "peak_fp32_flops",
                "peak_bf16_flops", "mfu_fp32", "mfu_bf16", "host_rss_peak_mib", "params"):
        assert r[key] >= 0 and math.isfinite(r[key]), key
    assert r["tokens_per_s_min"] <= r["tokens_per_s_median"] <= r["tokens_per_s_max"]
    assert r["first_step_s"] > 0 and r["tokens_per_s_median"] > 0 and r["mfu_fp32"] > 0
    assert r["host_rss_peak_mib"] >= r["host_rss_peak_before_model_mib"] > 0
    assert r["flops_per_token"] == train_step.train_flops_per_token(model_cfg, 32)
    assert abs(r["loss_last"] - math.log(257)) < 1.0  # random tokens: about ln V
    assert r["xla_memory"]["argument_size_in_bytes"] > 0
    assert all(v > 0 for v in r["breakdown"].values())
    assert r["device_memory"] is None or r["device_memory"]["peak_bytes_in_use"] > 0
    assert "tokens/s" in lines[0] and "MFU" in lines[0]
    json.dumps(r)  # what --json writes


def test_reference_configs_match_torch_reference() -> None:
    """--config shapes are torch_reference.py's CONFIGS, read from the file (torch is not imported)."""
    if not compare.TORCH_REFERENCE.exists():
        pytest.skip(f"{compare.TORCH_REFERENCE} not here")
    tree = ast.parse(compare.TORCH_REFERENCE.read_text())
    configs = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CONFIGS" for t in node.targets))
    assert configs == train_step.REFERENCE_CONFIGS
    model, train = train_step.reference_configs("gpt2-vocab")
    assert (model.vocab_size, model.context_length, model.n_layers, model.n_heads, model.emb_dim,
            train.microbatch_size) == configs["gpt2-vocab"]
    assert model.tie_embeddings and model.qkv_bias and model.drop_rate == 0.0
    assert train.gradient_accumulation_steps == 1 and train.clipping_max_norm == 1.0


def test_train_and_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for sub in ("train", "compare"):
        with pytest.raises(SystemExit) as info:
            cli.main([sub, "--help"])
        assert info.value.code == 0 and "--json" in capsys.readouterr().out
    assert cli.main(["train", "/nonexistent-run"]) == 2
    assert cli.main(["train", "--config", "cpu-small", "--accum-sweep", "1,x"]) == 2
    assert cli.main(["compare", "--torch-python", str(tmp_path / "missing-python")]) == 2
    assert "torchref" in capsys.readouterr().err


def test_generate_benchmark_times_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "g", {"architecture": "gpt2", "vocab_size": 61, "context_length": 32, "emb_dim": 32,
                                     "n_heads": 4, "n_layers": 2}, {"microbatch_size": 2, "train_steps": 1})
    out = tmp_path / "gen.json"
    assert cli.main(["generate", str(run), "--new-tokens", "6", "--prompt-tokens", "3", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["cached_tok_s"] > 0 and figures["full_tok_s"] > 0 and figures["speedup"] > 0
    assert "cached:" in capsys.readouterr().out
    assert cli.main(["generate", str(run), "--new-tokens", "40"]) == 2  # beyond context_length
    assert "context_length=32" in capsys.readouterr().err
