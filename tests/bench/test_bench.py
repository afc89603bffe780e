"""The benchmarks (bench/) run end to end on a tiny configuration (figures only; timings are never asserted)."""

from __future__ import annotations

import ast
import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import SLOW, parse_python, write_run

from bench import cli, compare, decode, gemv, loader, tokenizing, torch_generate, torch_step, train_step
from jaxgpt.config import ModelConfig, load_run_configs

TINY_MODEL = {
    "architecture": "gpt2",
    "vocab_size": 257,
    "context_length": 32,
    "emb_dim": 16,
    "n_heads": 2,
    "n_layers": 1,
}
TINY_TRAIN = {"microbatch_size": 2, "gradient_accumulation_steps": 3, "train_steps": 1}


def test_bench_data_runs(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", TINY_MODEL, TINY_TRAIN)
    lines: list[str] = []
    figures = loader.bench_data(run, seconds=0.0, min_steps=2, synthetic_tokens=4096, matmul_size=32, log=lines.append)
    assert figures["tokens_per_step"] == 3 * 2 * 32 and figures["steps_timed"] == 2
    assert figures["data_tokens_per_s"] > 0 and figures["ratio"] > 0 and isinstance(figures["meets_target"], bool)
    assert "4 shard(s)" in figures["dataset"] and "ratio" in lines[0]
    json.dumps(figures)  # what --json writes
    given = loader.bench_data(
        run, seconds=0.0, min_steps=1, synthetic_tokens=4096, matmul_size=32, train_tokens_per_s=1.0, log=lines.append
    )
    assert given["train_tokens_per_s"] == 1.0 and given["train_tokens_per_s_source"] == "given"


def test_train_flops_per_token() -> None:
    gpt2 = ModelConfig(architecture="gpt2", vocab_size=50304, context_length=1024, emb_dim=768, n_heads=12, n_layers=12)
    # 6 x (85M block + 38.6M head matmul parameters) + attention: the usual ~0.85 GFLOP per token.
    assert train_step.train_flops_per_token(gpt2, 1024) == pytest.approx(
        6 * (12 * 12 * 768**2 + 50304 * 768) + 12 * 12 * 1024 * 768
    )


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["data", "--help"])
    assert info.value.code == 0 and "--json" in capsys.readouterr().out
    assert cli.main(["data", "--run", "/nonexistent-run"]) == 2


