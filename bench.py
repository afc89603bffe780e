"""Benchmarks, one subcommand each.

    uv run bench.py data                                  # runs/gpt2-small's batches, synthetic shards
    uv run bench.py data --run runs/shakespeare --seconds 10 --json data.json
    uv run bench.py data --dataset data/fineweb10B-gpt2-gpt2   # real shards (page cache as it is)
    uv run bench.py train --config cpu-small              # torch_reference.py's shapes (char-tiny, gpt2-vocab too)
    uv run bench.py train runs/shakespeare --steps 10 --warmup 4 --windows 5 --breakdown --json train.json
    uv run bench.py train --config cpu-small --accum-sweep 1,4,16,64   # peak memory per k, fresh process each
    uv run bench.py compare --rounds 2 --json compare.json    # ours vs $HOME/torchref's torch, per config
    uv run bench.py generate --batch-size 4                   # KV-cache sampling vs full forward (GPT-2 124M shape)
    python3 bench.py gpu --out gpu-check                      # on an accelerator machine (bench_gpu.py); --cpu-smoke

data: how fast the loader assembles a run's optimiser-step batches (k x B x T inputs and targets,
drawn by BatchSampler from memory-mapped shards) and hands them to the device with
`jax.device_put`, the two things train.py does per step. It compares that with an upper bound of
the run's training throughput on this machine (measured matmul FLOP/s over the model's training
FLOPs per token, 6N + 12LTC) or with --train-tokens-per-s; the target is a ratio of at least 50,
so the data never limits training. Without --dataset it writes random shards of the run's
vocabulary to a temporary folder (small shards, so windows cross shard boundaries).

train: the harness's own optimiser step (optim.make_optimizer + step.StepRunner, built and fed as
trainer.py does) on random tokens of a run's shapes or of a torch_reference.py config: time to the
first result (compile), steady-state tokens/s (median, min/max, IQR over timed windows, each ending
with a block on the result), model FLOPs per token (6 x (12 L C^2 + V C) + 12 L T C) and MFU
against fp32 and bf16 matmul peaks measured in the same process, peak host RSS and device memory.
--accum-sweep runs one fresh process per k. compare: `train` and ../shared/bench/torch_reference.py
(in its own venv, $HOME/torchref) alternately per config; the ratio is ours / torch.

gpu: the one-shot accelerator check (bench_gpu.py): GPT-2 124M train steps (cuDNN vs XLA attention,
scan_layers on/off, k = 1 and 4) with MFU against the chip's peak, a short training run resumed
bit for bit, and cached generation, each in a fresh process, within a time budget; written as
JSON and a markdown table. It needs only the machine's own python3 and its installed packages.

A subcommand is a function `bench_<name>(...) -> dict` and a parser hook `_add_<name>_args`,
registered in SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fast_malloc
from bench_train import (
    REFERENCE_CONFIGS,
    BenchError,
    accum_sweep,
    bench_train,
    matmul_flops,
    reference_configs,
    train_flops_per_token,
)
from config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from data import BatchSampler, DataError, open_dataset, write_dataset
from tokenizer import GPT2_EOT_ID, GPT2_N_VOCAB

TARGET_RATIO = 50  # data throughput / training throughput


@dataclass(frozen=True)
class _Vocab:  # what write_dataset needs of a tokenizer, without loading tiktoken's files
    name: str
    n_vocab: int
    eot_id: int


_VOCABS = {"bytes": _Vocab("bytes", 257, 256), "gpt2": _Vocab("gpt2", GPT2_N_VOCAB, GPT2_EOT_ID)}


def _synthetic_dataset(folder: Path, tokenizer: str, n_tokens: int) -> Path:
    vocab = _VOCABS[tokenizer]
    tokens = np.random.default_rng(0).integers(0, vocab.n_vocab, n_tokens, dtype=np.int64)
    path = folder / f"synthetic-{tokenizer}"
    write_dataset(path, source="synthetic", options={}, fingerprint="bench", tokenizer=vocab,
                  splits={"train": [tokens], "val": [tokens[:1024]]}, shard_tokens=max(1, n_tokens // 4))
    return path


def _time_steps(sampler: BatchSampler, k: int, seconds: float, min_steps: int) -> tuple[list[float], list[float]]:
    """Seconds per optimiser step spent assembling the batch and putting it on the device."""
    import jax

    assemble, put = [], []
    sampler.batch(0, k)  # builds the epoch's permutation, once per epoch in training too
    started = time.perf_counter()
    step = 0
    while step < min_steps or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        x, y = sampler.batch(step, k)
        t1 = time.perf_counter()
        jax.block_until_ready((jax.device_put(x), jax.device_put(y)))
        t2 = time.perf_counter()
        assemble.append(t1 - t0)
        put.append(t2 - t1)
        step += 1
    return assemble, put


def bench_data(run_dir: Path, *, dataset: Path | None = None, seconds: float = 5.0, min_steps: int = 3,
               synthetic_tokens: int = 2**24, train_tokens_per_s: float | None = None, matmul_size: int = 2048,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Figures for `uv run bench.py data` (tokens/s counts input tokens, k x B x T per step)."""
    import jax

    model_cfg, train_cfg = load_run_configs(run_dir)
    B, T, k = train_cfg.microbatch_size, train_cfg.seq_len(model_cfg), train_cfg.gradient_accumulation_steps
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        path = dataset if dataset is not None else _synthetic_dataset(Path(tmp), train_cfg.tokenizer, synthetic_tokens)
        ds = open_dataset(path)
        sampler = BatchSampler(ds.train, microbatch_size=B, seq_len=T, seed=0, targets=train_cfg.targets)
        assemble, put = _time_steps(sampler, k, seconds, min_steps)
        desc = f"{path}" if dataset is not None else f"synthetic, {ds.train.n_tokens:,} tokens"
        desc += f" in {len(ds.train.shards)} shard(s)"
    step_tokens = k * B * T
    data_rate = step_tokens * len(assemble) / (sum(assemble) + sum(put))
    flops = matmul_flops(matmul_size)
    per_token = train_flops_per_token(model_cfg, T)
    train_rate = train_tokens_per_s if train_tokens_per_s is not None else flops / per_token
    result = {
        "run": str(run_dir), "device": str(jax.devices()[0]), "dataset": desc,
        "microbatch_size": B, "seq_len": T, "accumulation_steps": k, "tokens_per_step": step_tokens,
        "steps_timed": len(assemble),
        "assemble_ms_per_step_median": 1e3 * float(np.median(assemble)),
        "device_put_ms_per_step_median": 1e3 * float(np.median(put)),
        "assemble_tokens_per_s": step_tokens * len(assemble) / sum(assemble),
        "device_put_tokens_per_s": step_tokens * len(put) / sum(put),
        "data_tokens_per_s": data_rate,
        "matmul_gflops": flops / 1e9,
        "train_flops_per_token": per_token,
        "train_tokens_per_s": train_rate,
        "train_tokens_per_s_source": ("given" if train_tokens_per_s is not None
                                      else "upper bound: matmul FLOP/s / FLOPs"),
        "ratio": data_rate / train_rate,
        "target_ratio": TARGET_RATIO,
    }
    result["meets_target"] = result["ratio"] >= TARGET_RATIO
    log(_report(result))
    return result


