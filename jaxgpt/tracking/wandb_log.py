"""Weights & Biases, when train.json has a "wandb" section: the record's scalars and the run's configs.

    runs/<name>/wandb.json    {"id": "<W&B run id>"}: every session of the run logs into that W&B run
    runs/<name>/wandb/        wandb's own files; an offline session's are offline-run-<time>-<id>/

RunLog (metrics.py) calls WandbLog on process 0 only, in the calls that write TensorBoard's events:
W&B gets what TensorBoard and metrics.jsonl get, at the same optimiser step (W&B's step). The
`wandb` package, an optional extra, is imported only here and only for a mode other than
"disabled"; check() finds it missing, or the mode or wandb.json bad, before anything compiles. A
resumed session sends nothing at or below its checkpoint's step (online, nor below the resumed W&B
run's last step); W&B keeps a step's first value. Offline sessions are separate folders with one
id, which `wandb sync` uploads in order. More: docs/watching.md "Weights & Biases".
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import string
from pathlib import Path
from typing import Any

from jaxgpt.checkpoints.layout import WANDB_FILE
from jaxgpt.config import TRAIN_FILE, ConfigError, WandbConfig
from jaxgpt.files import fsync

# WANDB_MODE overrides train.json's mode, as it does for every W&B integration ("dryrun" and "run"
# are wandb's old names for offline and online).
ENV_MODES = {"online": "online", "offline": "offline", "disabled": "disabled", "dryrun": "offline", "run": "online"}
# Seconds finish() waits for the last uploads; then the rest stays in runs/<name>/wandb/ for
# `wandb sync`. Without a bound an unreachable server would hold a crashed or stopped run open.
FINISH_TIMEOUT_S = 60.0
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a W&B run id without its reserved characters


def resolve_mode(cfg: WandbConfig) -> str:
    """The mode this session logs in: $WANDB_MODE if set, else train.json's."""
    env = os.environ.get("WANDB_MODE", "")
    if not env:
        return cfg.mode
    if env not in ENV_MODES:
        raise ConfigError(
            f"WANDB_MODE={env!r} must be one of online, offline, disabled "
            f"(it overrides {TRAIN_FILE} wandb.mode={cfg.mode!r})"
        )
    return ENV_MODES[env]


def check(run_dir: Path, cfg: WandbConfig | None) -> None:
    """Before anything compiles: the section's mode, the package, the run's wandb.json."""
    if cfg is None or resolve_mode(cfg) == "disabled":
        return
    try:
        importlib.import_module("wandb")
    except ImportError as e:
        raise ConfigError(
            f"{run_dir}/{TRAIN_FILE}: wandb: the wandb package is not installed ({e}); install it "
            f"with `uv sync --extra wandb`, or remove the section"
        ) from None
    read_id(run_dir)


def read_id(run_dir: Path) -> str | None:
    """The W&B run id of this run directory (None before its first session with W&B)."""
    path = Path(run_dir) / WANDB_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f'{path}: unreadable ({e}); it should hold {{"id": "<W&B run id>"}}: fix it, or '
            f"delete it to log into a new W&B run"
        ) from None
    run_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(run_id, str) or not _ID.match(run_id):
        raise ConfigError(
            f"{path}: id={run_id!r} is not a W&B run id (letters, digits, - and _); fix it, "
            f"or delete the file to log into a new W&B run"
        )
    return run_id


def write_id(run_dir: Path, run_id: str) -> None:
    """Atomically, and durably before the first step: a kill at any instant leaves the old file or the new."""
    path = Path(run_dir) / WANDB_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": run_id}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


class WandbLog:
    """One session's W&B run: started (or resumed) here, finished by close()."""

    def __init__(self, run_dir: Path, cfg: WandbConfig, resume_step: int) -> None:
        import wandb  # the optional extra: check() has made sure it imports

        run_dir = Path(run_dir).resolve()
        run_id = read_id(run_dir)
        if run_id is None:
            # wandb's own form (8 of a-z0-9), made here: its generator is not public API.
            run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            write_id(run_dir, run_id)
        try:
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                name=cfg.name or run_dir.name,
                group=cfg.group,
                tags=list(cfg.tags) or None,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                mode=resolve_mode(cfg),
                settings=wandb.Settings(finish_timeout=FINISH_TIMEOUT_S),
            )
        except Exception as e:  # wandb.errors.* and its service's own errors ("run ID ... is in use"): one line
            msg = " ".join(str(e).split())
            raise ConfigError(
                f"{run_dir}/{TRAIN_FILE}: wandb: cannot start the W&B run {run_id} "
                f"({type(e).__name__}: {msg}); `wandb login` sets an API key, mode 'offline' needs none"
            ) from None
        # Steps W&B holds already: the checkpoint's and those before it, and (online, resumed) what
        # its server reports; run.step is the next step it takes (0 offline, where nothing is known).
        self.floor = max(resume_step, self.run.step - 1)

    def configs(self, configs: dict[str, dict[str, Any]]) -> None:
        """The resolved configs as the run's config ({"model": ..., "train": ...}); a resumed
        session's replace the earlier ones (train.json may change between sessions)."""
        self.run.config.update(
            {name.removesuffix(".json"): cfg for name, cfg in configs.items()}, allow_val_change=True
        )

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        # One call per group of a step (training, validation, HellaSwag...): W&B joins them into the
        # step's row, sent when a later step arrives or at finish.
        if step > self.floor:
            self.run.log({tag: float(v) for tag, v in values.items() if v is not None}, step=step)

    def close(self, exit_code: int) -> None:
        """Finish the W&B run. 130, a stop with a checkpoint (Ctrl-C, SIGTERM), is marked as preempted:
        the next session resumes it."""
        if exit_code == 130:
            self.run.mark_preempting()
        self.run.finish(exit_code=exit_code)
