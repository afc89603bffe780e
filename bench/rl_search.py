"""The search behind runs/tiny-rl's leash: each setting of the grid trained from runs/tiny-instruct as
runs/tiny-rl is, then every built-in task scored greedily on its held-out questions; one CSV row a setting.

    uv run python -m bench.rl_search --out docs/log/rl-tiny-leash-search.csv            # the whole grid
    uv run python -m bench.rl_search --out s.csv --only 8x16-sft --cores 1 --steps 300      # one setting, one core

A setting is a name and the train.json keys it sets (GRID); everything else is runs/tiny-rl's. A setting
already in the CSV is skipped, so a search stopped half-way goes on where it stopped. Each run and its
evaluation is a process of its own (`train.py`, `evaluate.py --tasks builtin`), timed from outside.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("add", "larger", "reverse", "sort", "spell", "upper")

# name -> the changes to runs/tiny-rl/train.json ("rl.x" keys go into its rl section). Rows of 56 tokens (add's
# prompts are 47, its answers at most 8); every setting draws 192,000 samples: 750 steps of 16 x 16, 1,500 of
# 8 x 16 or 3,000 of 4 x 16 (fewer rows a step: more optimiser steps in about the same time). "sft": one fine-tuning row
# for every 16 samples; "kl": kl_coef 0.2.
ROWS = {
    "16x16": {"rl.prompts_per_step": 16, "train_steps": 750, "microbatch_size": 64, "gradient_accumulation_steps": 4}
}
ROWS["8x16"] = {"rl.prompts_per_step": 8, "train_steps": 1500, "microbatch_size": 64, "gradient_accumulation_steps": 2}
ROWS["4x16"] = {"rl.prompts_per_step": 4, "train_steps": 3000, "microbatch_size": 64, "gradient_accumulation_steps": 1}
SFT = {"16x16": {"rl.sft_rows": 16}, "8x16": {"rl.sft_rows": 8}, "4x16": {"rl.sft_rows": 4}}
KL = {"rl.kl_coef": 0.2}
GRID: dict[str, dict[str, Any]] = {
    "none-lr0.0003": {"learning_rate": 3e-4, **ROWS["16x16"]},  # the rate: three times runs/tiny-rl's
    "sft16-lr0.0003": {"learning_rate": 3e-4, **ROWS["16x16"], **SFT["16x16"]},
    "16x16-none": ROWS["16x16"],
    "16x16-sft": {**ROWS["16x16"], **SFT["16x16"]},
    "8x16-none": ROWS["8x16"],
    "8x16-sft": {**ROWS["8x16"], **SFT["8x16"]},
    "8x16-kl": {**ROWS["8x16"], **KL},
    "8x16-kl-sft": {**ROWS["8x16"], **KL, **SFT["8x16"]},
    "4x16-sft": {**ROWS["4x16"], **SFT["4x16"]},  # added after 8x16-sft: a quarter of the rows, four times the steps
    # The fine-tuning rows alone: prompts whose samples are all right (upper: pass@1 100% at temperature 1), so
    # every advantage is 0 and only the rows train; add held out as before (rows of 80 for upper's prompts).
    "8x16-sft-only": {
        **ROWS["8x16"],
        **SFT["8x16"],
        "rl.prompts": {"task": "builtin", "tasks": ["upper"]},
        "rl.validation": {"task": "builtin", "tasks": ["add"]},
        "rl.max_new_tokens": 12,
        "sequence_length": 80,
    },
}
# What the settings share (runs/tiny-rl's own values may have moved on since): no leash unless said.
BASE = {"learning_rate": 1e-4, "sequence_length": 56, "rl.kl_coef": 0.0, "rl.sft_rows": 0}
GRID = {name: {**BASE, **changes} for name, changes in GRID.items()}
COLUMNS = (
    "setting",
    "learning_rate",
    "kl_coef",
    "sft_rows",
    "prompts_per_step",
    "train_steps",
    "cores",
    "train_s",
    *(f"{t} (%)" for t in TASKS),
    "worst other task vs start (points)",
    "held-out add greedy by validation (%)",
    "rl/kl, last 100 steps",
    "rl/sft_loss, last 100 steps",
)


def train_json(changes: dict[str, Any], init_from: Path, steps: int | None) -> dict[str, Any]:
    """runs/tiny-rl's train.json with these changes, starting from `init_from`."""
    cfg = json.loads((ROOT / "runs" / "tiny-rl" / "train.json").read_text())
    cfg["init_from"] = str(init_from)
    for key, value in changes.items():
        if key.startswith("rl."):
            cfg["rl"][key[3:]] = value
        else:
            cfg[key] = value
    if steps is not None:
        cfg["train_steps"] = steps
    cfg["checkpoint_interval"] = cfg["validation_interval"] = max(1, cfg["train_steps"] // 3)
    return cfg


def scores(checkpoint: Path, prefix: list[str]) -> dict[str, float]:
    """evaluate.py --tasks builtin: each task's greedy pass@1 in %."""
    cmd = [*prefix, sys.executable, str(ROOT / "evaluate.py"), str(checkpoint), "--tasks", "builtin"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"^builtin-(\w+)\s+\d+\s+([0-9.]+)", out, re.M))
    assert set(found) == set(TASKS), out
    return {task: round(100 * float(found[task]), 1) for task in TASKS}