def _report(r: dict[str, Any]) -> str:
    return "\n".join([
        f"data loader for {r['run']} on {r['device']}: k={r['accumulation_steps']} x B={r['microbatch_size']} "
        f"x T={r['seq_len']} = {r['tokens_per_step']:,} tokens/step, {r['dataset']}, {r['steps_timed']} steps",
        f"  assemble batch  {r['assemble_ms_per_step_median']:9.2f} ms/step  "
        f"{r['assemble_tokens_per_s']:15,.0f} tokens/s",
        f"  device_put      {r['device_put_ms_per_step_median']:9.2f} ms/step  "
        f"{r['device_put_tokens_per_s']:15,.0f} tokens/s",
        f"  together                          {r['data_tokens_per_s']:15,.0f} tokens/s",
        f"  training        {r['train_tokens_per_s']:,.0f} tokens/s ({r['train_tokens_per_s_source']}; "
        f"{r['matmul_gflops']:.0f} GFLOP/s, {r['train_flops_per_token'] / 1e6:,.0f} MFLOP/token)",
        f"  ratio {r['ratio']:,.0f}x (target >= {r['target_ratio']}x): {'OK' if r['meets_target'] else 'TOO SLOW'}",
    ])


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=Path, default=Path("runs/gpt2-small"),
                        help="run directory (default: %(default)s)")
    parser.add_argument("--dataset", type=Path, default=None,
                        help="a prepared dataset folder instead of synthetic shards")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to time (default: %(default)s)")
    parser.add_argument("--train-tokens-per-s", type=float, default=None,
                        help="measured training throughput to compare with (default: FLOP-based upper bound)")


