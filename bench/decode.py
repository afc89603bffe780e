"""`uv run -m bench generate`: sampling speed, ours against transformers' generate, like for like.

    uv run -m bench generate                            # fp32 / bf16 x batch 1 / 8 x unrolled / scanned, vs torch
    uv run -m bench generate --rounds 3 --json decode.json
    uv run -m bench generate --single --batch-size 4    # one process: KV cache vs the full forward per token

The comparison (`bench_generate_compare`): greedy decoding of --new-tokens tokens after a random
--prompt-tokens prompt, on a randomly initialised model of GPT-2 124M's shape (or a run's
model.json shape), every cell a fresh process: ours (`bench generate --single --cached-only`,
compute_dtype float32 or bfloat16, scan_layers false or true) and transformers'
GPT2LMHeadModel.generate with its KV cache (bench/torch_generate.py, run by the reference
interpreter as `bench compare` runs torch: --torch-python, else $JAXGPT_TORCH_PYTHON, with
torch and transformers; with neither, the torch side is skipped with one line; its weights in
the same dtype). The runs alternate ours
unrolled, ours scanned, torch for each dtype and batch, --rounds times, so a change in the
machine's load hits every side; figures are medians over the rounds, with the 1-minute load
average at each start. ms/token = one generate call's time / new tokens (the prefill included,
compilation and a first call excluded on both sides).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from bench.compare import cpu_line, torch_python_checked
from bench.train_step import BenchError
from jaxgpt.config import ModelConfig, to_dict
from jaxgpt.cpu import kernels as cpu_kernels
from jaxgpt.generation.decoder import BUCKET, full_forward_logits
from jaxgpt.generation.engine import BURST, Engine
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model

GPT2_124M = ModelConfig(
    architecture="gpt2",
    vocab_size=50257,
    context_length=1024,
    emb_dim=768,
    n_heads=12,
    n_layers=12,
    qkv_bias=True,
    tie_embeddings=True,
)
DTYPES = ("float32", "bfloat16")
BATCH_SIZES = (1, 8)
LAYOUTS = ("unrolled", "scanned")  # our scan_layers false / true; the torch side has one layout
TORCH_SCRIPT = Path(__file__).with_name("torch_generate.py")
ROOT = Path(__file__).resolve().parent.parent
# The ratios the decoder is meant to keep, printed beside the measured ones.
TARGETS = {"bf16_over_fp32": 0.7, "scanned_over_unrolled": 1.1, "ours_over_torch": 1.0}


def bench_generate(
    *,
    new_tokens: int = 128,
    prompt_tokens: int = 16,
    batch_size: int = 1,
    cfg: ModelConfig = GPT2_124M,
    uncached: bool = True,
    repeats: int = 3,
    burst: int = BURST,
    log: Any = print,
) -> dict[str, Any]:
    """Greedy decoding speed in this process: the generation engine (its KV cache, `burst` greedy
    steps per program; 1: one step per dispatch), and (uncached) the full forward pass for every token.

    Compilation is excluded from both: the cached path (prefill + new_tokens - 1 decode steps)
    runs once untimed, then `repeats` timed times; the uncached baseline runs one program over a
    window just long enough for the whole generation (prompt + new tokens, rounded up to BUCKET),
    its best case.
    """
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, size=(batch_size, prompt_tokens)).tolist()
    log(_model_line(model, cfg, batch_size, prompt_tokens, new_tokens))

    t0 = time.perf_counter()
    engine = Engine(model, None, rows=batch_size, burst=burst)
    dec = engine.decoder
    build_s = time.perf_counter() - t0
    times, cached_tokens = _time_cached(engine, prompts, new_tokens, repeats)
    cached_s = float(np.median(times))
    ms = [1e3 * t / new_tokens for t in times]
    result = {
        "side": "ours",
        "compute_dtype": model.ops.compute_dtype,
        "scan_layers": cfg.scan_layers,
        "batch_size": batch_size,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "cached_s": cached_s,
        "cached_tok_s": new_tokens * batch_size / cached_s,
        "ms_per_token_median": float(np.median(ms)),
        "ms_per_token": ms,
        "decoder_build_s": build_s,
        "compile_step_s": dec.compile_s,
        "burst": burst,
    }
    log(
        f"cached:   {cached_s:7.2f} s  {result['cached_tok_s']:8.1f} tok/s  "
        f"({result['ms_per_token_median']:.1f} ms/token, median of {repeats}: {', '.join(f'{m:.1f}' for m in ms)}; "
        f"engine built in {build_s:.1f} s, {sum(k in ('step', 'steps') for k, _ in dec._programs)} decode program(s) "
        f"compiled in {dec.compile_s:.1f} s; {burst} greedy step(s) per dispatch)"
    )
    if not uncached:
        return result
    return result | _uncached(model, cfg, prompts, cached_tokens, cached_s, log)


def _model_line(model: Any, cfg: ModelConfig, batch_size: int, prompt_tokens: int, new_tokens: int) -> str:
    """The log line naming what is measured: the model's shape and dtype, the batch, the device."""
    return (
        f"model: {cfg.n_layers} layers, {cfg.emb_dim} dims, vocab {cfg.vocab_size}, "
        f"{sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) / 1e6:.1f}M params, "
        f"compute_dtype {model.ops.compute_dtype}, {'scanned' if cfg.scan_layers else 'unrolled'}; "
        f"batch {batch_size}, prompt {prompt_tokens}, {new_tokens} new tokens; {jax.devices()[0].platform}"
    )


