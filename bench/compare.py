"""`uv run -m bench compare`: our training step against PyTorch's on the same shapes.

Runs `uv run -m bench train --config X` and torch_reference.py --config X (eager PyTorch, in its
own venv) in fresh processes, alternating --rounds times per config, and reports ours / torch
of the medians with the 1-minute load average at each start. The reference script is not part
of this repository: --reference names it (default: $JAXGPT_TORCH_REFERENCE, else
../shared/bench/torch_reference.py beside the checkout), --torch-python its venv's python.
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

ROOT = Path(__file__).resolve().parent.parent
TORCH_REFERENCE = Path(os.environ.get("JAXGPT_TORCH_REFERENCE", ROOT.parent / "shared" / "bench" / "torch_reference.py"))
TORCH_PYTHON = Path.home() / "torchref" / "bin" / "python"


def bench_compare(configs: list[str], *, torch_python: Path = TORCH_PYTHON, reference: Path = TORCH_REFERENCE,
                  steps: int = 10, windows: int = 5, rounds: int = 1, model: list[str] | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Ours (with `model` KEY=VALUE overrides, as `train --model`) vs the torch reference per config, alternating fresh processes (ours, torch) `rounds`
    times so that a change in the machine's load hits both; the ratio is of the medians."""
    if not Path(torch_python).exists():
        raise BenchError(f"{torch_python} not found: set up the reference once with `python3 -m venv "
                         f"$HOME/torchref && $HOME/torchref/bin/pip install torch==2.13.0 numpy` "
                         f"(or pass --torch-python)")
    if not Path(reference).exists():
        raise BenchError(f"{reference} not found (pass --reference)")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        for name in configs:
            ours_runs, torch_runs = [], []
            for rnd in range(rounds):
                load = os.getloadavg()
                out = Path(tmp) / f"ours-{name}-{rnd}.json"
                cmd = [sys.executable, "-m", "bench", "train", "--config", name, "--steps", str(steps),
                       "--windows", str(windows), "--json", str(out), *[f"--model={m}" for m in model or []]]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
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
