"""A run's record while it trains: runs/<name>/metrics.jsonl, and TensorBoard events beside it.

    runs/<name>/metrics.jsonl                        # the record: what the charts and any tool read
    runs/<name>/tensorboard/events.out.tfevents.*   # the same scalars for `uv run tensorboard --logdir runs`

metrics.jsonl holds one JSON object a line: one per step (TAGS' train/, optim/ and perf/ tags), per
validation (val/), per HellaSwag (hellaswag/) and CORE (core/) score, per target reached
(target/), per checkpoint written ({"step": N, "checkpoint": "<folder>"}) and per session start
({"step": N, "configs": {...}}). Every line has "step" and "time" (Unix seconds);
jaxgpt/tracking/history.py reads it back. Process 0 alone writes. A resumed session first cuts the
record back to its checkpoint's step (a line torn by a kill goes with them), and starts the
TensorBoard writer (tensorboardX, no TensorFlow) with purge_step at the next step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter

# tensorboardX warns on every non-finite scalar; a diverging step's loss is the trainer's to report
# (one line, and the record writes it as null), not a warning per tag and step on stderr.
logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)

from jaxgpt.checkpoints.layout import METRICS_FILE, TENSORBOARD_DIR  # noqa: E402 (after the logger is quieted)
from jaxgpt.config import WandbConfig  # noqa: E402
from jaxgpt.tracking import wandb_log  # noqa: E402 (imports wandb itself only when a WandbLog is made)

# tag: meaning. Per step unless said otherwise; docs/watching.md's table of tags is this one.
TAGS = {
    "train/loss": "training loss of the step (mean over its microbatches)",
    "train/loss_min": "the lowest of the step's microbatch losses",
    "train/loss_max": "the highest of the step's microbatch losses",
    "train/tokens": "training tokens seen after the step",
    "optim/lr": "learning rate the step's update used (optimizer muon: the Muon matrices')",
    "optim/lr_embed": "optimizer muon: the embeddings' AdamW learning rate (token embedding, positions)",
    "optim/lr_head": "optimizer muon: the untied output head's AdamW learning rate",
    "optim/lr_scalar": "optimizer muon: the norm scales' and biases' Adam learning rate",
    "optim/muon_momentum": "optimizer muon: Muon's momentum (warming up from muon.momentum_init)",
    "optim/grad_norm": "global L2 norm of the accumulated gradient before clipping (absent: step dropped)",
    "optim/clipped": "1 when that norm exceeded clipping_max_norm (the update was scaled down)",
    "optim/skipped": "1 when the step was dropped (a non-finite gradient; no update applied)",
    "perf/step_time_s": "seconds from the previous step's result to this one's (the first includes compiling)",
    "perf/tokens_per_s": "tokens of the step / perf/step_time_s",
    "perf/mfu": "model FLOPs utilisation: tokens/s x FLOPs per token / peak FLOP/s (mfu.py)",
    "val/loss": "validation loss, at each validation",
    "val/tokens": "tokens that validation scored",
    "target/steps": "train.json target_val_loss: optimiser steps to reach it (once, at that validation)",
    "target/tokens": "training tokens to reach it",
    "target/seconds": "training seconds to reach it (every session; validation and checkpoints excluded)",
    "hellaswag/acc": "HellaSwag accuracy (summed ending loss), when train.json hellaswag_interval is set",
    "hellaswag/acc_norm": "HellaSwag accuracy (mean ending loss), when train.json hellaswag_interval is set",
    "core/CORE": "DCLM's CORE (the mean of the tasks' centred accuracies), when train.json core_interval is set",
    "core/<task>": "one tag per CORE task (its label): that task's centred accuracy, at each CORE score",
}


class MetricsLog:
    """runs/<name>/metrics.jsonl: append-only; each line goes to the kernel in one write, so a
    kill leaves at most a torn last line, which the next session drops."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = Path(path)
        cut_back(self.path, resume_step)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(record, allow_nan=False) + "\n").encode())

    def flush(self) -> None:
        os.fsync(self.fd)  # at each checkpoint: the log is as durable as the checkpoint

    def close(self) -> None:
        os.close(self.fd)


