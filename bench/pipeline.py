"""`python3 -m bench pipeline`: the README's whole workflow once on this machine's device, shortened, a row per stage.

    python3 -m bench pipeline --out pipeline --budget 540   # on an accelerator machine: its python3, no uv, no network
    uv run -m bench pipeline --cpu-smoke --out /tmp/p   # the same stages, shorter still, on any CPU (a test runs it)

Each stage is the command a user types, in a fresh process of this interpreter (one program holds a
TPU at a time), on copies of the shipped runs in a work folder with fewer steps: runs/a-to-a and
test_a_to_a.py; runs/tiny, test_generation.py; runs/tiny-instruct from it, evaluate.py --exact-match,
chat.py's one answer; runs/tiny-rl from that, evaluate.py --tasks builtin; a second copy of
tiny-instruct and of tiny-rl killed with SIGKILL after its first checkpoint and resumed, whose losses
must equal the uninterrupted run's bit for bit; serve.py's API in-process
(the app over the engine, FastAPI's test client: no socket); the export to transformers' layout. A
failing stage is one row, and the stages after it that need its checkpoint are skipped. Writes
<out>.json and <out>.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import gpu
from bench.gpu import run_logged

ROOT = Path(__file__).resolve().parent.parent

# train.json changes per run: (full check, --cpu-smoke)
SHORTER = {
    "a-to-a": ({}, {}),  # as shipped: it must learn to reproduce the stanza
    "tiny": ({"train_steps": 600}, {"train_steps": 60, "checkpoint_interval": 30, "validation_interval": 30}),
    "tiny-instruct": (  # every checkpoint kept: the resume stage kills its copy after the first
        {"train_epochs": None, "train_steps": 300, "checkpoint_interval": 100, "keep_last_checkpoints": 5},
        {"train_epochs": None, "train_steps": 20, "checkpoint_interval": 5, "keep_last_checkpoints": 5},
    ),
    "tiny-rl": (
        {"train_steps": 30, "checkpoint_interval": 10, "validation_interval": 15, "keep_last_checkpoints": 5},
        {"train_steps": 8, "checkpoint_interval": 2, "keep_last_checkpoints": 5},
    ),
}
SMOKE_RL = {"prompts_per_step": 2, "samples_per_prompt": 4, "validation_samples": 2}
SERVE = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from jaxgpt.serving import api
served = api.load(Path(sys.argv[1]), model_name=None, max_batch=4, max_queue=8)
served.worker.start()
with TestClient(api.create_app(served)) as http:
    body = {"model": served.name, "messages": [{"role": "user", "content": "Add 2 and 3."}], "max_tokens": 8,
            "temperature": 0}
    r = http.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    print(json.dumps({"status": r.status_code, "answer": r.json()["choices"][0]["message"]["content"]}))
"""


def _copy_run(name: str, work: Path, smoke: bool) -> None:
    """runs/<name> into the work folder, its train.json shortened (init_from keeps pointing at the sibling)."""
    run = work / name
    run.mkdir(parents=True)
    shutil.copy(ROOT / "runs" / name / "model.json", run / "model.json")
    train = json.loads((ROOT / "runs" / name / "train.json").read_text())
    for key, value in SHORTER[name][1 if smoke else 0].items():
        if value is None:
            train.pop(key, None)
        else:
            train[key] = value
    if smoke and "rl" in train:
        train["rl"] |= SMOKE_RL
        train |= {"microbatch_size": 8, "gradient_accumulation_steps": 1}
    (run / "train.json").write_text(json.dumps(train, indent=2))


def _stage(name: str, args: list[str], logs: Path, timeout: float) -> dict[str, Any]:
    """One command in a fresh process; its row (exit status, last line, seconds)."""
    rc, last, seconds = run_logged([sys.executable, *args], logs / f"{name}.log", timeout)
    status = "ok" if rc == 0 else f"failed (exit {rc}): {last[-200:]}"
    return {"stage": name, "command": " ".join(args), "status": status, "last": last, "s": seconds}


def _resume_stage(name: str, work: Path, data: Path, logs: Path, timeout: float) -> dict[str, Any]:
    """A second copy of run `name`, killed (SIGKILL) once its first checkpoint is written, then resumed;
    its per-step losses after that checkpoint against the uninterrupted run's: bit for bit."""
    a, b = work / name, work / f"{name}-resumed"  # a sibling: init_from's relative path holds
    b.mkdir()
    for file in ("model.json", "train.json"):
        shutil.copy(a / file, b / file)
    metas = gpu._metas(a)
    first = min(metas)  # the first checkpoint: B is killed once it has written it
    cmd = [sys.executable, str(ROOT / "train.py"), str(b), "--data-dir", str(data)]
    killed = gpu._kill_after_checkpoint(cmd, b, first, logs / f"resume-{name}-killed.log", os.environ.copy())
    rc, last, seconds = run_logged(cmd, logs / f"resume-{name}.log", timeout)
    row = {"stage": f"kill -9 and resume {name}", "command": " ".join(cmd[1:]), "s": seconds, "killed_at": killed}
    if rc != 0:
        return row | {"status": f"failed (exit {rc}): {last[-200:]}", "last": last}
    found = re.search(r"Resuming .* \(step (\d+)\)", (logs / f"resume-{name}.log").read_text())
    row["resumed_at"] = resumed = int(found.group(1)) if found else None
    if resumed is None or resumed >= max(metas):
        why = "the killed run had finished: nothing was resumed"
        return row | {"status": f"failed: {why}", "last": why}
    compared = gpu._compared(a, b, first, metas)
    same, n = compared["resume_bit_identical"], compared["resume_steps_compared"]
    verdict = f"resumed at step {resumed}; {n} steps after step {first}: " + (
        "bit-identical" if same else f"NOT identical, max |diff| {compared['resume_max_abs_diff']:.3g}"
    )
    return row | {"status": "ok" if same else "failed: " + verdict, "last": verdict, **compared}