def _time_cached(
    engine: Engine, prompts: list[list[int]], new_tokens: int, repeats: int
) -> tuple[list[float], list[np.ndarray]]:
    """The engine's wall times over `repeats` runs after an untimed one, and the greedy tokens (one
    (B,) array per step). No stop id: every answer is new_tokens long."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)

    def cached() -> list[np.ndarray]:
        return list(np.array([r.sampled for r in engine.generate(prompts, params)]).T)

    cached_tokens = cached()  # compiles the prefill bucket and every attention span the run needs
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cached_tokens = cached()
        times.append(time.perf_counter() - t0)
    return times, cached_tokens


def _uncached(
    model: Any, cfg: ModelConfig, prompts: list[list[int]], cached_tokens: list[np.ndarray], cached_s: float, log: Any
) -> dict[str, Any]:
    """The baseline: the full forward pass for every new token, over one window just long enough
    for the whole generation (its best case), compiled before the clock starts."""
    batch_size, prompt_tokens, new_tokens = len(prompts), len(prompts[0]), len(cached_tokens)
    width = min(cfg.context_length, -(-(prompt_tokens + new_tokens) // BUCKET) * BUCKET)
    windows = np.zeros((batch_size, width), np.int32)
    windows[:, :prompt_tokens] = prompts
    last = np.full(batch_size, prompt_tokens - 1)
    full_forward_logits(model, windows, last)  # compile
    t0 = time.perf_counter()
    same = 0
    for i in range(new_tokens):
        nxt = full_forward_logits(model, windows, last).argmax(-1)
        same += int((nxt == cached_tokens[i]).all())
        if i + 1 < new_tokens:
            last = last + 1
            windows[np.arange(batch_size), last] = nxt
    full_s = time.perf_counter() - t0
    result = {
        "full_s": full_s,
        "full_tok_s": new_tokens * batch_size / full_s,
        "speedup": full_s / cached_s,
        "same_greedy_tokens": same / new_tokens,
    }
    log(
        f"uncached: {full_s:7.2f} s  {result['full_tok_s']:8.1f} tok/s  (window {width}; "
        f"{1e3 * full_s / new_tokens:.1f} ms/token)"
    )
    log(f"speed-up: {result['speedup']:.1f}x; greedy tokens identical at {same}/{new_tokens} steps")
    return result


# ----------------------------------------------------------------------------- ours vs transformers


SIDES = (*LAYOUTS, "torch")
# (side, dtype, batch size, json path) -> that run's figures
Runner = Callable[[str, str, int, Path], dict[str, Any]]


def plan(dtypes: list[str], batch_sizes: list[int], sides: list[str], rounds: int) -> list[tuple[str, int, int, str]]:
    """The runs in the order they are made: (dtype, batch, round, side), the sides of a cell
    back to back, every cell in each round, rounds in turn."""
    return [
        (dtype, batch, rnd, side)
        for rnd in range(rounds)
        for dtype in dtypes
        for batch in batch_sizes
        for side in sides
    ]


def torch_shape_args(cfg: ModelConfig) -> list[str]:
    """bench/torch_generate.py's arguments for `cfg`'s shape; a BenchError where GPT2LMHeadModel
    cannot be the same model (it has every bias and a tied head)."""
    if cfg.architecture != "gpt2" or not (cfg.bias and cfg.qkv_bias and cfg.tie_embeddings):
        raise BenchError(
            f"transformers' GPT-2 has biases everywhere and a tied head; this model (architecture "
            f"{cfg.architecture}, bias {cfg.bias}, qkv_bias {cfg.qkv_bias}, tie_embeddings "
            f"{cfg.tie_embeddings}) has no torch twin: pass --no-torch"
        )
    return [
        "--vocab-size",
        str(cfg.vocab_size),
        "--context-length",
        str(cfg.context_length),
        "--emb-dim",
        str(cfg.emb_dim),
        "--n-layers",
        str(cfg.n_layers),
        "--n-heads",
        str(cfg.n_heads),
    ]


def subprocess_runner(
    cfg: ModelConfig, *, new_tokens: int, prompt_tokens: int, repeats: int, torch_python: Path | None
) -> Runner:
    """Runs each side as a fresh process and reads its --json figures."""
    shape = [
        f"--model={key}={json.dumps(value)}"
        for key, value in to_dict(cfg).items()
        if key not in ("compute_dtype", "scan_layers")
    ]
    lengths = ["--new-tokens", str(new_tokens), "--prompt-tokens", str(prompt_tokens), "--repeats", str(repeats)]

    def run(side: str, dtype: str, batch: int, out: Path) -> dict[str, Any]:
        if side == "torch":
            cmd = [
                str(torch_python),
                str(TORCH_SCRIPT),
                "--dtype",
                dtype,
                "--batch-size",
                str(batch),
                *torch_shape_args(cfg),
                *lengths,
                "--json",
                str(out),
            ]
        else:
            cmd = [
                sys.executable,
                "-m",
                "bench",
                "generate",
                "--single",
                "--cached-only",
                *shape,
                f"--model=compute_dtype={dtype}",
                f"--model=scan_layers={json.dumps(side == 'scanned')}",
                "--batch-size",
                str(batch),
                *lengths,
                "--json",
                str(out),
            ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        return json.loads(out.read_text())

    return run


def bench_generate_compare(
    cfg: ModelConfig = GPT2_124M,
    *,
    dtypes: list[str] | None = None,
    batch_sizes: list[int] | None = None,
    layouts: list[str] | None = None,
    rounds: int = 1,
    new_tokens: int = 128,
    prompt_tokens: int = 16,
    repeats: int = 3,
    torch: bool = True,
    torch_python: Path | None = None,
    runner: Runner | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Ours (each layout) and, with `torch`, transformers' generate, per dtype and batch size, in
    the order of `plan`; the figures `--json` writes. Without a runner the sides run as
    processes, the torch side by `torch_python` (none: skipped, with one line)."""
    dtypes, batch_sizes = list(dtypes or DTYPES), list(batch_sizes or BATCH_SIZES)
    if runner is None:
        if torch:
            torch_shape_args(cfg)  # before any run: this model has a torch twin
            torch_python = torch_python_checked(torch_python, log)
            torch = torch_python is not None
        runner = subprocess_runner(
            cfg, new_tokens=new_tokens, prompt_tokens=prompt_tokens, repeats=repeats, torch_python=torch_python
        )
    sides = [*(layouts or LAYOUTS), *(["torch"] if torch else [])]
    cpu = cpu_kernels.cpu_info()
    log(cpu_line(cpu))
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for dtype, batch, rnd, side in plan(dtypes, batch_sizes, sides, rounds):
            load = os.getloadavg()
            figures = runner(side, dtype, batch, Path(tmp) / f"{side}-{dtype}-{batch}-{rnd}.json")
            figures["load_avg_at_start"] = list(load)
            runs.setdefault((dtype, batch, side), []).append(figures)
            log(
                f"{dtype} batch {batch} round {rnd + 1}/{rounds}: {side} {figures['ms_per_token_median']:.1f} ms/token "
                f"(load {load[0]:.2f})"
            )
    cells = summarize(runs, dtypes, batch_sizes, sides)
    torch_info = next((r for rs in runs.values() for r in rs if r.get("side") == "torch"), {})
    log(report(cells, dtypes, batch_sizes, sides, cpu, torch_info, rounds, cfg, new_tokens, prompt_tokens))
    return {
        "cpu": cpu,
        "os_cpu_count": os.cpu_count(),
        "torch": torch_info.get("torch"),
        "transformers": torch_info.get("transformers"),
        "torch_threads": torch_info.get("threads"),
        "model": to_dict(cfg),
        "new_tokens": new_tokens,
        "prompt_tokens": prompt_tokens,
        "repeats": repeats,
        "rounds": rounds,
        "targets": TARGETS,
        "target_checks": target_checks(cells),
        "cells": cells,
    }


