"""List a run's checkpoints: step, tokens, losses, which one `latest` and `best` name, and whether
each can be resumed from (its files checked against meta.json, as a resume checks them).

    uv run checkpointing.py runs/tiny            # one line per checkpoint, oldest first
    uv run checkpointing.py runs/tiny --json     # the same as JSON

It exits 1 when a checkpoint is damaged, 2 on bad input. Nothing is changed or loaded here (no JAX).
The code: jaxgpt/checkpoints/ (layout.py where a run's
checkpoints live, meta.json, finding, pruning, archiving, integrity, without JAX; store.py writing
and restoring them: safetensors weights, the Orbax optimiser state, atomically; gpt2.py GPT-2's
weights in and out). The layout and what a resume does: docs/checkpoints.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxgpt.checkpoints.layout import (
    CheckpointError,
    checkpoints_dir,
    list_checkpoints,
    read_meta,
    step_of,
    verify_checkpoint,
)
from jaxgpt.cli import command_parser, refuse


def _linked(run_dir: Path, name: str) -> Path | None:
    link = checkpoints_dir(run_dir) / name
    return link.resolve() if link.is_symlink() else None


def inventory(run_dir: Path) -> list[dict[str, Any]]:
    """One record per complete checkpoint of `run_dir`, oldest step first."""
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    latest, best = _linked(run_dir, "latest"), _linked(run_dir, "best")
    rows = []
    for ckpt in list_checkpoints(run_dir):
        problem = verify_checkpoint(ckpt)
        try:
            meta = read_meta(ckpt)
        except CheckpointError:
            meta = {"step": step_of(ckpt)}
        train = meta.get("train_loss") if isinstance(meta.get("train_loss"), dict) else {}
        rows.append(
            {
                "name": ckpt.name,
                "step": meta["step"],
                "tokens": meta.get("tokens_seen"),
                "train_loss": train.get("mean"),
                "val_loss": meta.get("val_loss"),
                "weights_only": bool(meta.get("weights_only")),
                "latest": ckpt.resolve() == latest,
                "best": ckpt.resolve() == best,
                "problem": problem,
            }
        )
    return rows


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def report(run_dir: Path, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{run_dir}: no checkpoint yet"
    lines = [f"{'checkpoint':<28} {'step':>8} {'tokens':>14} {'train':>8} {'val':>8}  "]
    for r in rows:
        marks = ", ".join(m for m in ("latest", "best") if r[m]) + (" weights only" if r["weights_only"] else "")
        state = "ok" if r["problem"] is None else f"DAMAGED: {r['problem']}"
        lines.append(
            f"{r['name']:<28} {r['step']:>8,} {_num(r['tokens'], ',d'):>14} {_num(r['train_loss'], '.4f'):>8} "
            f"{_num(r['val_loss'], '.4f'):>8}  {state}{' (' + marks + ')' if marks else ''}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory, e.g. runs/tiny")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        rows = inventory(args.run_dir)
    except CheckpointError as e:
        return refuse(e)
    print(json.dumps(rows, indent=2) if args.json else report(args.run_dir, rows))
    return 0 if all(r["problem"] is None for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