def _run_data(args: argparse.Namespace) -> dict[str, Any]:
    return bench_data(args.run, dataset=args.dataset, seconds=args.seconds, train_tokens_per_s=args.train_tokens_per_s)


# ----------------------------------------------------------------------------- train

# The shapes of ../shared/bench/torch_reference.py's CONFIGS (tests/test_bench.py checks they agree):
# name -> (vocab, context, layers, heads, dims, batch).
TORCH_REFERENCE = Path(__file__).resolve().parent.parent / "shared" / "bench" / "torch_reference.py"
TORCH_PYTHON = Path.home() / "torchref" / "bin" / "python"
def _source_args(args: argparse.Namespace) -> list[str]:
    source = [str(args.run)] if args.run is not None else ["--config", args.config or "cpu-small"]
    return source + [f"--model={item}" for item in args.model] + [f"--train={item}" for item in args.train]


def _load_source(args: argparse.Namespace) -> tuple[str, ModelConfig, TrainConfig]:
    if args.run is not None:
        if args.config is not None:
            raise BenchError("give a run directory or --config, not both")
        name, (model_cfg, train_cfg) = str(args.run), load_run_configs(args.run)
    else:
        name = args.config or "cpu-small"
        model_cfg, train_cfg = reference_configs(name)
    if args.model:
        model_cfg = with_overrides(model_cfg, args.model, "--model")
        name += " " + " ".join(args.model)
    if args.train:
        train_cfg = with_overrides(train_cfg, args.train, "--train")
        name += " " + " ".join(args.train)
    return name, model_cfg, train_cfg


def with_overrides(cfg: Any, items: list[str], where: str) -> Any:
    """`KEY=VALUE` pairs (VALUE as JSON; a bare word is a string) over a config, validated exactly
    as model.json / train.json are."""
    raw = to_dict(cfg)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BenchError(f"{where} {item!r}: expected KEY=VALUE, e.g. compute_dtype=bfloat16")
        try:
            raw[key] = json.loads(value)
        except json.JSONDecodeError:
            raw[key] = value
    return from_dict(type(cfg), raw, where)


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, nargs="?", default=None,
                        help="run directory (its model.json and train.json shapes); or use --config")
    parser.add_argument("--config", choices=sorted(REFERENCE_CONFIGS), default=None,
                        help="a torch_reference.py shape instead of a run (default without a run: cpu-small)")
    parser.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model.json key, e.g. --model compute_dtype=bfloat16 (repeatable)")
    parser.add_argument("--train", action="append", default=[], metavar="KEY=VALUE",
                        help="override a train.json key, e.g. --train microbatch_size=1 (repeatable)")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps per timed window (default: 10)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps after the compiling first one (default: 4, so 5 untimed as the reference)")
    parser.add_argument("--windows", type=int, default=None, help="timed windows (default: 5)")
    parser.add_argument("--accum", type=int, default=None,
                        help="override gradient_accumulation_steps (--config: default 1)")
    parser.add_argument("--accum-sweep", type=str, default=None, metavar="K,K,...",
                        help="peak RSS, XLA temp memory and compile time per k, each k in a fresh process "
                             "(default there: 2 windows x 1 step after 2 untimed)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time one microbatch's forward, forward+backward and optimiser update")
    parser.add_argument("--xla-memory", action="store_true",
                        help="also compile once more through .lower().compile() for XLA's memory analysis")
    parser.add_argument("--no-matmul", action="store_true", help="skip the peak matmul measurement (no MFU)")


def _run_train(args: argparse.Namespace) -> dict[str, Any]:
    name, model_cfg, train_cfg = _load_source(args)
    if args.accum_sweep is not None:
        try:
            ks = [int(v) for v in args.accum_sweep.split(",") if v.strip()]
        except ValueError:
            raise BenchError(f"--accum-sweep {args.accum_sweep!r}: expected integers like 1,4,16,64") from None
        if not ks or min(ks) < 1:
            raise BenchError(f"--accum-sweep {args.accum_sweep!r}: expected positive integers like 1,4,16,64")
        return accum_sweep(_source_args(args), ks, steps=args.steps or 1,
                           warmup=args.warmup if args.warmup is not None else 1, windows=args.windows or 2)
    return bench_train(model_cfg, train_cfg, name=name, steps=args.steps or 10,
                       warmup=args.warmup if args.warmup is not None else 4, windows=args.windows or 5,
                       accumulation=args.accum, matmul_size=None if args.no_matmul else 2048,
                       xla_memory=args.xla_memory, breakdown=args.breakdown)


