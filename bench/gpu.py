"""The one-shot accelerator check behind `uv run -m bench gpu`: what a CPU machine cannot prove.

    python3 -m bench gpu --out gpu-check           # on the accelerator machine: its python3, no uv, no network
    uv run -m bench gpu --cpu-smoke --out /tmp/gc  # the same code paths on tiny shapes, on any CPU (a test runs it)

Each part runs in a fresh process of this interpreter (so each has the device to itself, its own
peak-memory figure, and a failure costs one row, not the check), within `--budget` seconds in all
(default 8 minutes; a part that would not fit is reported as skipped):

  (a) train step: GPT-2 124M (runs/gpt2-small's model: bfloat16 matmuls, microbatch 16 x 1024)
      through the full optimiser chain, `bench train` (train_step.StepRunner, as the trainer runs
      it): tokens/s, step time, MFU against the chip's bf16 dense peak (mfu.CHIP_PEAKS_TFLOPS;
      an unknown chip: a measured 8192^3 bf16 matmul), compile time, peak device memory; for
      k = 1 and k = 4, cuDNN vs XLA attention, scan_layers on and off; the first one also with
      --breakdown (forward / backward / optimiser update), which says where the time goes.
      The modern recipe's 124M (runs/gpt2-small-modern: rotary, QK-norm, ReLU², RMSNorm,
      soft-cap, Muon) beside it at k = 1 and k = 4, also with --breakdown: the update row is
      what Muon's Newton-Schulz iterations cost at this shape; and the 2026 recipe's
      (runs/gpt2-small-2026: context 2048 with sliding windows, value embeddings, embedding and
      U-net skips, Polar Express and NorMuon) at k = 1 with --breakdown: windows through
      cuDNN's local_window_size in a scanned model (one branch per window size).
  (b) training: a small GPT on the built-in corpus trained by train.py for a few hundred steps
      (checkpoints every 100), then a second run directory resumed from the first one's first
      checkpoint: the loss must fall, the checkpoints must be written and the resumed steps'
      losses must equal the uninterrupted run's bit for bit (on a GPU with
      XLA_FLAGS=--xla_gpu_deterministic_ops=true, which makes XLA's scatter-adds repeatable).
  (c) generation: KV-cached greedy decoding of the 124M shape, tokens/s at batch 1 and 8.

It writes <out>.json (every figure, every command) and <out>.md (the tables), and the logs of
every part under <out>.logs/.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxgpt.checkpoints.layout import list_checkpoints, step_of
from jaxgpt.tracking.history import read_record
from jaxgpt.training.mfu import chip_peak_flops

ROOT = Path(__file__).resolve().parent.parent  # the repository: commands run there
DETERMINISTIC = "--xla_gpu_deterministic_ops=true"


@dataclass(frozen=True)
class Plan:
    """The shapes and lengths of one check: the real one, or --cpu-smoke's."""

    cudnn: str  # the attention that stands for cuDNN's in (a): "cudnn"; the smoke's CPU: "auto"
    step_model: list[str]  # bench train --model overrides on runs/gpt2-small and runs/gpt2-small-modern
    step_train: list[str]  # ... and --train overrides
    accumulation: tuple[int, int]  # the two k of (a)
    steps: int  # timed steps per window in (a)
    windows: int
    small_model: dict[str, Any]  # (b): model.json
    small_train: dict[str, Any]  # (b): train.json
    generate_model: list[str]  # (c): bench generate --model overrides on GPT-2 124M
    new_tokens: int
    matmul_size: int  # the measured peak, for a chip not in the table
    part_seconds: dict[str, float] = field(default_factory=dict)  # least time each part needs
    part_cap_s: float = 240  # most time one process may take


