"""Benchmarks, one subcommand each: `uv run -m bench <benchmark> ...`.

    uv run -m bench data                                  # runs/gpt2-small's batches, synthetic shards
    uv run -m bench data --run runs/shakespeare --seconds 10 --json data.json
    uv run -m bench data --dataset data/fineweb10B-gpt2-gpt2   # real shards (page cache as it is)
    uv run -m bench train --config cpu-small              # torch_step.py's shapes (char-tiny, gpt2-vocab, nano-cpu)
    uv run -m bench train runs/shakespeare --steps 10 --warmup 4 --windows 5 --breakdown --json train.json
    uv run -m bench train --config cpu-small --accum-sweep 1,4,16,64   # peak memory per k, fresh process each
    uv run -m bench compare --rounds 2 --json compare.json    # ours vs PyTorch ($JAXGPT_TORCH_PYTHON), fp32 and bf16
    uv run -m bench generate --rounds 3 --json decode.json    # sampling vs transformers' generate, several layouts
    uv run -m bench gemv                                  # one decode matmul per form, float32 vs bfloat16 weights
    uv run -m bench tokenize --rounds 3                   # download_dataset.py text vs tiktoken's batch, 100 MB
    uv run -m bench generate --single --batch-size 4          # one process: KV-cache sampling vs full forward (124M)
    python3 -m bench gpu --out gpu-check                      # on an accelerator machine; --cpu-smoke anywhere
    uv run -m bench serve                                     # serve.py, 1 / 4 / 16 streaming clients: tokens/s, TTFT
    uv run -m bench serve --memory                            # serve.py's resident memory after 100 and 2,000 requests
    uv run -m bench engine                                    # the engine at the RL sampling shape: 1 row vs 16

Each benchmark is a module of this folder with a `bench_<name>(...) -> dict` (loader.py: data, gemv.py,
train_step.py: train, compare.py, decode.py: generate, gpu.py, pipeline.py, jax_reference.py: reference,
tokenizing.py: tokenize, serve.py, engine.py); this file is their command line:
a parser hook `_add_<name>_args` and a runner `_run_<name>` per entry of SUBCOMMANDS. The PyTorch
sides of compare and generate (torch_step.py, torch_generate.py) run in the reference interpreter
that --torch-python or $JAXGPT_TORCH_PYTHON names; with neither, their torch side is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import decode as decode_bench
from bench.compare import DTYPES, TORCH_PYTHON_ENV, TORCH_STEP, bench_compare, torch_python_from_env
from bench.gemv import bench_gemv
from bench.loader import bench_data
from bench.tokenizing import DOWNLOAD_DATASET, bench_tokenize
from bench.train_step import REFERENCE_CONFIGS, BenchError, accum_sweep, bench_train, reference_configs
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from jaxgpt.data.errors import DataError


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run", type=Path, default=Path("runs/gpt2-small"), help="run directory (default: %(default)s)"
    )
    parser.add_argument(
        "--dataset", type=Path, default=None, help="a prepared dataset folder instead of synthetic shards"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to time (default: %(default)s)")
    parser.add_argument(
        "--train-tokens-per-s",
        type=float,
        default=None,
        help="measured training throughput to compare with (default: FLOP-based upper bound)",
    )


def _run_data(args: argparse.Namespace) -> dict[str, Any]:
    return bench_data(args.run, dataset=args.dataset, seconds=args.seconds, train_tokens_per_s=args.train_tokens_per_s)


# ----------------------------------------------------------------------------- train


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
    parser.add_argument(
        "run",
        type=Path,
        nargs="?",
        default=None,
        help="run directory (its model.json and train.json shapes); or use --config",
    )
    parser.add_argument(
        "--config",
        choices=sorted(REFERENCE_CONFIGS),
        default=None,
        help="a bench/torch_step.py shape instead of a run (default without a run: cpu-small)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model.json key, e.g. --model compute_dtype=bfloat16 (repeatable)",
    )
    parser.add_argument(
        "--train",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a train.json key, e.g. --train microbatch_size=1 (repeatable)",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps per timed window (default: 10)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps after the compiling first one (default: 4, so 5 untimed as the reference)",
    )
    parser.add_argument("--windows", type=int, default=None, help="timed windows (default: 5)")
    parser.add_argument(
        "--accum", type=int, default=None, help="override gradient_accumulation_steps (--config: default 1)"
    )
    parser.add_argument(
        "--accum-sweep",
        type=str,
        default=None,
        metavar="K,K,...",
        help="peak RSS, XLA temp memory and compile time per k, each k in a fresh process "
        "(default there: 2 windows x 1 step after 2 untimed)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time one microbatch's forward, forward+backward and optimiser update",
    )
    parser.add_argument(
        "--xla-memory",
        action="store_true",
        help="also compile once more through .lower().compile() for XLA's memory analysis",
    )
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
        return accum_sweep(
            _source_args(args),
            ks,
            steps=args.steps or 1,
            warmup=args.warmup if args.warmup is not None else 1,
            windows=args.windows or 2,
        )
    return bench_train(
        model_cfg,
        train_cfg,
        name=name,
        steps=args.steps or 10,
        warmup=args.warmup if args.warmup is not None else 4,
        windows=args.windows or 5,
        accumulation=args.accum,
        matmul_size=None if args.no_matmul else 2048,
        xla_memory=args.xla_memory,
        breakdown=args.breakdown,
    )


# ----------------------------------------------------------------------------- compare


def _add_torch_python_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """--torch-python, its default read from the environment when the parser is built."""
    parser.add_argument(
        "--torch-python",
        type=Path,
        default=torch_python_from_env(),
        help=f"the reference interpreter: {what} (default: ${TORCH_PYTHON_ENV}; "
        f"with neither, the torch side is skipped)",
    )


def _add_compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configs",
        default=",".join(sorted(REFERENCE_CONFIGS)),
        help="comma-separated bench/torch_step.py configs (default: %(default)s)",
    )
    _add_torch_python_arg(parser, "a python with torch")
    parser.add_argument(
        "--reference",
        type=Path,
        default=TORCH_STEP,
        help="the torch side's script, run by --torch-python (default: %(default)s)",
    )
    parser.add_argument(
        "--steps", type=int, default=10, help="steps per timed window, both sides (default: %(default)s)"
    )
    parser.add_argument("--windows", type=int, default=5, help="timed windows, both sides (default: %(default)s)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate ours/torch this many times per config; medians of the rounds (default: %(default)s)",
    )
    parser.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help="the columns: our compute_dtype against torch without (float32) or with --bf16 "
        "(bfloat16: torch.autocast) (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model.json key on our side, e.g. --model attention=xla (repeatable; "
        "compute_dtype is the column's)",
    )


def _run_compare(args: argparse.Namespace) -> dict[str, Any]:
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in REFERENCE_CONFIGS]
    if unknown or not configs:
        raise BenchError(f"--configs {args.configs!r}: known configs are {', '.join(sorted(REFERENCE_CONFIGS))}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise BenchError(f"--dtypes {args.dtypes!r}: expected some of {','.join(DTYPES)}")
    if args.rounds < 1:
        raise BenchError(f"--rounds {args.rounds}: expected >= 1")
    return bench_compare(
        configs,
        torch_python=args.torch_python,
        reference=args.reference,
        steps=args.steps,
        windows=args.windows,
        rounds=args.rounds,
        model=args.model,
        dtypes=dtypes,
    )


# ----------------------------------------------------------------------------- generate


def _add_generate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        type=Path,
        nargs="?",
        default=None,
        help="run directory whose model.json shapes the model (default: GPT-2 124M), random weights",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model.json key (repeatable; compare: compute_dtype and scan_layers are the columns')",
    )
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens to generate (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (default: %(default)s)")
    d = " (default: %(default)s)"
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed generate calls per process after an untimed one" + d
    )
    parser.add_argument(
        "--dtypes", default=",".join(decode_bench.DTYPES), help="compare: our compute_dtype, torch's" + d
    )
    batches = ",".join(map(str, decode_bench.BATCH_SIZES))
    parser.add_argument("--batch-sizes", default=batches, help="compare: prompts decoded together" + d)
    layouts = "compare: our scan_layers false (unrolled) / true (scanned)" + d
    parser.add_argument("--layouts", default=",".join(decode_bench.LAYOUTS), help=layouts)
    rounds = "compare: alternate every side this many times; medians of the rounds" + d
    parser.add_argument("--rounds", type=int, default=1, help=rounds)
    parser.add_argument("--no-torch", action="store_true", help="compare: ours only")
    _add_torch_python_arg(parser, "compare: a python with torch and transformers")
    parser.add_argument(
        "--single",
        action="store_true",
        help="instead: one measurement in this process, the KV cache against the full forward "
        "pass per token (what each of our compare runs does, with --cached-only)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=1, help="--single: prompts decoded together (default: %(default)s)"
    )
    burst = "--single: greedy decode steps per dispatch in the engine, 1 = one per token (default: %(default)s)"
    parser.add_argument("--burst", type=int, default=decode_bench.BURST, help=burst)
    parser.add_argument("--cached-only", action="store_true", help="--single: skip the full-forward baseline")


def _csv(text: str, flag: str, allowed: tuple[str, ...] | None) -> list[str]:
    """A comma-separated flag's values: some of `allowed`, or (None) positive integers."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    ok = all(v in allowed for v in values) if allowed else all(v.isdigit() and int(v) > 0 for v in values)
    if not values or not ok:
        raise BenchError(
            f"{flag} {text!r}: expected "
            + (f"some of {','.join(allowed)}" if allowed else "positive integers like 1,8")
        )
    return values