# ----------------------------------------------------------------------------- compare


def bench_compare(configs: list[str], *, torch_python: Path = TORCH_PYTHON, reference: Path = TORCH_REFERENCE,
                  steps: int = 10, windows: int = 5, rounds: int = 1, model: list[str] | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Ours (with `model` KEY=VALUE overrides, as `train --model`) vs the torch reference per config, alternating fresh processes (ours, torch) `rounds`
    times so that a change in the machine's load hits both; the ratio is of the medians."""
    import os
    import subprocess

    if not Path(torch_python).exists():
        raise BenchError(f"{torch_python} not found: set up the reference once with `python3 -m venv "
                         f"$HOME/torchref && $HOME/torchref/bin/pip install torch==2.13.0 numpy` "
                         f"(or pass --torch-python)")
    if not Path(reference).exists():
        raise BenchError(f"{reference} not found (pass --reference)")
    here = Path(__file__).resolve()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        for name in configs:
            ours_runs, torch_runs = [], []
            for rnd in range(rounds):
                load = os.getloadavg()
                out = Path(tmp) / f"ours-{name}-{rnd}.json"
                cmd = [sys.executable, str(here), "train", "--config", name, "--steps", str(steps),
                       "--windows", str(windows), "--json", str(out), *[f"--model={m}" for m in model or []]]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=here.parent)
                if done.returncode != 0:
                    raise BenchError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
                ours = json.loads(out.read_text())
                ours["load_avg_at_start"] = list(load)
                ours_runs.append(ours)
                load = os.getloadavg()
                out = Path(tmp) / f"torch-{name}-{rnd}.json"
                cmd = [str(torch_python), str(reference), "--config", name, "--windows", str(windows),
                       "--steps-per-window", str(steps), "--json", str(out)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise BenchError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
                theirs = json.loads(out.read_text())[0]
                theirs["load_avg_at_start"] = list(load)
                torch_runs.append(theirs)
                log(f"{name} round {rnd + 1}/{rounds}: ours {ours['tokens_per_s_median']:,.0f} tokens/s "
                    f"(load {ours['load_avg_at_start'][0]:.2f}), torch {theirs['tokens_per_s_median']:,.0f} "
                    f"(load {theirs['load_avg_at_start'][0]:.2f})")
            ours_med = float(np.median([r["tokens_per_s_median"] for r in ours_runs]))
            torch_med = float(np.median([r["tokens_per_s_median"] for r in torch_runs]))
            results.append({"config": name, "ours_tokens_per_s": ours_med, "torch_tokens_per_s": torch_med,
                            "ratio": ours_med / torch_med,
                            "ours_min": min(r["tokens_per_s_min"] for r in ours_runs),
                            "ours_max": max(r["tokens_per_s_max"] for r in ours_runs),
                            "torch_min": min(r["tokens_per_s_min"] for r in torch_runs),
                            "torch_max": max(r["tokens_per_s_max"] for r in torch_runs),
                            "ours_first_step_s": float(np.median([r["first_step_s"] for r in ours_runs])),
                            "ours_mfu": float(np.median([r["mfu"] for r in ours_runs])),
                            "ours_compute_dtype": ours_runs[0]["compute_dtype"],
                            "ours_host_rss_peak_mib": max(r["host_rss_peak_mib"] for r in ours_runs),
                            "load_avg": [r["load_avg_at_start"][0] for pair in zip(ours_runs, torch_runs)
                                         for r in pair],
                            "ours": ours_runs, "torch": torch_runs})
    log(_compare_report(results, torch_runs[0] if results else {}))
    return {"steps_per_window": steps, "windows": windows, "rounds": rounds, "results": results}


def _compare_report(results: list[dict[str, Any]], torch_info: dict[str, Any]) -> str:
    lines = [f"ours (JAX, this harness's train_step) vs torch {torch_info.get('torch', '?')} "
             f"(eager, {torch_info.get('threads', '?')} threads); tokens/s medians [min-max]",
             f"  {'config':>11} {'ours':>24} {'torch':>24} {'ratio':>6} {'1st step s':>10} {'MFU':>6}  load averages (1 min, at each start)"]
    for r in results:
        lines.append(
            f"  {r['config']:>11} {r['ours_tokens_per_s']:>9,.0f} [{r['ours_min']:,.0f}-{r['ours_max']:,.0f}]".ljust(38)
            + f"{r['torch_tokens_per_s']:>9,.0f} [{r['torch_min']:,.0f}-{r['torch_max']:,.0f}]".rjust(24)
            + f" {r['ratio']:>6.2f} {r['ours_first_step_s']:>10.1f} {100 * r['ours_mfu']:>5.1f}%  "
            + " ".join(f"{v:.1f}" for v in r["load_avg"]))
    return "\n".join(lines)


def _add_compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", default=",".join(sorted(REFERENCE_CONFIGS)),
                        help="comma-separated torch_reference.py configs (default: %(default)s)")
    parser.add_argument("--torch-python", type=Path, default=TORCH_PYTHON,
                        help="the reference venv's python (default: %(default)s)")
    parser.add_argument("--reference", type=Path, default=TORCH_REFERENCE, help="torch_reference.py (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window, both sides (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=5, help="timed windows, both sides (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate ours/torch this many times per config; medians of the rounds (default: %(default)s)")
    parser.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model.json key on our side, e.g. --model compute_dtype=bfloat16 (repeatable)")


def _run_compare(args: argparse.Namespace) -> dict[str, Any]:
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in REFERENCE_CONFIGS]
    if unknown or not configs:
        raise BenchError(f"--configs {args.configs!r}: known configs are {', '.join(sorted(REFERENCE_CONFIGS))}")
    return bench_compare(configs, torch_python=args.torch_python, reference=args.reference, steps=args.steps,
                         windows=args.windows, rounds=args.rounds, model=args.model)


# ----------------------------------------------------------------------------- generate


def _add_generate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, nargs="?", default=None,
                        help="run directory whose model.json shapes the model (default: GPT-2 124M), random weights")
    parser.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model.json key (repeatable)")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens to generate (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (default: %(default)s)")
    parser.add_argument("--cached-only", action="store_true", help="skip the full-forward baseline")