@SLOW  # a benchmark smoke test
def test_bench_tokenize_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides, fresh processes, on a ~1 MB corpus: what it prints and writes (figures positive, never timed)."""
    out = tmp_path / "tokenize.json"
    args = ["tokenize", "--megabytes", "1", "--rounds", "1", "--corpus-dir", str(tmp_path), "--json", str(out)]
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("writing the benchmark corpus") and lines[1].startswith("CPU: ")
    (line,) = [line for line in lines if line.startswith("round ")]
    assert "tiktoken encode_ordinary_batch" in line and "download_dataset.py text" in line and "ratio" in line
    assert lines[-1].startswith("medians of 1 round(s): tiktoken ") and lines[-1].endswith("(target >= 0.8)")
    figures = json.loads(out.read_text())
    run = figures["runs"][0]
    assert figures["tiktoken_mb_per_s"] > 0 and figures["prepare_mb_per_s"] > 0 and figures["ratio"] > 0
    assert run["tokens"] > 0 and run["prepare_cpu_s"] > 0 and run["threads"] == os.cpu_count()
    corpus = Path(figures["corpus"])
    docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    assert run["documents"] == len(docs) and abs(corpus.stat().st_size - 1e6) < 30_000
    assert 8000 <= sorted(len(d.encode()) for d in docs)[len(docs) // 2] < 12_000  # ~8 KB documents
    # Deterministic, and written once: a second request reuses the file.
    assert tokenizing.corpus_documents(0.05) == tokenizing.corpus_documents(0.05)
    stamp = corpus.stat().st_mtime_ns
    assert tokenizing.corpus_file(1, tmp_path, log=pytest.fail) == corpus and corpus.stat().st_mtime_ns == stamp
    assert cli.main(["tokenize", "--rounds", "0", "--corpus-dir", str(tmp_path)]) == 2


def test_bench_tokenize_runs_its_sides_without_the_bench_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    assert tokenizing._plain_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert "GLIBC_TUNABLES" not in tokenizing._plain_env()


@SLOW  # a benchmark run end to end
def test_bench_train_runs(tmp_path: Path) -> None:
    """The real train_step on a tiny run for 2 timed steps (and the extras): every figure present and sane."""
    model_cfg, train_cfg = load_run_configs(write_run(tmp_path / "run", TINY_MODEL, TINY_TRAIN))
    lines: list[str] = []
    r = train_step.bench_train(
        model_cfg,
        train_cfg,
        name="tiny",
        steps=1,
        warmup=0,
        windows=2,
        matmul_size=32,
        xla_memory=True,
        breakdown=True,
        log=lines.append,
    )
    assert r["tokens_per_step"] == 3 * 2 * 32 and r["accumulation_steps"] == 3
    assert len(r["window_tokens_per_s"]) == 2
    for key in (
        "first_step_s",
        "compile_s",
        "step_s_median",
        "tokens_per_s_median",
        "tokens_per_s_min",
        "tokens_per_s_max",
        "tokens_per_s_q25",
        "tokens_per_s_q75",
        "flops_per_token",
        "peak_fp32_flops",
        "peak_bf16_flops",
        "mfu_fp32",
        "mfu_bf16",
        "host_rss_peak_mib",
        "params",
    ):
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


def _top_level_imports(path: Path) -> set[str]:
    tree = parse_python(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_reference_configs_match_torch_step() -> None:
    """--config shapes are bench/torch_step.py's CONFIGS, read from the file; the torch side's scripts ship in
    bench/, import nothing of the project and torch only where they run (so this test needs no torch)."""
    assert compare.TORCH_STEP == Path(compare.__file__).with_name("torch_step.py") and compare.TORCH_STEP.is_file()
    tree = parse_python(compare.TORCH_STEP.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "CONFIGS"]
    configs = ast.literal_eval(node.value)
    assert configs == train_step.REFERENCE_CONFIGS and "nano-cpu" in configs
    for name in ("gpt2-vocab", "nano-cpu"):
        model, train = train_step.reference_configs(name)
        assert (
            model.vocab_size,
            model.context_length,
            model.n_layers,
            model.n_heads,
            model.emb_dim,
            train.microbatch_size,
        ) == configs[name]
        assert train.seq_len(model) == configs[name][1]
    assert model.tie_embeddings and model.qkv_bias and model.drop_rate == 0.0
    assert train.gradient_accumulation_steps == 1 and train.clipping_max_norm == 1.0
    assert train.learning_rate == torch_step.LEARNING_RATE and train.weight_decay == torch_step.WEIGHT_DECAY
    assert (train.adam_b1, train.adam_b2) == (0.9, 0.999) and train.clipping_max_norm == torch_step.MAX_NORM
    for name in configs:  # both sides count the same FLOPs per token
        vocab, context, layers, _, dims, _ = configs[name]
        model, _ = train_step.reference_configs(name)
        assert torch_step.flops_per_token(vocab, context, layers, dims) == train_step.train_flops_per_token(
            model, context
        )
    for script in (compare.TORCH_STEP, decode.TORCH_SCRIPT):
        assert _top_level_imports(script) <= {
            "__future__",
            "argparse",
            "json",
            "math",
            "statistics",
            "time",
            "collections",
            "pathlib",
            "typing",
        }, script


def _fake_runner(calls: list[tuple[str, str, str]]) -> compare.Runner:
    """Figures as the two sides write them: ours 100 + round tokens/s in float32 and 300 in bfloat16, torch 50 / 100."""

    def run(side: str, name: str, dtype: str, out: Path) -> dict:
        calls.append((side, name, dtype))
        rate = {
            ("ours", "float32"): 100.0,
            ("ours", "bfloat16"): 300.0,
            ("torch", "float32"): 50.0,
            ("torch", "bfloat16"): 100.0,
        }[side, dtype]
        rate += sum(1 for c in calls if c == (side, name, dtype)) - 1  # rounds differ: 100, 101, 102
        figures = {"tokens_per_s_median": rate, "tokens_per_s_min": rate - 1, "tokens_per_s_max": rate + 1}
        if side == "ours":
            return figures | {"first_step_s": 1.0, "mfu": 0.5, "compute_dtype": dtype, "host_rss_peak_mib": 10.0}
        return figures | {"torch": "2.x", "threads": 2, "autocast_bf16": dtype == "bfloat16"}

    return run


def test_compare_pairs_like_with_like() -> None:
    """Each ours run is followed by torch's of the same config and dtype; each column is a ratio of medians."""
    calls: list[tuple[str, str, str]] = []
    lines: list[str] = []
    r = compare.bench_compare(["cpu-small", "nano-cpu"], rounds=3, runner=_fake_runner(calls), log=lines.append)
    assert calls[:4] == [
        ("ours", "cpu-small", "float32"),
        ("torch", "cpu-small", "float32"),
        ("ours", "cpu-small", "bfloat16"),
        ("torch", "cpu-small", "bfloat16"),
    ]
    assert len(calls) == 2 * 3 * 2 * 2 and calls[-1] == ("torch", "nano-cpu", "bfloat16")
    assert [row["config"] for row in r["results"]] == ["cpu-small", "nano-cpu"]
    fp32, bf16 = r["results"][0]["float32"], r["results"][0]["bfloat16"]
    assert fp32["ratio"] == pytest.approx(101 / 51) and bf16["ratio"] == pytest.approx(301 / 101)
    assert (fp32["ours_min"], fp32["ours_max"], fp32["torch_max"]) == (99, 103, 53)
    assert bf16["torch_autocast_bf16"] and not fp32["torch_autocast_bf16"] and bf16["ours_compute_dtype"] == "bfloat16"
    assert len(fp32["load_avg"]) == 6 and r["rounds"] == 3 and r["dtypes"] == ["float32", "bfloat16"]
    assert set(r["cpu"]) >= {"model", "avx512f", "avx512_bf16", "amx_bf16"}
    report = lines[-1]
    assert report.startswith("CPU: ") and "fp32 ours" in report and "bf16 torch" in report and "1.98" in report
    assert "2.98" in report
    json.dumps(r)  # what --json writes
    one = compare.bench_compare(["cpu-small"], dtypes=["bfloat16"], runner=_fake_runner([]), log=lines.append)
    assert set(one["results"][0]) == {"config", "bfloat16"}
    with pytest.raises(train_step.BenchError, match="per column"):
        compare.bench_compare(["cpu-small"], model=["compute_dtype=float32"], runner=_fake_runner([]))