def summarize(
    runs: dict[tuple[str, int, str], list[dict[str, Any]]], dtypes: list[str], batch_sizes: list[int], sides: list[str]
) -> list[dict[str, Any]]:
    """One entry per (dtype, batch): each side's median ms/token over the rounds, and the ratios
    the targets are about (None where a side was not run)."""
    med = {key: float(np.median([r["ms_per_token_median"] for r in rs])) for key, rs in runs.items()}

    def ratio(a: tuple[str, int, str], b: tuple[str, int, str]) -> float | None:
        return med[a] / med[b] if a in med and b in med else None

    cells = []
    for dtype in dtypes:
        for batch in batch_sizes:
            cell: dict[str, Any] = {"dtype": dtype, "batch_size": batch}
            for side in sides:
                cell[side] = {
                    "ms_per_token": med[(dtype, batch, side)],
                    "min": min(min(r["ms_per_token"]) for r in runs[(dtype, batch, side)]),
                    "max": max(max(r["ms_per_token"]) for r in runs[(dtype, batch, side)]),
                    "load_avg": [r["load_avg_at_start"][0] for r in runs[(dtype, batch, side)]],
                    "runs": runs[(dtype, batch, side)],
                }
            cell["scanned_over_unrolled"] = ratio((dtype, batch, "scanned"), (dtype, batch, "unrolled"))
            for layout in LAYOUTS:
                cell[f"{layout}_over_torch"] = ratio((dtype, batch, layout), (dtype, batch, "torch"))
                cell[f"{layout}_bf16_over_fp32"] = ratio(("bfloat16", batch, layout), ("float32", batch, layout))
            cell["torch_bf16_over_fp32"] = ratio(("bfloat16", batch, "torch"), ("float32", batch, "torch"))
            cells.append(cell)
    return cells