def _run_generate(args: argparse.Namespace) -> dict[str, Any]:
    """bench.decode: ours against transformers' generate, or (--single) one in-process measurement."""
    model_cfg = load_run_configs(args.run)[0] if args.run is not None else decode_bench.GPT2_124M
    if not args.single and any(item.partition("=")[0] in ("compute_dtype", "scan_layers") for item in args.model):
        raise BenchError(
            "--model compute_dtype=... / scan_layers=...: the comparison sets them per column; use "
            "--dtypes / --layouts (or --single)"
        )
    if args.model:
        model_cfg = with_overrides(model_cfg, args.model, "--model")
    if min(args.new_tokens, args.prompt_tokens, args.batch_size, args.repeats, args.rounds, args.burst) < 1:
        raise BenchError("--new-tokens, --prompt-tokens, --batch-size, --repeats, --rounds and --burst must be >= 1")
    if args.prompt_tokens + args.new_tokens > model_cfg.context_length:
        raise BenchError(
            f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens} exceeds "
            f"context_length={model_cfg.context_length}"
        )
    if args.single:
        return decode_bench.bench_generate(
            new_tokens=args.new_tokens,
            prompt_tokens=args.prompt_tokens,
            batch_size=args.batch_size,
            cfg=model_cfg,
            uncached=not args.cached_only,
            repeats=args.repeats,
            burst=args.burst,
        )
    batch_sizes = [int(b) for b in _csv(args.batch_sizes, "--batch-sizes", None)]
    return decode_bench.bench_generate_compare(
        model_cfg,
        dtypes=_csv(args.dtypes, "--dtypes", decode_bench.DTYPES),
        batch_sizes=batch_sizes,
        layouts=_csv(args.layouts, "--layouts", decode_bench.LAYOUTS),
        rounds=args.rounds,
        new_tokens=args.new_tokens,
        prompt_tokens=args.prompt_tokens,
        repeats=args.repeats,
        torch=not args.no_torch,
        torch_python=args.torch_python,
    )