def series(run: Path, key: str) -> list[float]:
    """One key's values over the run's record (metrics.jsonl), in step order."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row[key] for row in sorted(rows, key=lambda r: r.get("step", 0)) if key in row]


def run_setting(name: str, args: argparse.Namespace, start: dict[str, float]) -> dict[str, Any]:
    changes = GRID[name]
    run = args.work / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "model.json").write_text((ROOT / "runs" / "tiny-rl" / "model.json").read_text())
    cfg = train_json(changes, args.init_from.resolve(), args.steps)
    (run / "train.json").write_text(json.dumps(cfg, indent=2))
    prefix = ["taskset", "-c", args.cores] if args.cores else []
    started = time.perf_counter()
    subprocess.run([*prefix, sys.executable, str(ROOT / "train.py"), str(run), "--restart"], cwd=ROOT, check=True)
    seconds = time.perf_counter() - started
    got = scores(run, prefix)
    others = [start[t] - got[t] for t in TASKS if t != "add"]
    tail = lambda key: round(float(np.mean(series(run, key)[-100:])), 4) if series(run, key) else ""  # noqa: E731
    return {
        "setting": name,
        "learning_rate": cfg["learning_rate"],
        "kl_coef": cfg["rl"].get("kl_coef", 0.0),
        "sft_rows": cfg["rl"].get("sft_rows", 0),
        "prompts_per_step": cfg["rl"]["prompts_per_step"],
        "train_steps": cfg["train_steps"],
        "cores": args.cores or "all",
        "train_s": round(seconds),
        **{f"{t} (%)": got[t] for t in TASKS},
        "worst other task vs start (points)": round(-max(others), 1) + 0.0,  # + 0.0: no "-0.0"
        "held-out add greedy by validation (%)": " ".join(f"{100 * v:.0f}" for v in series(run, "val/greedy")),
        "rl/kl, last 100 steps": tail("rl/kl"),
        "rl/sft_loss, last 100 steps": tail("rl/sft_loss"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the CSV (settings already in it are skipped)")
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(GRID), help="these settings (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="train_steps (default: the grid's)")
    parser.add_argument("--cores", default=None, help="taskset's CPU list for every process (default: all)")
    parser.add_argument("--init-from", type=Path, default=ROOT / "runs" / "tiny-instruct")
    parser.add_argument("--work", type=Path, default=Path("/tmp/jaxgpt-rl-search"), help="the runs' folders")
    args = parser.parse_args(argv)
    done = set()
    if args.out.is_file():
        done = {row["setting"] for row in csv.DictReader(args.out.open())}
    todo = [name for name in (args.only or GRID) if name not in done]
    start = scores(args.init_from, ["taskset", "-c", args.cores] if args.cores else [])
    print(f"start ({args.init_from}): {start}", flush=True)
    for name in todo:
        row = run_setting(name, args, start)
        print(row, flush=True)
        new = not args.out.is_file()
        with args.out.open("a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