def _stages(runs: dict[str, Path], work: Path, d: list[str]) -> list[tuple[str, str | None, list[str] | None]]:
    """The workflow's stages: (name, the run whose training it needs, the command; None: a resume stage)."""
    return [
        ("train a-to-a", None, ["train.py", str(runs["a-to-a"]), *d]),
        ("test_a_to_a.py", "a-to-a", ["test_a_to_a.py", str(runs["a-to-a"])]),
        ("train tiny", None, ["train.py", str(runs["tiny"]), *d]),
        ("test_generation.py", "tiny", ["test_generation.py", str(runs["tiny"])]),
        ("train tiny-instruct", "tiny", ["train.py", str(runs["tiny-instruct"]), *d]),
        ("evaluate --exact-match", "tiny-instruct", ["evaluate.py", str(runs["tiny-instruct"]), "--exact-match", *d]),
        (
            "chat.py one answer",
            "tiny-instruct",
            ["chat.py", str(runs["tiny-instruct"]), "--temperature", "0", "-p", "Add 2 and 3."],
        ),
        ("kill -9 and resume tiny-instruct", "tiny-instruct", None),
        ("train tiny-rl", "tiny-instruct", ["train.py", str(runs["tiny-rl"]), *d]),
        ("kill -9 and resume tiny-rl", "tiny-rl", None),
        ("evaluate --tasks builtin", "tiny-rl", ["evaluate.py", str(runs["tiny-rl"]), "--tasks", "builtin", *d]),
        ("serve.py API in-process", "tiny-instruct", ["-c", SERVE, str(runs["tiny-instruct"])]),
        (
            "export to transformers",
            "tiny-instruct",
            ["import_gpt2.py", "export", str(runs["tiny-instruct"]), str(work / "exported")],
        ),
    ]


def _wanted(stages: list[tuple[str, str | None, Any]], only: list[str] | None) -> set[str]:
    """The stages to run: those whose name contains one of `only` (all when None), with the trainings
    they need, transitively; an `only` that names no stage is a one-line error."""
    if only is None:
        return {name for name, _, _ in stages}
    names = [name for name, _, _ in stages]
    unknown = [o for o in only if not any(o in name for name in names)]
    if unknown:
        raise SystemExit(f"bench pipeline: --stages {','.join(unknown)} names no stage; the stages: {', '.join(names)}")
    needs = {name: need for name, need, _ in stages}
    wanted, todo = set(), [name for name in names if any(o in name for o in only)]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            if needs[name] is not None:
                todo.append(f"train {needs[name]}")
    return wanted


def pipeline(
    out: Path,
    *,
    cpu_smoke: bool = False,
    budget_s: float | None = None,
    only: list[str] | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Every stage in turn (module docstring) within `budget_s` seconds (None: no limit; a stage the
    budget does not reach is a skipped row); `only`: the stages whose names contain one of these, and
    the trainings they need (the rest are not rows); writes <out>.json and <out>.md; returns the rows."""
    clock = gpu.Clock(float("inf") if budget_s is None else budget_s)
    out = Path(out)
    logs = Path(f"{out}.logs")
    work, data = logs / "work", logs / "work" / "data"
    stages = _stages({name: work / name for name in SHORTER}, work, ["--data-dir", str(data)])
    wanted = _wanted(stages, only)  # a --stages that names no stage errs before the last logs go
    shutil.rmtree(logs, ignore_errors=True)
    work.mkdir(parents=True)
    for name in SHORTER:
        _copy_run(name, work, cpu_smoke)
    rows, trained = [], set()
    for name, needs, args in (stage for stage in stages if stage[0] in wanted):
        if needs is not None and needs not in trained:
            rows.append({"stage": name, "status": f"skipped: {needs} did not train"})
            continue
        timeout = min(600.0, clock.left())
        if timeout < 5:
            rows.append({"stage": name, "status": "skipped: time budget spent"})
            continue
        if args is None:
            row = _resume_stage(name.rsplit(" ", 1)[1], work, data, logs, timeout)
        else:
            row = _stage(name.replace(" ", "-").replace("/", "-"), args, logs, timeout) | {"stage": name}
        rows.append(row)
        if name.startswith("train ") and row["status"] == "ok":
            trained.add(name.removeprefix("train "))
        log(f"{name}: {row['status']} ({row['s']:.0f} s) {row['last'][:120]}")
    result = {"mode": "cpu-smoke" if cpu_smoke else "full", "stages": rows}
    shutil.rmtree(work, ignore_errors=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = ["| stage | status | s | last line |", "|---|---|---|---|"] + [
        f"| {r['stage']} | {r['status'][:80]} | {r.get('s', 0):.0f} | {r.get('last', '')[:100]} |" for r in rows
    ]
    Path(f"{out}.md").write_text("\n".join(table) + "\n")
    return result