def test_compare_without_a_reference_interpreter_runs_our_side_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No --torch-python and no $JAXGPT_TORCH_PYTHON: one line says the torch side is skipped, ours runs, the
    ratios are None; a named interpreter that is missing is a one-line error with the set-up command."""
    calls: list[tuple[str, str, str]] = []
    made: dict = {}

    def fake_subprocess_runner(**kwargs: object) -> compare.Runner:
        made.update(kwargs)
        return _fake_runner(calls)

    monkeypatch.setattr(compare, "subprocess_runner", fake_subprocess_runner)
    lines: list[str] = []
    r = compare.bench_compare(["cpu-small"], rounds=2, torch_python=None, log=lines.append)
    assert [line for line in lines if "torch side skipped" in line] == [lines[0]]
    assert compare.TORCH_PYTHON_ENV in lines[0] and "--torch-python" in lines[0] and "torchref" in lines[0]
    assert calls == [("ours", "cpu-small", "float32"), ("ours", "cpu-small", "bfloat16")] * 2
    fp32 = r["results"][0]["float32"]
    assert fp32["ours_tokens_per_s"] == pytest.approx(100.5) and fp32["ratio"] is None and fp32["torch"] == []
    assert fp32["torch_tokens_per_s"] is None and len(fp32["load_avg"]) == 2 and r["torch"] is None
    assert made["torch_python"] is None and made["reference"] == compare.TORCH_STEP
    assert "(torch side not run)" in lines[-1] and " - " in lines[-1]
    json.dumps(r)
    with pytest.raises(train_step.BenchError, match="torchref"):
        compare.bench_compare(["cpu-small"], torch_python=Path("/nonexistent/python"), log=lines.append)


def _fake_interpreter(tmp_path: Path, figures: object) -> tuple[Path, Path]:
    """An executable standing in for the reference interpreter: it records its arguments and writes `figures`
    to the path after --json, as bench/torch_step.py and bench/torch_generate.py do."""
    argv_file = tmp_path / "argv.json"
    script = tmp_path / "fake-python"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"args = sys.argv[1:]\nopen({str(argv_file)!r}, 'w').write(json.dumps(args))\n"
        f"open(args[args.index('--json') + 1], 'w').write(json.dumps({figures!r}))\n"
    )
    script.chmod(0o755)
    return script, argv_file


def test_compare_runs_the_shipped_torch_step_in_the_reference_interpreter(tmp_path: Path) -> None:
    """The torch side's command is bench/torch_step.py under the interpreter given, with arguments its own
    parser reads as the pair's config, dtype, windows and steps; its first (only) config's figures come back."""
    row = {"config": "nano-cpu", "tokens_per_s_median": 7.0, "tokens_per_s_min": 6.0, "tokens_per_s_max": 8.0}
    python, argv_file = _fake_interpreter(tmp_path, [row])
    run = compare.subprocess_runner(torch_python=python, reference=compare.TORCH_STEP, steps=3, windows=2, model=[])
    assert run("torch", "nano-cpu", "bfloat16", tmp_path / "out.json") == row
    script, *args = json.loads(argv_file.read_text())
    assert script == str(compare.TORCH_STEP)
    parsed = torch_step.parser().parse_args(args)
    assert (parsed.config, parsed.bf16, parsed.windows, parsed.steps_per_window, parsed.all) == (
        "nano-cpu",
        True,
        2,
        3,
        False,
    )
    assert parsed.json == tmp_path / "out.json" and not parsed.compile and parsed.threads is None
    run("torch", "cpu-small", "float32", tmp_path / "out.json")
    assert not torch_step.parser().parse_args(json.loads(argv_file.read_text())[1:]).bf16


def test_compare_cli_wiring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--configs, --rounds, --dtypes and --model reach bench_compare; --json writes its figures."""
    seen: dict = {}

    def fake(configs: list[str], **kwargs: object) -> dict:
        seen.update(kwargs, configs=configs)
        return {"results": [], "configs": configs}

    monkeypatch.setattr(cli, "bench_compare", fake)
    out = tmp_path / "c.json"
    assert (
        cli.main(
            [
                "compare",
                "--configs",
                "nano-cpu,char-tiny",
                "--rounds",
                "3",
                "--dtypes",
                "bfloat16",
                "--model",
                "attention=xla",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert seen["configs"] == ["nano-cpu", "char-tiny"] and seen["rounds"] == 3 and seen["dtypes"] == ["bfloat16"]
    assert seen["model"] == ["attention=xla"] and json.loads(out.read_text())["configs"] == ["nano-cpu", "char-tiny"]
    monkeypatch.delenv(compare.TORCH_PYTHON_ENV, raising=False)
    assert cli.main(["compare"]) == 0 and seen["configs"] == sorted(train_step.REFERENCE_CONFIGS)
    assert seen["dtypes"] == ["float32", "bfloat16"] and seen["torch_python"] is None
    assert seen["reference"] == compare.TORCH_STEP
    monkeypatch.setenv(compare.TORCH_PYTHON_ENV, str(tmp_path / "venv" / "bin" / "python"))
    assert cli.main(["compare"]) == 0 and seen["torch_python"] == tmp_path / "venv" / "bin" / "python"
    assert cli.main(["compare", "--torch-python", "/elsewhere/python"]) == 0
    assert seen["torch_python"] == Path("/elsewhere/python")
    for bad in (["--dtypes", "float16"], ["--configs", "nano-cpu,nope"], ["--rounds", "0"]):
        assert cli.main(["compare", *bad]) == 2, bad


def test_train_and_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for sub in ("train", "compare"):
        with pytest.raises(SystemExit) as info:
            cli.main([sub, "--help"])
        assert info.value.code == 0 and "--json" in capsys.readouterr().out
    assert cli.main(["train", "/nonexistent-run"]) == 2
    assert cli.main(["train", "--config", "cpu-small", "--accum-sweep", "1,x"]) == 2
    assert cli.main(["compare", "--torch-python", str(tmp_path / "missing-python")]) == 2
    err = capsys.readouterr().err
    assert "missing-python not found" in err and "torchref" in err and compare.TORCH_PYTHON_ENV in err


@SLOW  # a benchmark run end to end
def test_generate_benchmark_times_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(
        tmp_path / "g",
        {"architecture": "gpt2", "vocab_size": 61, "context_length": 32, "emb_dim": 32, "n_heads": 4, "n_layers": 2},
        {"microbatch_size": 2, "train_steps": 1},
    )
    out = tmp_path / "gen.json"
    assert (
        cli.main(
            [
                "generate",
                "--single",
                str(run),
                "--new-tokens",
                "6",
                "--prompt-tokens",
                "3",
                "--repeats",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    assert figures["cached_tok_s"] > 0 and figures["full_tok_s"] > 0 and figures["speedup"] > 0
    assert "cached:" in capsys.readouterr().out
    assert cli.main(["generate", "--single", str(run), "--new-tokens", "40"]) == 2  # beyond context_length
    assert "context_length=32" in capsys.readouterr().err


# ----------------------------------------------------------------------------- generate: ours vs transformers


def _fake_decode_runner(calls: list[tuple[str, str, int]]) -> decode.Runner:
    """Figures as the sides write them: ms/token 10 (unrolled fp32), 11 (scanned), 20 (torch); bf16 half that;
    each later round 1 ms more; batch 8 twice batch 1."""

    def run(side: str, dtype: str, batch: int, out: Path) -> dict:
        calls.append((side, dtype, batch))
        ms = {"unrolled": 10.0, "scanned": 11.0, "torch": 20.0}[side] * (0.5 if dtype == "bfloat16" else 1.0)
        ms = ms * (2 if batch == 8 else 1) + calls.count((side, dtype, batch)) - 1
        return {
            "side": "torch" if side == "torch" else "ours",
            "ms_per_token_median": ms,
            "ms_per_token": [ms - 1, ms],
            "torch": "2.x",
            "transformers": "5.x",
            "threads": 2,
        }

    return run


def test_generate_compare_alternates_sides_and_reports_ratios_of_medians() -> None:
    calls: list[tuple[str, str, int]] = []
    lines: list[str] = []
    r = decode.bench_generate_compare(rounds=3, runner=_fake_decode_runner(calls), log=lines.append)
    assert calls[:4] == [
        ("unrolled", "float32", 1),
        ("scanned", "float32", 1),
        ("torch", "float32", 1),
        ("unrolled", "float32", 8),
    ]
    assert len(calls) == 3 * 2 * 2 * 3 and calls[-1] == ("torch", "bfloat16", 8)
    cells = {(c["dtype"], c["batch_size"]): c for c in r["cells"]}
    fp32, bf16 = cells[("float32", 1)], cells[("bfloat16", 1)]
    assert fp32["unrolled"]["ms_per_token"] == 11.0 and fp32["torch"]["ms_per_token"] == 21.0  # median of 10, 11, 12
    assert fp32["scanned_over_unrolled"] == pytest.approx(12 / 11) and fp32["unrolled_over_torch"] == pytest.approx(
        11 / 21
    )
    assert bf16["unrolled_bf16_over_fp32"] == pytest.approx(6 / 11) and bf16["torch_bf16_over_fp32"] == pytest.approx(
        11 / 21
    )
    assert fp32["unrolled"]["min"] == 9.0 and fp32["unrolled"]["max"] == 12.0 and len(fp32["torch"]["load_avg"]) == 3
    assert r["transformers"] == "5.x" and r["torch_threads"] == 2 and set(r["cpu"]) >= {"model", "avx512_bf16"}
    report = lines[-1]
    assert report.startswith("CPU: ") and "transformers 5.x" in report and "1.09" in report and "0.52" in report
    checks = {(t["target"], t["where"]): t for t in r["target_checks"]}
    assert len(checks) == 2 * 2 + 4 * (1 + 2)  # bf16/fp32 per batch and layout; per cell scan/unroll and ours/torch x 2
    assert checks[("ours/torch <= 1.0", "float32 batch 8 scanned")]["value"] == pytest.approx(23 / 41)
    assert checks[("scanned/unrolled <= 1.1", "float32 batch 1")] == {
        "target": "scanned/unrolled <= 1.1",
        "where": "float32 batch 1",
        "value": pytest.approx(12 / 11),
        "met": True,
    }
    assert "bf16/fp32 <= 0.7 batch 1 unrolled: 0.55 ok" in report
    json.dumps(r)  # what --json writes
    ours = decode.bench_generate_compare(
        dtypes=["bfloat16"],
        batch_sizes=[8],
        layouts=["scanned"],
        torch=False,
        runner=_fake_decode_runner([]),
        log=lines.append,
    )
    (cell,) = ours["cells"]
    assert set(cell) >= {"scanned"} and "torch" not in cell and cell["scanned_over_torch"] is None


def test_generate_cli_checks_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (
        ["--dtypes", "float16"],
        ["--batch-sizes", "0"],
        ["--layouts", "stacked"],
        ["--rounds", "0"],
        ["--model", "compute_dtype=bfloat16"],
        ["--model", "tie_embeddings=false"],  # GPT2LMHeadModel's is tied
        ["--torch-python", "/nonexistent/python"],
    ):
        assert cli.main(["generate", *bad]) == 2, bad
    err = capsys.readouterr().err
    assert "--dtypes 'float16'" in err and "per column" in err and "no torch twin" in err and "torchref" in err
    assert "/nonexistent/python not found" in err and compare.TORCH_PYTHON_ENV in err


TINY_GPT2 = [
    "--model=vocab_size=257",
    "--model=context_length=64",
    "--model=emb_dim=32",
    "--model=n_heads=2",
    "--model=n_layers=2",
]


def test_generate_runs_the_shipped_torch_generate_in_the_reference_interpreter(tmp_path: Path) -> None:
    """The torch side's command is bench/torch_generate.py under the interpreter given, with arguments its own
    parser reads as the cell's dtype, batch, lengths and the model's shape."""
    figures = {"side": "torch", "ms_per_token_median": 3.0, "ms_per_token": [3.0]}
    python, argv_file = _fake_interpreter(tmp_path, figures)
    cfg = ModelConfig(
        architecture="gpt2",
        vocab_size=257,
        context_length=64,
        emb_dim=32,
        n_heads=2,
        n_layers=2,
        qkv_bias=True,
        tie_embeddings=True,
    )
    run = decode.subprocess_runner(cfg, new_tokens=5, prompt_tokens=3, repeats=2, torch_python=python)
    assert run("torch", "bfloat16", 8, tmp_path / "out.json") == figures
    script, *args = json.loads(argv_file.read_text())
    assert script == str(decode.TORCH_SCRIPT) == str(Path(decode.__file__).with_name("torch_generate.py"))
    a = torch_generate.parser().parse_args(args)
    assert (a.dtype, a.batch_size, a.new_tokens, a.prompt_tokens, a.repeats) == ("bfloat16", 8, 5, 3, 2)
    assert (a.vocab_size, a.context_length, a.emb_dim, a.n_layers, a.n_heads) == (257, 64, 32, 2, 2)
    assert a.json == tmp_path / "out.json"


@SLOW  # benchmark processes end to end
def test_generate_compare_runs_both_sides_as_fresh_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real processes on a tiny GPT-2: ours (both layouts) and, where $JAXGPT_TORCH_PYTHON names a reference
    interpreter, transformers' generate on the same shape (bench/torch_generate.py); without one, the torch side
    is skipped with one line. Figures only, timings never asserted."""
    torch_python = compare.torch_python_from_env()
    with_torch = torch_python is not None and torch_python.exists()
    if not with_torch:
        monkeypatch.delenv(compare.TORCH_PYTHON_ENV, raising=False)
    out = tmp_path / "gen.json"
    args = [
        "generate",
        *TINY_GPT2,
        "--dtypes",
        "bfloat16",
        "--batch-sizes",
        "2",
        "--new-tokens",
        "5",
        "--prompt-tokens",
        "3",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    assert cli.main(args) == 0
    skipped = [line for line in capsys.readouterr().out.splitlines() if "torch side skipped" in line]
    assert len(skipped) == (0 if with_torch else 1), skipped
    r = json.loads(out.read_text())
    (cell,) = r["cells"]
    for side in ("unrolled", "scanned", *(["torch"] if with_torch else [])):
        (run,) = cell[side]["runs"]
        assert run["batch_size"] == 2 and run["new_tokens"] == 5 and cell[side]["ms_per_token"] > 0, side
    assert cell["unrolled"]["runs"][0]["compute_dtype"] == "bfloat16" and cell["scanned"]["runs"][0]["scan_layers"]
    assert r["model"]["emb_dim"] == 32 and r["cpu"]["model"] == compare.cpu_kernels.cpu_info()["model"]
    if with_torch:
        torch_run = cell["torch"]["runs"][0]
        assert (
            torch_run["dtype"] == "bfloat16"
            and torch_run["params"] == 257 * 32 + 64 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
        )
        assert cell["unrolled_over_torch"] > 0 and r["transformers"]
    else:
        assert "torch" not in cell and cell["unrolled_over_torch"] is None
        pytest.skip(f"ours ran; no reference interpreter (${compare.TORCH_PYTHON_ENV}) for the torch side")


@SLOW  # a benchmark run end to end
def test_gemv_forms_compute_the_same_product(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench gemv times every form of a decode step's matrix-vector product; each bfloat16 form
    computes the float32 product of the bfloat16 values (to float32 summation error)."""
    out = tmp_path / "gemv.json"
    assert cli.main(["gemv", "--shapes", "48x40,8x200", "--calls", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    forms = {row["form"] for row in figures["rows"]}
    assert len(forms) == 8 and gemv.NATIVE in forms  # XLA's seven and cpu_matvec's (it builds here)
    assert {tuple(row["shape"]) for row in figures["rows"]} == {(48, 40), (8, 200)}
    for row in figures["rows"]:
        assert row["us"] > 0 and row["gb_per_s"] > 0
        if "bfloat16" in row["form"]:
            assert row["max_err"] is not None and row["max_err"] < 1e-4, row
    assert "bfloat16 dot, 2 rows (YNNPACK)" in capsys.readouterr().out
    assert cli.main(["gemv", "--shapes", "768"]) == 2 and "768" in capsys.readouterr().err


@SLOW  # a benchmark run end to end: serve.py in a process of its own
def test_serve_benchmark_streams_every_level_and_stops_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "s", TINY_MODEL, TINY_TRAIN)
    out = tmp_path / "serve.json"
    assert (
        cli.main(
            [
                "serve",
                str(run),
                "--clients",
                "1,2",
                "--requests",
                "1",
                "--max-tokens",
                "4",
                "--max-batch",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )  # it raises if serve.py does not exit 0 on SIGTERM
    figures = json.loads(out.read_text())
    assert [(lv["clients"], lv["requests"]) for lv in figures["levels"]] == [(1, 1), (2, 2)]
    for lv in figures["levels"]:
        assert 0 <= lv["tokens"] <= 4 * lv["requests"] and lv["ttft_p99_ms"] >= lv["ttft_p50_ms"] > 0
    assert "TTFT p50" in capsys.readouterr().out
    assert cli.main(["serve", str(run), "--max-tokens", "40"]) == 2  # the prompts + 40 tokens exceed the context
    assert "context_length=32" in capsys.readouterr().err


def test_bench_engine_times_the_rl_sampling_shape_with_1_and_16_rows() -> None:
    from bench import engine

    lines: list[str] = []
    out = engine.bench_engine(None, rounds=1, least=0.0, log=lines.append)  # runs/tiny-rl's shape
    assert set(out["tokens_per_s"]) == {"1", "16"} and all(r[0] > 0 for r in out["tokens_per_s"].values())
    assert out["ratio"] == out["tokens_per_s"]["16"][0] / out["tokens_per_s"]["1"][0]
    assert out["met"] == (out["ratio"] >= engine.TARGET) and "16 samples of 8 tokens" in lines[1]
    assert lines[-1].startswith("16 rows over 1: ")


@SLOW  # serve.py in a process of its own
def test_serve_memory_benchmark_reads_the_servers_resident_memory_after_the_first_requests_and_after_all(
    tmp_path: Path,
) -> None:
    from bench import serve

    lines: list[str] = []
    cfg = load_run_configs(write_run(tmp_path / "run", TINY_MODEL, TINY_TRAIN))[0]
    out = serve.bench_memory(cfg, clients=4, first=6, total=20, max_tokens=2, max_batch=4, log=lines.append)
    assert out["rss_last_mib"] >= out["rss_first_mib"] > 50  # a Python process with JAX loaded
    assert out["ratio"] == out["rss_last_mib"] / out["rss_first_mib"] and out["met"] == (out["ratio"] <= 1.3)
    assert "after the first 8 requests" in lines[0] and "after 20:" in lines[0]