# ----------------------------------------------------------------------------- gpu


def _add_out_and_smoke(parser: argparse.ArgumentParser, out: str) -> None:
    """The one-shot checks' (gpu, pipeline) --out and --cpu-smoke."""
    parser.add_argument("--out", type=Path, default=Path(out), help="writes OUT.json, OUT.md, logs in OUT.logs/")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes: the same code paths on any CPU")


def _add_gpu_args(parser: argparse.ArgumentParser) -> None:
    _add_out_and_smoke(parser, "gpu-check")
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds for the whole check (default: %(default)s)"
    )


def _run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    """bench.gpu: the one-shot accelerator check (train step, training + resume, generation)."""
    from bench import gpu

    return gpu.bench_gpu(args.out, cpu_smoke=args.cpu_smoke, budget_s=args.budget)


# ----------------------------------------------------------------------------- reference


def _add_reference_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, nargs="?", default=Path("runs/gpt2-small"), help="default: %(default)s")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step, both sides (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=3, help="timed windows (default: %(default)s)")
    parser.add_argument("--model", action="append", default=[], metavar="KEY=VALUE", help="a model.json key, ours")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes: the same code on any CPU")


def _run_reference(args: argparse.Namespace) -> dict[str, Any]:
    """bench.jax_reference: our step against a plain JAX + optax one, in one process."""
    from bench.jax_reference import SMOKE_MODEL, bench_reference

    model_cfg, train_cfg = load_run_configs(args.run)
    model_cfg = with_overrides(model_cfg, (SMOKE_MODEL if args.cpu_smoke else []) + args.model, "--model")
    batch = 2 if args.cpu_smoke else args.batch
    return bench_reference(model_cfg, train_cfg, batch=batch, steps=args.steps, windows=args.windows)


# ----------------------------------------------------------------------------- pipeline


def _add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    _add_out_and_smoke(parser, "pipeline")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all stages (default: no limit)")
    parser.add_argument(
        "--stages",
        default=None,
        help="comma-separated parts of stage names: only those stages and the trainings they need (default: all)",
    )


def _run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """bench.pipeline: the README's workflow once, a row per stage."""
    from bench import pipeline

    only = None if args.stages is None else [part.strip() for part in args.stages.split(",") if part.strip()]
    return pipeline.pipeline(args.out, cpu_smoke=args.cpu_smoke, budget_s=args.budget, only=only)


# ----------------------------------------------------------------------------- gemv