GPU = Plan(
    cudnn="cudnn",
    step_model=[],
    step_train=[],
    accumulation=(1, 4),
    steps=10,
    windows=3,
    small_model={
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 256,
        "emb_dim": 384,
        "n_heads": 6,
        "n_layers": 6,
        "qkv_bias": True,
        "compute_dtype": "bfloat16",
        "scan_layers": True,
    },
    small_train={
        "dataset": {"source": "builtin"},
        "tokenizer": "bytes",
        "microbatch_size": 32,
        "train_steps": 300,
        "learning_rate": 2e-3,
        "warmup_percent": 5,
        "checkpoint_interval": 100,
        "validation_batches": "all",  # the whole split, as evaluate.py scores it: the round trip compares them
        "keep_last_checkpoints": 5,
        "seed": 0,
    },
    generate_model=["compute_dtype=bfloat16"],
    new_tokens=256,
    matmul_size=8192,
    part_seconds={"step": 60, "train": 120, "generate": 45},
    part_cap_s=240,
)
SMOKE = Plan(
    cudnn="auto",
    step_model=["n_layers=2", "emb_dim=32", "n_heads=2", "context_length=32", "vocab_size=257"],
    step_train=["microbatch_size=2"],
    accumulation=(1, 2),
    steps=1,
    windows=2,
    small_model={
        "architecture": "gpt2",
        "vocab_size": 257,
        "context_length": 32,
        "emb_dim": 32,
        "n_heads": 2,
        "n_layers": 2,
        "qkv_bias": True,
        "compute_dtype": "bfloat16",
        "scan_layers": True,
    },
    small_train={
        "dataset": {"source": "builtin"},
        "tokenizer": "bytes",
        "microbatch_size": 4,
        "train_steps": 30,
        "learning_rate": 1e-2,
        "warmup_percent": 5,
        "checkpoint_interval": 10,
        "validation_batches": "all",
        "keep_last_checkpoints": 5,
        "seed": 0,
    },
    generate_model=["n_layers=2", "emb_dim=32", "n_heads=2", "context_length=128", "vocab_size=257"],
    new_tokens=8,
    matmul_size=256,
    part_seconds={"step": 5, "train": 10, "generate": 5},
    part_cap_s=120,
)