def target_checks(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measured ratio the targets are about: ours bf16 / fp32 per batch and layout, scanned /
    unrolled per dtype and batch, ours / torch per dtype, batch and layout."""
    checks = []

    def check(target: str, where: str, value: float | None, limit: float) -> None:
        if value is not None:
            checks.append({"target": f"{target} <= {limit}", "where": where, "value": value, "met": value <= limit})

    for c in cells:
        where = f"{c['dtype']} batch {c['batch_size']}"
        if c["dtype"] == "bfloat16":
            for layout in LAYOUTS:
                check(
                    "bf16/fp32",
                    f"batch {c['batch_size']} {layout}",
                    c[f"{layout}_bf16_over_fp32"],
                    TARGETS["bf16_over_fp32"],
                )
        check("scanned/unrolled", where, c["scanned_over_unrolled"], TARGETS["scanned_over_unrolled"])
        for layout in LAYOUTS:
            check("ours/torch", f"{where} {layout}", c[f"{layout}_over_torch"], TARGETS["ours_over_torch"])
    return checks


def report(
    cells: list[dict[str, Any]],
    dtypes: list[str],
    batch_sizes: list[int],
    sides: list[str],
    cpu: dict[str, Any],
    torch_info: dict[str, Any],
    rounds: int,
    cfg: ModelConfig,
    new_tokens: int,
    prompt_tokens: int,
) -> str:
    """The table: ms/token per side (median [min-max]), then the ratios against their targets."""

    def num(v: float | None, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    torch = (
        f"; torch = transformers {torch_info['transformers']} GPT2LMHeadModel.generate (KV cache) on torch "
        f"{torch_info['torch']}, {torch_info['threads']} threads"
        if "torch" in sides
        else ""
    )
    lines = [
        cpu_line(cpu) + f"; load average now {os.getloadavg()[0]:.2f}",
        f"model: {cfg.n_layers} layers, {cfg.emb_dim} dims, {cfg.n_heads} heads, vocab {cfg.vocab_size} (random "
        f"weights); greedy, prompt {prompt_tokens}, {new_tokens} new tokens; ms/token, medians of {rounds} "
        f"round(s) [min-max over every call]" + torch,
        f"  {'dtype':>8} {'batch':>5}"
        + "".join(f" {side:>22}" for side in sides)
        + f" {'scan/unroll':>11} {'unroll/torch':>12} {'scan/torch':>10} {'loads at each start'}",
    ]
    for c in cells:
        line = f"  {c['dtype']:>8} {c['batch_size']:>5}"
        for side in sides:
            s = c[side]
            line += f" {s['ms_per_token']:>8.1f} [{s['min']:.1f}-{s['max']:.1f}]".rjust(23)
        loads = " ".join(f"{v:.1f}" for side in sides for v in c[side]["load_avg"])
        lines.append(
            line + f" {num(c['scanned_over_unrolled']):>11} {num(c['unrolled_over_torch']):>12} "
            f"{num(c['scanned_over_torch']):>10} {loads}"
        )
    lines.append(
        "  bf16 / fp32 time per token: "
        + "; ".join(
            f"batch {c['batch_size']}: " + ", ".join(f"{side} {num(c.get(f'{side}_bf16_over_fp32'))}" for side in sides)
            for c in cells
            if c["dtype"] == dtypes[0]
        )
    )
    lines.append(
        "  targets: "
        + "; ".join(
            f"{t['target']} {t['where']}: {t['value']:.2f} {'ok' if t['met'] else 'MISSED'}"
            for t in target_checks(cells)
        )
    )
    return "\n".join(lines)
