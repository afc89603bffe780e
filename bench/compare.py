"""`uv run -m bench compare`: our training step against PyTorch's, like for like, on the same shapes.

Two columns per config: ours float32 vs torch float32, and ours bfloat16 (`compute_dtype:
"bfloat16"`: bf16 matmul operands, float32 accumulation and master weights) vs torch
`--bf16` (`torch.autocast("cpu", bfloat16)` over float32 weights). Each run is a fresh process
(`uv run -m bench train --config X --model compute_dtype=D` against bench/torch_step.py
--config X [--bf16], run by the reference interpreter), alternated ours, torch, ours, torch ...
--rounds times per config, so a change in the machine's load hits both sides; each ratio is of
the medians over the rounds, with the 1-minute load average at each start. The output names the
CPU (model name and its AVX-512 / AVX512_BF16 / AMX flags from /proc/cpuinfo).

The reference interpreter is a python with torch (docs/performance.md "The PyTorch reference"):
--torch-python, else $JAXGPT_TORCH_PYTHON. With neither, the torch side is skipped (one line says
so) and only our side runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.train_step import BenchError
from jaxgpt.cpu import kernels as cpu_kernels

ROOT = Path(__file__).resolve().parent.parent
TORCH_STEP = Path(__file__).with_name("torch_step.py")  # the PyTorch side, run by the reference interpreter
TORCH_PYTHON_ENV = "JAXGPT_TORCH_PYTHON"
# How to make a reference interpreter (docs/performance.md "The PyTorch reference" has the same lines).
TORCH_SETUP = (
    "python3 -m venv ~/torchref && ~/torchref/bin/pip install torch==2.13.0 numpy transformers, "
    f"then export {TORCH_PYTHON_ENV}=~/torchref/bin/python"
)
DTYPES = ("float32", "bfloat16")  # the columns: our compute_dtype, and torch without / with --bf16
SIDES = ("ours", "torch")


def torch_python_from_env() -> Path | None:
    """The reference interpreter $JAXGPT_TORCH_PYTHON names, or None (no torch side)."""
    value = os.environ.get(TORCH_PYTHON_ENV, "").strip()
    return Path(value).expanduser() if value else None


def torch_python_checked(torch_python: Path | None, log: Callable[[str], None]) -> Path | None:
    """`torch_python` when it exists; None, with one line saying so, when none was given; a
    BenchError naming the path and the set-up when the one given is missing."""
    if torch_python is None:
        log(
            f"torch side skipped: no reference interpreter (pass --torch-python or set {TORCH_PYTHON_ENV}; "
            f"to make one: {TORCH_SETUP})"
        )
        return None
    if not Path(torch_python).exists():
        raise BenchError(
            f"{torch_python} not found: make a reference interpreter once with {TORCH_SETUP} "
            f"(or pass another --torch-python)"
        )
    return Path(torch_python)


# (side, config, dtype, json path) -> that run's figures (a bench train JSON, or the reference's row)
Runner = Callable[[str, str, str, Path], dict[str, Any]]


def plan(
    configs: list[str], dtypes: list[str], rounds: int, sides: tuple[str, ...] = SIDES
) -> list[tuple[str, str, int, str]]:
    """The runs in the order they are made: (config, dtype, round, side), the two sides of a
    pair back to back, every dtype in each round, rounds in turn."""
    return [(name, dtype, rnd, side) for name in configs for rnd in range(rounds) for dtype in dtypes for side in sides]


def subprocess_runner(
    *, torch_python: Path | None, reference: Path, steps: int, windows: int, model: list[str]
) -> Runner:
    """Runs each side as a fresh process and reads its --json figures."""

    def run(side: str, name: str, dtype: str, out: Path) -> dict[str, Any]:
        if side == "ours":
            cmd = [
                sys.executable,
                "-m",
                "bench",
                "train",
                "--config",
                name,
                "--steps",
                str(steps),
                "--windows",
                str(windows),
                "--json",
                str(out),
                f"--model=compute_dtype={dtype}",
                *[f"--model={m}" for m in model],
            ]
        else:
            cmd = [
                str(torch_python),
                str(reference),
                "--config",
                name,
                "--windows",
                str(windows),
                "--steps-per-window",
                str(steps),
                "--json",
                str(out),
                *(["--bf16"] if dtype == "bfloat16" else []),
            ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        figures = json.loads(out.read_text())
        return figures[0] if side == "torch" else figures  # the reference writes a list of configs

    return run


def bench_compare(
    configs: list[str],
    *,
    torch_python: Path | None = None,
    reference: Path = TORCH_STEP,
    steps: int = 10,
    windows: int = 5,
    rounds: int = 1,
    model: list[str] | None = None,
    dtypes: list[str] | None = None,
    runner: Runner | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Ours (with `model` KEY=VALUE overrides, as `train --model`) vs the torch reference, per
    config and dtype, in the order of `plan`; the figures `--json` writes. Without a runner the
    sides run as processes, the torch side by `torch_python` (none: our side only)."""
    dtypes = list(dtypes or DTYPES)
    model = list(model or [])
    if any(item.partition("=")[0] == "compute_dtype" for item in model):
        raise BenchError("--model compute_dtype=...: compare sets it per column (float32 and bfloat16); use --dtypes")
    sides = SIDES
    if runner is None:
        torch_python = torch_python_checked(torch_python, log)
        if torch_python is None:
            sides = ("ours",)
        elif not Path(reference).exists():
            raise BenchError(f"{reference} not found (pass --reference)")
        runner = subprocess_runner(
            torch_python=torch_python, reference=reference, steps=steps, windows=windows, model=model
        )
    cpu = cpu_kernels.cpu_info()
    log(cpu_line(cpu))
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        for name, dtype, rnd, side in plan(configs, dtypes, rounds, sides):
            load = os.getloadavg()
            figures = runner(side, name, dtype, Path(tmp) / f"{side}-{name}-{dtype}-{rnd}.json")
            figures["load_avg_at_start"] = list(load)
            runs.setdefault((name, dtype, side), []).append(figures)
            log(
                f"{name} {dtype} round {rnd + 1}/{rounds}: {side} {figures['tokens_per_s_median']:,.0f} tokens/s "
                f"(load {load[0]:.2f})"
            )
    results = summarize(runs, configs, dtypes)
    torch_info = next((r for rs in runs.values() for r in rs if "torch" in r), {})
    log(compare_report(results, dtypes, cpu, torch_info, rounds))
    return {
        "cpu": cpu,
        "torch": torch_info.get("torch"),
        "torch_threads": torch_info.get("threads"),
        "steps_per_window": steps,
        "windows": windows,
        "rounds": rounds,
        "dtypes": dtypes,
        "model": model,
        "results": results,
    }


