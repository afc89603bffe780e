"""What a run records while it trains: TensorBoard event files and a per-step JSON-lines log.

    runs/<name>/tensorboard/events.out.tfevents.*   # `uv run tensorboard --logdir runs`
    runs/<name>/metrics.jsonl                        # one JSON object a step (and one a validation)

Both carry the same scalars under the same names (TAGS); process 0 alone writes them. A resumed
run trains again the steps since its checkpoint, so each session first cuts the record back to
the step it resumes from: metrics.jsonl is truncated after that step's line (a line torn by a
kill is dropped with it), and the new event file starts with a SessionLog.START event at the
next step, which TensorBoard's readers take as "discard every event from this step on" (the
mechanism behind tensorboardX's purge_step). The events are written with the `tensorboard`
package's own writer: no TensorFlow, no tensorboardX.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from jaxgpt.checkpoints.layout import METRICS_FILE, TENSORBOARD_DIR  # noqa: F401 (the run directory's layout)

# tag: meaning. Per step unless said otherwise; docs/watching.md's table of tags is this one.
TAGS = {
    "train/loss": "training loss of the step (mean over its microbatches)",
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
        self.writer = EventFileWriter(str(logdir), flush_secs=flush_secs)
        # Whatever an interrupted session wrote past the checkpoint is discarded by the readers.
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=resume_step + 1,
                                              session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))
                                             for tag, v in values.items() if v is not None])
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def text(self, step: int, tag: str, markdown: str) -> None:
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=text_pb(tag, markdown)))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunLog:
    """Both records of a run; on every process but 0 each call does nothing."""

    def __init__(self, run_dir: Path, resume_step: int, *, enabled: bool) -> None:
        self.enabled = enabled
        if enabled:
            self.jsonl = MetricsLog(Path(run_dir) / METRICS_FILE, resume_step)
            self.tb = TensorBoardLog(Path(run_dir) / TENSORBOARD_DIR, resume_step)

    def configs(self, step: int, configs: dict[str, dict[str, Any]]) -> None:
        for name, cfg in configs.items() if self.enabled else ():
            self.tb.text(step, f"config/{name}", "```json\n" + json.dumps(cfg, indent=2) + "\n```")

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self.enabled:
            self.tb.scalars(step, values)
            # JSON has no NaN: a non-finite loss is written as null (TensorBoard shows it as NaN).
            finite = {k: v if v is None or math.isfinite(v) else None for k, v in values.items()}
            self.jsonl.write({"step": step, "time": round(time.time(), 3)} | finite)

    def flush(self) -> None:
        if self.enabled:
            self.tb.flush()
            self.jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            self.tb.close()
            self.jsonl.close()