def _add_gemv_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes",
        default="768x2304,768x3072,3072x768,768x50257",
        help="K x M weight shapes, comma-separated (default: GPT-2 124M's: %(default)s)",
    )
    parser.add_argument("--calls", type=int, default=20, help="calls per timed window (default: %(default)s)")


def _run_gemv(args: argparse.Namespace) -> dict[str, Any]:
    try:
        shapes = [tuple(int(n) for n in item.split("x")) for item in args.shapes.split(",")]
    except ValueError:
        raise BenchError(f"--shapes {args.shapes!r}: expected KxM[,KxM...], e.g. 768x3072") from None
    if any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise BenchError(f"--shapes {args.shapes!r}: expected KxM[,KxM...] of positive sizes")
    return bench_gemv(shapes, calls=args.calls)


# ----------------------------------------------------------------------------- serve


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=Path, nargs="?", default=None, help="an rl run directory (default: runs/tiny-rl), random weights"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, 1 and 16 rows in turn (default: 3)")


def _run_engine(args: argparse.Namespace) -> dict[str, Any]:
    """bench.engine: the engine's tokens/s at the RL sampling shape, 1 row against 16."""
    from bench import engine

    if args.rounds < 1:
        raise BenchError("--rounds must be >= 1")
    return engine.bench_engine(args.run, rounds=args.rounds)


def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        type=Path,
        nargs="?",
        default=None,
        help="run directory whose model.json shapes the model (default: runs/tiny), random weights",
    )
    parser.add_argument("--clients", default="1,4,16", help="clients at once, one level each (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=8, help="streamed requests per client (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: %(default)s)")
    parser.add_argument("--max-batch", type=int, default=16, help="serve.py --max-batch (default: %(default)s)")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="instead: resident memory after the first 100 and after 2,000 requests, 64 clients, --max-batch 64",
    )


def _run_serve(args: argparse.Namespace) -> dict[str, Any]:
    """bench.serve: serve.py's tokens/s and time to first token with several clients at once."""
    from bench import serve

    clients = [int(c) for c in _csv(args.clients, "--clients", None)]
    if min(args.requests, args.max_tokens, args.max_batch) < 1:
        raise BenchError("--requests, --max-tokens and --max-batch must be >= 1")
    if args.memory:
        return serve.bench_memory(serve.load_cfg(args.run))
    return serve.bench_serve(
        serve.load_cfg(args.run),
        clients=clients,
        requests=args.requests,
        max_tokens=args.max_tokens,
        max_batch=args.max_batch,
    )


# ----------------------------------------------------------------------------- tokenize


def _add_tokenize_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--megabytes", type=float, default=100.0, help="corpus size (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two sides (default: %(default)s)")
    parser.add_argument(
        "--corpus-dir",
        type=Path,
        default=None,
        help="where the corpus is written once and reused (default: <data root>/bench)",
    )
    parser.add_argument(
        "--script",
        type=Path,
        default=DOWNLOAD_DATASET,
        help="the download_dataset.py to time, e.g. another checkout's (default: this one's)",
    )


def _run_tokenize(args: argparse.Namespace) -> dict[str, Any]:
    return bench_tokenize(args.megabytes, args.rounds, corpus_dir=args.corpus_dir, script=args.script)


# name -> (help, add arguments, run); each run returns the figures that --json writes.
SUBCOMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], dict[str, Any]]]
] = {
    "data": ("batch assembly + device_put throughput vs training", _add_data_args, _run_data),
    "train": ("training throughput, compile time, MFU and memory of the real train_step", _add_train_args, _run_train),
    "compare": ("bench train vs PyTorch (bench/torch_step.py), per config", _add_compare_args, _run_compare),
    "gemv": ("a decode step's matrix-vector product per form: float32 vs bfloat16 weights", _add_gemv_args, _run_gemv),
    "generate": (
        "sampling speed: ours vs transformers' generate (--single: KV cache vs full forward)",
        _add_generate_args,
        _run_generate,
    ),
    "engine": (
        "the generation engine at the RL sampling shape: tokens/s with 1 row and with 16",
        _add_engine_args,
        _run_engine,
    ),
    "tokenize": (
        "download_dataset.py text against tiktoken's encode_ordinary_batch, MB/s",
        _add_tokenize_args,
        _run_tokenize,
    ),
    "gpu": ("the one-shot accelerator check: 124M train step, training + resume, generation", _add_gpu_args, _run_gpu),
    "pipeline": ("the README's workflow once on this device, a row per stage", _add_pipeline_args, _run_pipeline),
    "reference": ("our train step against a plain JAX + optax step of GPT-2", _add_reference_args, _run_reference),
    "serve": (
        "serve.py's tokens/s and time to first token with 1, 4 and 16 streaming clients at once",
        _add_serve_args,
        _run_serve,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="uv run -m bench",
        description=__doc__.split("\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