class Clock:
    """The check's time budget."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def timeout(self, plan: Plan) -> float:
        return min(self.left(), plan.part_cap_s)


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run `cmd` in the repository, output to `log`; (exit status, last line of output, seconds)."""
    t0 = time.monotonic()
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(
                cmd,
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=max(timeout, 1.0),
                env=env or os.environ.copy(),
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    # A Python traceback's last lines may be JAX's note on filtered frames: the error's own line says why.
    errors = [line for line in lines if re.match(r"^(\w+\.)*\w*(Error|Exception|Exhausted)\b|^error:", line.strip())]
    last = "timed out" if rc == 124 else (errors[-1] if rc and errors else lines[-1] if lines else "")
    return rc, last.strip(), time.monotonic() - t0


def _bench(args: list[str], logs: Path, name: str, timeout: float) -> dict[str, Any]:
    """`python -m bench <args> --json` in a fresh process: its figures, or {"status": why not}."""
    json_path = logs / f"{name}.json"
    cmd = [sys.executable, "-m", "bench", *args, "--json", str(json_path)]
    rc, last, seconds = run_logged(cmd, logs / f"{name}.log", timeout=timeout)
    row: dict[str, Any] = {"command": " ".join(cmd[1:]), "wall_s": seconds}
    if rc == 0 and json_path.is_file():
        return row | {"status": "ok", **json.loads(json_path.read_text())}
    return row | {"status": f"failed (exit {rc}): {last[-300:]}"}


# ----------------------------------------------------------------------------- the chip


def probe_chip(logs: Path, clock: Clock) -> dict[str, Any]:
    """The device in a process of its own: platform, kind, count, memory, JAX; its bf16 peak if the table knows it."""
    code = (
        "import json, jax; d = jax.devices()[0]; s = d.memory_stats() or {}; print(json.dumps({'platform': "
        "d.platform, 'device_kind': d.device_kind, 'devices': jax.device_count(), 'memory_bytes': "
        "s.get('bytes_limit'), 'jax': jax.__version__}))"
    )
    rc, last, _ = run_logged([sys.executable, "-c", code], logs / "chip.log", timeout=min(clock.left(), 120))
    if rc != 0:
        return {"probe": f"failed (exit {rc}): {last[-200:]}"}
    chip = json.loads(last)
    peak = chip_peak_flops(chip["device_kind"])
    return chip | ({} if peak is None else {"peak_flops": peak[0], "peak_source": peak[1]})


# ----------------------------------------------------------------------------- (a) train step


GPT2, MODERN, NEW = "runs/gpt2-small", "runs/gpt2-small-modern", "runs/gpt2-small-2026"


def variants(plan: Plan, platform: str) -> list[tuple[str, str, Any, Any, bool, int, bool, int | None]]:
    """(a)'s rows, the headline first (the budget may not reach the last ones): (run, attention, remat,
    loss_chunk, scan_layers, k, breakdown, microbatch_size); remat, loss_chunk and microbatch_size
    None: the run's own."""
    k1, k4 = plan.accumulation
    if platform == "tpu":  # splash attention ("auto") against XLA's; 16 GiB: remat and loss chunks
        chunk = 4096
        # 16 x 1024 at k = 1 needs remat on 16 GiB (no remat: 22 GB of temporaries); "attention" keeps
        # the splash kernel's residuals (the fastest policy there). The 2026 recipe's 16 x 2048 runs
        # as 2 microbatches of 8 (12.5 GiB with "full"). One --breakdown: its programs cost a minute.
        return [
            (GPT2, "auto", "attention", chunk, True, k1, True, None),
            (GPT2, "xla", "full", chunk, True, k1, False, None),
            (MODERN, "auto", "full", chunk, True, k1, False, None),
            (NEW, "auto", "full", chunk, True, 2 * k1, False, 8),
            (GPT2, "auto", "full", chunk, True, k1, False, None),
        ]
    cudnn = plan.cudnn
    return [
        (GPT2, cudnn, None, None, True, k1, True, None),
        (MODERN, cudnn, None, None, True, k1, True, None),
        (NEW, cudnn, None, None, True, k1, True, None),
        (GPT2, cudnn, None, None, True, k4, False, None),
        (GPT2, "xla", None, None, True, k1, False, None),
        (GPT2, cudnn, None, None, False, k1, False, None),
        (MODERN, cudnn, None, None, True, k4, False, None),
    ]


def step_rows(plan: Plan, logs: Path, clock: Clock, chip: dict[str, Any], platform: str) -> list[dict[str, Any]]:
    # Every row leaves (b) and (c) the least time they need: a slow compile costs rows of (a), never (b) or (c).
    later = plan.part_seconds["train"] + 2 * plan.part_seconds["generate"]
    rows = []
    for run, attention, remat, chunk, scan, k, breakdown, B in variants(plan, platform):
        runtime = ("" if remat is None else f" remat={str(remat).lower()}") + (f" loss_chunk={chunk}" if chunk else "")
        rows_ = "" if B is None else f" microbatch={B}"
        label = f"{Path(run).name} attention={attention}{runtime} scan_layers={str(scan).lower()}{rows_} k={k}"
        reserve = later
        if clock.left() - reserve < plan.part_seconds["step"]:
            rows.append({"label": label, "run": run, "status": "skipped: time budget spent"})
            continue
        args = [
            "train",
            run,
            "--steps",
            str(plan.steps),
            "--windows",
            str(plan.windows),
            "--warmup",
            "2",
            "--no-matmul",
            "--train",
            f"gradient_accumulation_steps={k}",
            "--model",
            f"attention={attention}",
            "--model",
            f"scan_layers={str(scan).lower()}",
            *([] if remat is None else [f"--model=remat={json.dumps(remat)}"]),
            *([] if chunk is None else [f"--model=loss_chunk={chunk}"]),
            *[f"--model={m}" for m in plan.step_model],
            *[f"--train={t}" for t in plan.step_train],
            *([] if B is None else [f"--train=microbatch_size={B}"]),
        ]
        row = _bench(
            args + (["--breakdown"] if breakdown else []),
            logs,
            f"step-{len(rows)}",
            min(clock.timeout(plan), clock.left() - reserve),
        )
        row |= {"label": label, "run": run, "attention": attention, "scan_layers": scan, "k": k, "remat": remat}
        if row["status"] == "ok":
            _mfu(row, chip, plan, logs, clock)
        rows.append(row)
    return rows


def _mfu(row: dict[str, Any], chip: dict[str, Any], plan: Plan, logs: Path, clock: Clock) -> None:
    """The row's MFU against the chip's bf16 dense peak: the table's, else one measured once."""
    if "peak_flops" not in chip:
        chip.update(device_kind=row.get("device_kind"), platform=row.get("platform"))
        if row.get("chip_peak_bf16_flops"):
            chip.update(peak_flops=row["chip_peak_bf16_flops"], peak_source=row["chip_peak_source"])
        else:
            chip.update(_measured_peak(plan.matmul_size, logs, clock))
    achieved = row["tokens_per_s_median"] * row["flops_per_token"]
    row["achieved_tflops"] = achieved / 1e12
    row["mfu"] = achieved / chip["peak_flops"] if chip.get("peak_flops") else None


def _measured_peak(size: int, logs: Path, clock: Clock) -> dict[str, Any]:
    code = (
        "import json; from bench import train_step; "
        f"print(json.dumps(train_step.matmul_flops({size}, repeats=10, dtype='bfloat16')))"
    )
    rc, last, _ = run_logged([sys.executable, "-c", code], logs / "matmul-peak.log", timeout=min(clock.left(), 120))
    if rc != 0:
        return {"peak_flops": None, "peak_source": f"measuring failed: {last[-200:]}"}
    return {"peak_flops": float(last), "peak_source": f"measured: best {size}^3 bf16 matmul (x 2 {size}^3 FLOPs)"}


# ----------------------------------------------------------------------------- (b) training + resume


def training(plan: Plan, work: Path, logs: Path, clock: Clock, on_gpu: bool) -> dict[str, Any]:
    """Train run A to the end, its checkpoints evaluated; run B killed after its first checkpoint and
    resumed; their losses compared."""
    if clock.left() < plan.part_seconds["train"]:
        return {"status": "skipped: time budget spent"}
    env = os.environ.copy()
    if on_gpu:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {DETERMINISTIC}".strip()
    data = work / "data"
    a, b = work / "run-a", work / "run-b"
    for run in (a, b):
        run.mkdir(parents=True)
        (run / "model.json").write_text(json.dumps(plan.small_model, indent=2))
        (run / "train.json").write_text(json.dumps(plan.small_train, indent=2))
    train = [sys.executable, str(ROOT / "train.py")]
    cmd_a, cmd_b = [*train, str(a), "--data-dir", str(data)], [*train, str(b), "--data-dir", str(data)]
    rc, last, a_s = run_logged(cmd_a, logs / "train-a.log", clock.timeout(plan), env)
    if rc != 0 and on_gpu and "nknown flag" in (logs / "train-a.log").read_text():  # an XLA without that flag
        env["XLA_FLAGS"] = env["XLA_FLAGS"].replace(DETERMINISTIC, "").strip()
        shutil.rmtree(a / "checkpoints", ignore_errors=True)
        rc, last, a_s = run_logged(cmd_a, logs / "train-a.log", clock.timeout(plan), env)
    result: dict[str, Any] = {"xla_flags": env.get("XLA_FLAGS", ""), "run_a_s": a_s}
    if rc != 0:
        return result | {"status": f"run A failed (exit {rc}): {last[-300:]}"}
    metas_a = _metas(a)
    first = min(s for s, m in metas_a.items() if not m["_pruned"])
    result["round_trip"] = round_trip(metas_a, data, logs, clock, plan)
    # Run B: the same run, killed (SIGKILL) once its first checkpoint is written, then resumed.
    killed = _kill_after_checkpoint(cmd_b, b, first, logs / "train-b-killed.log", env)
    rc, last, b_s = run_logged(cmd_b, logs / "train-b.log", clock.timeout(plan), env)
    result |= {"run_b_s": b_s, "killed_at": killed}
    if rc != 0:
        return result | {"status": f"run B (resume) failed (exit {rc}): {last[-300:]}"}
    return result | _compared(a, b, first, metas_a)


def _compared(a: Path, b: Path, first: int, metas_a: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Run A's losses and checkpoints, and B's per-step losses after `first` against A's (metrics.jsonl)."""
    loss_a = dict(zip(*read_record(a).series("train/loss")))
    loss_b = dict(zip(*read_record(b).series("train/loss")))
    pairs = [(loss_a[s], loss_b[s]) for s in sorted(loss_b) if s > first and s in loss_a]
    diff = max((abs(x - y) for x, y in pairs), default=float("nan"))
    losses = [loss_a[s] for s in sorted(loss_a)]
    head, tail = losses[:10], losses[-10:]
    return {
        "status": "ok",
        "checkpoints_a": sorted(metas_a),
        "checkpoints_b": sorted(_metas(b)),
        "resumed_from": first,
        "steps": len(losses),
        "loss_first10": sum(head) / len(head),
        "loss_last10": sum(tail) / len(tail),
        "loss_falls": sum(tail) < sum(head),
        "val_loss": {s: metas_a[s].get("val_loss") for s in sorted(metas_a)},  # None: an RL run's
        "tokens_per_s": metas_a[max(metas_a)].get("throughput_tokens_per_s"),
        "resume_steps_compared": len(pairs),
        "resume_bit_identical": bool(pairs) and all(x == y for x, y in pairs),
        "resume_max_abs_diff": diff,
    }


def round_trip(metas: dict[int, dict[str, Any]], data: Path, logs: Path, clock: Clock, plan: Plan) -> list[dict]:
    """evaluate.py, in a fresh process, on run A's first and last checkpoints: the validation loss
    training logged there, within 1e-3 (the small run validates on its whole split, as evaluate.py scores)."""
    rows = []
    for step in sorted({min(metas), max(metas)}):
        meta = metas[step]
        if meta["_pruned"]:
            continue
        cmd = [sys.executable, str(ROOT / "evaluate.py"), meta["_dir"], "--data-dir", str(data)]
        rc, last, seconds = run_logged(cmd, logs / f"evaluate-{step}.log", min(clock.left(), plan.part_cap_s))
        found = re.search(r"loss ([\d.]+) \|", (logs / f"evaluate-{step}.log").read_text())
        if rc != 0 or found is None:
            rows.append({"step": step, "status": f"failed (exit {rc}): {last[-200:]}"})
            continue
        loss = float(found.group(1))
        diff = abs(loss - meta["val_loss"])
        rows.append({"step": step, "status": "ok", "logged": meta["val_loss"], "evaluated": loss, "diff": diff})
    return rows


def _kill_after_checkpoint(cmd: list[str], run: Path, step: int, log: Path, env: dict[str, str]) -> int | None:
    """Start `cmd`; SIGKILL it once run's step-`step` checkpoint is complete (layout.list_checkpoints: renamed
    into place; a kill while it is still .tmp-<name> leaves none, and the resume would start over); the
    step it had logged then."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if any(step_of(c) == step for c in list_checkpoints(run)):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.2)
        proc.wait()
    steps = read_record(run).series("train/loss")[0] if (run / "metrics.jsonl").is_file() else []
    return max(steps, default=None)


def _metas(run: Path) -> dict[int, dict[str, Any]]:
    """meta.json of every checkpoint of a run (pruned ones from history/), by step."""
    root = run / "checkpoints"
    out: dict[int, dict[str, Any]] = {}
    for meta in [*(root / "history").glob("*.json"), *root.glob("*/meta.json")]:  # folders win over history
        pruned = meta.parent.name == "history"
        if not pruned and (meta.parent.name.startswith(".") or meta.parent.is_symlink()):
            continue  # temp folders, latest/best links
        m = json.loads(meta.read_text())
        out[int(m["step"])] = m | {"_dir": str(meta.parent), "_pruned": pruned}
    return out


# ----------------------------------------------------------------------------- (c) generation


def generation(plan: Plan, logs: Path, clock: Clock) -> list[dict[str, Any]]:
    rows = []
    for batch in (1, 8):
        if clock.left() < plan.part_seconds["generate"]:
            rows.append({"batch_size": batch, "status": "skipped: time budget spent"})
            continue
        args = [
            "generate",
            "--single",
            "--cached-only",
            "--repeats",
            "1",
            "--batch-size",
            str(batch),
            "--new-tokens",
            str(plan.new_tokens),
            *[f"--model={m}" for m in plan.generate_model],
        ]
        rows.append(_bench(args, logs, f"generate-b{batch}", clock.timeout(plan)) | {"batch_size": batch})
    return rows


# ----------------------------------------------------------------------------- the whole check


def bench_gpu(out: Path, *, cpu_smoke: bool = False, budget_s: float = 480.0, log: Any = print) -> dict[str, Any]:
    """Run (a), (b), (c) within `budget_s`; write <out>.json and <out>.md; return the figures."""
    plan = SMOKE if cpu_smoke else GPU
    clock = Clock(budget_s)
    out = Path(out)
    logs = Path(f"{out}.logs")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    work = logs / "work"
    chip: dict[str, Any] = {}
    log(f"accelerator check ({'cpu smoke' if cpu_smoke else 'full'}), budget {budget_s:.0f} s; logs in {logs}")
    chip.update(probe_chip(logs, clock))
    steps = step_rows(plan, logs, clock, chip, chip.get("platform", "?"))
    train = training(plan, work, logs, clock, chip.get("platform") == "gpu")
    gen = generation(plan, logs, clock)
    shutil.rmtree(work, ignore_errors=True)  # checkpoints and the dataset: the figures are in the JSON
    result = {
        "mode": "cpu-smoke" if cpu_smoke else "full",
        "python": platform.python_version(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget_s": budget_s,
        "elapsed_s": budget_s - clock.left(),
        "chip": chip,
        "train_step": steps,
        "training": train,
        "generation": gen,
    }
    result["versions"] = next((r["versions"] for r in steps if "versions" in r), {})
    Path(f"{out}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    Path(f"{out}.md").write_text(report(result))
    log(report(result))
    return result


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _step_lines(r: dict[str, Any]) -> list[str]:
    """The title, the chip line and part (a)'s table: one row per train-step variant."""
    chip = r["chip"]
    peak = chip.get("peak_flops")
    lines = [
        f"### Accelerator check ({r['mode']}, {r['time_utc']})",
        "",
        f"Device: {chip.get('device_kind', '?')} ({chip.get('platform', '?')}, "
        f"{_num(chip.get('memory_bytes') and chip['memory_bytes'] / 2**30, '.2f')} GiB); bf16 dense peak "
        f"{_num(peak and peak / 1e12, '.4g')} TFLOP/s ({chip.get('peak_source', '-')}); "
        f"python {r['python']}{''.join(f', {k} {v}' for k, v in r['versions'].items())}; "
        f"{r['elapsed_s']:.0f} s of a {r['budget_s']:.0f} s budget.",
        "",
        f"(a) train step, {'tiny shapes' if r['mode'] == 'cpu-smoke' else 'GPT-2 124M, microbatch 16 x 1024'}, "
        "bf16 matmuls, full optimiser chain:",
        "",
        "| variant | tokens/s | step ms | MFU | TFLOP/s | compile s | peak device GiB | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["train_step"]:
        mem = (row.get("device_memory") or {}).get("peak_bytes_in_use")
        lines.append(
            f"| {row['label']} | {_num(row.get('tokens_per_s_median'), ',.0f')} | "
            f"{_num(row.get('step_s_median') and 1e3 * row['step_s_median'], '.1f')} | "
            f"{_num(row.get('mfu') and 100 * row['mfu'], '.1f')}{'%' if row.get('mfu') else ''} | "
            f"{_num(row.get('achieved_tflops'), '.4g')} | {_num(row.get('compile_s'), '.1f')} | "
            f"{_num(mem and mem / 2**30, '.1f')} | {row['status']} |"
        )
    return lines


def _breakdown_lines(r: dict[str, Any]) -> list[str]:
    """Part (a)'s where-the-time-goes paragraphs, one for each row that ran with --breakdown."""
    lines: list[str] = []
    for row in r["train_step"]:  # one row of each recipe: the optimiser update is where Muon's cost shows
        bd = row.get("breakdown")
        if bd:
            lines += [
                "",
                f"Where the time goes ({row['label']}, {row.get('optimizer')}, per microbatch): forward "
                f"{bd['forward_ms']:.1f} ms, forward + backward {bd['forward_backward_ms']:.1f} ms, "
                f"optimiser update {bd['optimizer_update_ms']:.1f} ms, whole step "
                f"{bd['train_step_ms_per_microbatch']:.1f} ms.",
            ]
    return lines


def _training_lines(t: dict[str, Any]) -> list[str]:
    """Part (b): the training run's loss and the resumed run's bit-identity, or why it did not run."""
    lines = ["", "(b) training run and resume:", ""]
    if t.get("status") == "ok":
        lines += [
            f"- {t['steps']} steps, checkpoints at {t['checkpoints_a']}; loss {t['loss_first10']:.3f} "
            f"(first 10 steps) -> {t['loss_last10']:.3f} (last 10): "
            f"{'falls' if t['loss_falls'] else 'DOES NOT FALL'}; {t['tokens_per_s']:,.0f} tokens/s",
            f"- killed (SIGKILL) after its step-{t['resumed_from']} checkpoint, at step {t.get('killed_at')}, and "
            f"resumed from step {t['resumed_from']}: {t['resume_steps_compared']} steps compared, "
            f"{'bit-identical' if t['resume_bit_identical'] else 'NOT identical'} (max |diff| "
            f"{t['resume_max_abs_diff']:.3g}); XLA_FLAGS={t['xla_flags'] or '(none)'}",
        ]
        for row in t.get("round_trip", []):
            lines.append(
                f"- evaluate.py on the step-{row['step']} checkpoint, in a fresh process: "
                + (
                    f"loss {row['evaluated']:.4f} where training logged {row['logged']:.4f} (|diff| "
                    f"{row['diff']:.2g}: {'equal' if row['diff'] <= 1e-3 else 'NOT EQUAL'})"
                    if row["status"] == "ok"
                    else row["status"]
                )
            )
    else:
        lines.append(f"- {t.get('status')}")
    return lines


def _generation_lines(r: dict[str, Any]) -> list[str]:
    """Part (c)'s table: KV-cached decoding tokens/s per batch size."""
    lines = [
        "",
        f"(c) KV-cached generation through the engine, {'tiny shapes' if r['mode'] == 'cpu-smoke' else 'GPT-2 124M'} "
        "(greedy):",
        "",
        "| batch | dtype | steps per dispatch | tokens/s | decode compile s | status |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["generation"]:
        lines.append(
            f"| {row['batch_size']} | {row.get('compute_dtype', '-')} | {row.get('burst', '-')} | "
            f"{_num(row.get('cached_tok_s'), ',.0f')} | {_num(row.get('compile_step_s'), '.1f')} | {row['status']} |"
        )
    return lines


def report(r: dict[str, Any]) -> str:
    """The <out>.md text: the check's figures as markdown, parts (a), (b) and (c) in turn."""
    lines = _step_lines(r) + _breakdown_lines(r) + _training_lines(r["training"]) + _generation_lines(r)
    return "\n".join(lines) + "\n"