def _run_generate(args: argparse.Namespace) -> dict[str, Any]:
    """generate.bench: KV-cache decoding vs re-running the whole forward pass for every token."""
    import generate

    model_cfg = load_run_configs(args.run)[0] if args.run is not None else generate.GPT2_124M
    if args.model:
        model_cfg = with_overrides(model_cfg, args.model, "--model")
    if args.new_tokens < 1 or args.prompt_tokens < 1 or args.batch_size < 1:
        raise BenchError("--new-tokens, --prompt-tokens and --batch-size must be >= 1")
    if args.prompt_tokens + args.new_tokens > model_cfg.context_length:
        raise BenchError(f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens} exceeds "
                         f"context_length={model_cfg.context_length}")
    return generate.bench(new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                          batch_size=args.batch_size, cfg=model_cfg, uncached=not args.cached_only)


# ----------------------------------------------------------------------------- gpu


def _add_gpu_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("gpu-check"),
                        help="writes OUT.json, OUT.md and the logs under OUT.logs/ (default: %(default)s)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes: the same code paths on any CPU")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (default: %(default)s)")


def _run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    """bench_gpu: the one-shot accelerator check (train step, training + resume, generation)."""
    import bench_gpu

    return bench_gpu.bench_gpu(args.out, cpu_smoke=args.cpu_smoke, budget_s=args.budget)


# name -> (help, add arguments, run); each run returns the figures that --json writes.
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                             Callable[[argparse.Namespace], dict[str, Any]]]] = {
    "data": ("batch assembly + device_put throughput vs training", _add_data_args, _run_data),
    "train": ("training throughput, compile time, MFU and memory of the real train_step", _add_train_args, _run_train),
    "compare": ("bench.py train vs ../shared/bench/torch_reference.py, per config", _add_compare_args, _run_compare),
    "generate": ("sampling speed: KV-cache decoding vs full forward per token", _add_generate_args, _run_generate),
    "gpu": ("the one-shot accelerator check: 124M train step, training + resume, generation", _add_gpu_args,
            _run_gpu),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    for name, (help_text, add_args, _) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        add_args(p)
        p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    try:
        figures = SUBCOMMANDS[args.command][2](args)
    except (ConfigError, DataError, BenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    fast_malloc.reexec()  # restarts once with huge-page malloc where that helps (fast_malloc.py)
    raise SystemExit(main())
