"""Every shipped 124M run started on this chip as shipped (global batch, lengths, optimiser), with stand-in
data: the built-in corpus for pretraining, GSM8K-format rows for fine-tuning and RL, random weights for
init_from. Two optimiser steps each (RL: one), the memory plan's line and the steps' losses kept."""
import json, subprocess, sys, time
from pathlib import Path
ROOT = Path.cwd()
W = Path(sys.argv[1]); W.mkdir(parents=True, exist_ok=True)
budget = float(sys.argv[2]) if len(sys.argv) > 2 else 400
t_end = time.monotonic() + budget
def shipped(run, name): return json.loads((ROOT / "runs" / run / name).read_text())
TINY = len(sys.argv) > 3  # a CPU rehearsal: the same runs at a stand-in's width and depth
def write(path, model, train):
    if TINY:
        model = {**model, "emb_dim": 64, "n_heads": 2, "n_layers": 2}
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.json").write_text(json.dumps(model, indent=1)); (path / "train.json").write_text(json.dumps(train, indent=1))
    return path
short = {"checkpoint_interval": 2, "validation_interval": 2, "validation_batches": 2}
runs = []
for name in ("gpt2-small-modern", "gpt2-small-2026"):
    t = {**shipped(name, "train.json"), "dataset": {"source": "builtin"}, "train_steps": 2, "gradient_accumulation_steps": 2, **short}
    runs.append(write(W / name, shipped(name, "model.json"), t))
fixture = [json.loads(l) for l in (ROOT / "tests/fixtures/tasks/gsm8k-test.jsonl").read_text().splitlines()]
(W / "instruction-data.json").write_text(json.dumps([{"instruction": r["question"], "input": "", "output": r["answer"]} for r in fixture * 8]))
sft = shipped("gpt2-alpaca", "train.json")
sft = {k: v for k, v in sft.items() if k not in ("init_from", "train_epochs")}
sft["dataset"] = {**sft["dataset"], "options": {**sft["dataset"]["options"], "paths": [str(W / "instruction-data.json")]}}
alpaca = write(W / "gpt2-alpaca", shipped("gpt2-alpaca", "model.json"), {**sft, "train_steps": 2, "checkpoint_interval": 2, "validation_interval": 2})
runs.append(alpaca)
tasks = W / "gpt2-rl" / "tasks"; tasks.mkdir(parents=True, exist_ok=True)
(tasks / "gsm8k-train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fixture * 4))
(tasks / "gsm8k-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fixture))
rl = shipped("gpt2-rl", "train.json")
rl = {**rl, "init_from": str(alpaca), "train_steps": 1, "checkpoint_interval": 1, "validation_interval": 1,
      "rl": {**rl["rl"], "prompts": {**rl["rl"]["prompts"], "path": "tasks/gsm8k-train.jsonl"},
             "validation": {**rl["rl"]["validation"], "path": "tasks/gsm8k-test.jsonl"}, "validation_samples": 2}}
runs.append(write(W / "gpt2-rl", shipped("gpt2-rl", "model.json"), rl))
keep = ("memory plan", "engine", "step 1/", "step 2/", "error", "Error", "fit", "does not", "complete", "val", "reward", "saved", "wrote", "resum", "from ")
import os
only = os.environ.get("FITS_ONLY", "").split(",")
for run in runs:
    if only != [""] and run.name not in only:
        continue
    left = t_end - time.monotonic()
    if left < 30:
        print(f"== {run.name}: skipped, budget spent"); continue
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "train.py", str(run), "--data-dir", str(W / "data")], capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        p = subprocess.CompletedProcess([], 124, out, "timed out")
    log = (p.stdout + p.stderr).splitlines()
    (W / f"{run.name}.log").write_text("\n".join(log))
    print(f"== {run.name}: exit {p.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    for line in log:
        if any(k in line for k in keep) and "hugepage" not in line.lower():
            print("   " + line[:400], flush=True)
    if p.returncode:
        print("   " + "\n   ".join(log[-5:]))