def cut_back(path: Path, step: int) -> None:
    """Keep the lines of steps <= `step`; drop later ones and anything from a torn or
    unreadable line on (only the last line can be torn: the file is only appended to)."""
    if not path.exists():
        return
    data, keep = path.read_bytes(), 0
    for line in data.splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not line.endswith(b"\n") or not isinstance(record, dict) or not isinstance(record.get("step"), int):
            break
        if record["step"] > step:
            break
        keep += len(line)
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics.jsonl (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n"):
            out.append(json.loads(line))
    return out


class TensorBoardLog:
    """Scalar and text events under runs/<name>/tensorboard/, one event file per session."""

    def __init__(self, logdir: Path, resume_step: int, flush_secs: float = 5.0) -> None:
        # Whatever an interrupted session wrote past the checkpoint is discarded by the readers.
        self.writer = SummaryWriter(str(logdir), purge_step=resume_step + 1, flush_secs=flush_secs)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        now = time.time()
        for tag, v in values.items():
            if v is not None:
                self.writer.add_scalar(tag, float(v), step, walltime=now)

    def text(self, step: int, tag: str, markdown: str) -> None:
        self.writer.add_text(tag, markdown, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunLog:
    """The record and the event files of a run, and W&B when train.json asks for it (wandb_log.py);
    on every process but 0 each call does nothing."""

    def __init__(self, run_dir: Path, resume_step: int, *, enabled: bool, wandb: WandbConfig | None = None) -> None:
        self.enabled = enabled
        self.wandb: wandb_log.WandbLog | None = None
        if enabled:
            if wandb is not None and wandb_log.resolve_mode(wandb) != "disabled":
                # First: a W&B run that cannot start (no API key, no server) is an error that leaves
                # the record and the event files untouched.
                self.wandb = wandb_log.WandbLog(run_dir, wandb, resume_step)
            self.jsonl = MetricsLog(Path(run_dir) / METRICS_FILE, resume_step)
            self.tb = TensorBoardLog(Path(run_dir) / TENSORBOARD_DIR, resume_step)

    def configs(self, step: int, configs: dict[str, dict[str, Any]]) -> None:
        """The session's configs: a line of the record, and a text event per file."""
        for name, cfg in configs.items() if self.enabled else ():
            self.tb.text(step, f"config/{name}", "```json\n" + json.dumps(cfg, indent=2) + "\n```")
        self.event(step, configs=configs)
        if self.wandb is not None:
            self.wandb.configs(configs)

    def checkpoint(self, step: int, name: str) -> None:
        """A checkpoint was written at `step` (the record is then flushed as far as it)."""
        self.event(step, checkpoint=name)
        self.flush()

    def event(self, step: int, **fields: Any) -> None:
        """A line of the record that is no scalar (configs, checkpoints)."""
        if self.enabled:
            self.jsonl.write({"step": step, "time": round(time.time(), 3), **fields})

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self.enabled:
            self.tb.scalars(step, values)
            # JSON has no NaN: a non-finite loss is written as null (TensorBoard shows it as NaN).
            finite = {k: v if v is None or math.isfinite(v) else None for k, v in values.items()}
            self.jsonl.write({"step": step, "time": round(time.time(), 3)} | finite)
            if self.wandb is not None:
                self.wandb.scalars(step, values)  # after the record: it never has a step the record lacks

    def flush(self) -> None:
        if self.enabled:
            self.tb.flush()
            self.jsonl.flush()

    def close(self, exit_code: int = 0) -> None:
        """exit_code: the session's (0 done, 130 stopped with a checkpoint, else failed), for W&B's run state."""
        if self.enabled:
            self.tb.close()
            self.jsonl.close()
            if self.wandb is not None:
                self.wandb.close(exit_code)