def summarize(
    runs: dict[tuple[str, str, str], list[dict[str, Any]]], configs: list[str], dtypes: list[str]
) -> list[dict[str, Any]]:
    """One row per config, one entry per dtype: the medians of the rounds and their ratio (the
    torch figures None where its side did not run)."""
    results = []
    for name in configs:
        row: dict[str, Any] = {"config": name}
        for dtype in dtypes:
            ours, theirs = runs[(name, dtype, "ours")], runs.get((name, dtype, "torch"), [])
            ours_med = float(np.median([r["tokens_per_s_median"] for r in ours]))
            torch_med = float(np.median([r["tokens_per_s_median"] for r in theirs])) if theirs else None
            row[dtype] = {
                "ours_tokens_per_s": ours_med,
                "torch_tokens_per_s": torch_med,
                "ratio": ours_med / torch_med if theirs else None,
                "ours_min": min(r["tokens_per_s_min"] for r in ours),
                "ours_max": max(r["tokens_per_s_max"] for r in ours),
                "torch_min": min(r["tokens_per_s_min"] for r in theirs) if theirs else None,
                "torch_max": max(r["tokens_per_s_max"] for r in theirs) if theirs else None,
                "ours_first_step_s": float(np.median([r["first_step_s"] for r in ours])),
                "ours_mfu": float(np.median([r["mfu"] for r in ours])) if all("mfu" in r for r in ours) else None,
                "ours_compute_dtype": ours[0].get("compute_dtype"),
                "torch_autocast_bf16": theirs[0].get("autocast_bf16") if theirs else None,
                "ours_host_rss_peak_mib": max(r.get("host_rss_peak_mib", 0.0) for r in ours),
                # in the order the runs started: ours, torch, ours, torch, ... (ours alone without torch)
                "load_avg": [
                    r["load_avg_at_start"][0] for pair in (zip(ours, theirs) if theirs else zip(ours)) for r in pair
                ],
                "ours": ours,
                "torch": theirs,
            }
        results.append(row)
    return results


def cpu_line(cpu: dict[str, Any]) -> str:
    yes = {True: "yes", False: "no"}
    return (
        f"CPU: {cpu['model'] or 'unknown'} ({os.cpu_count()} CPUs; AVX-512 {yes[bool(cpu['avx512f'])]}, "
        f"AVX512_BF16 {yes[bool(cpu['avx512_bf16'])]}, AMX-BF16 {yes[bool(cpu['amx_bf16'])]})"
    )


def compare_report(
    results: list[dict[str, Any]], dtypes: list[str], cpu: dict[str, Any], torch_info: dict[str, Any], rounds: int
) -> str:
    short = {"float32": "fp32", "bfloat16": "bf16"}
    against = (
        f"vs torch {torch_info['torch']} (eager, {torch_info.get('threads', '?')} threads; bf16 = torch.autocast)"
        if torch_info
        else "(torch side not run)"
    )
    lines = [
        cpu_line(cpu),
        f"ours (JAX, this harness's train_step) {against}: tokens/s, medians of {rounds} "
        f"round(s) [min-max over every window]",
        f"  {'config':>11}"
        + "".join(f" {short[d] + ' ours':>24} {short[d] + ' torch':>24} {'ratio':>6}" for d in dtypes)
        + "  load averages (1 min, at each start)",
    ]
    for r in results:
        cells = []
        for d in dtypes:
            c = r[d]
            theirs = (
                (
                    f" {c['torch_tokens_per_s']:>8,.0f} [{c['torch_min']:,.0f}-{c['torch_max']:,.0f}]".rjust(25)
                    + f" {c['ratio']:>6.2f}"
                )
                if c["ratio"] is not None
                else f"{'-':>25} {'-':>6}"
            )
            cells.append(
                f" {c['ours_tokens_per_s']:>8,.0f} [{c['ours_min']:,.0f}-{c['ours_max']:,.0f}]".rjust(25) + theirs
            )
        loads = " | ".join(" ".join(f"{v:.1f}" for v in r[d]["load_avg"]) for d in dtypes)
        lines.append(f"  {r['config']:>11}" + "".join(cells) + "  " + loads)
    return "\n".join(lines)
