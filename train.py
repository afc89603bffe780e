"""Train a run directory.

    uv run train.py runs/a-to-a             # train, or resume from runs/a-to-a/checkpoints/latest
    uv run train.py runs/a-to-a --restart   # start over; old checkpoints are moved aside, not deleted

`runs/<name>/model.json` and `runs/<name>/train.json` describe the run completely (see README).
The first Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint and exits; a second
one aborts at once. Rerunning resumes from the latest checkpoint with the same step, learning
rate, next batch and dropout keys as if never interrupted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import checkpointing as ckpt
from config import ConfigError, ModelConfig, TrainConfig, load_run_configs, to_dict
from data import BatchSampler, Dataset, DataError, open_dataset
from download_dataset import default_data_root, prepare_dataset
from tokenizer import TokenizerError

INPUT_ERRORS = (ConfigError, DataError, TokenizerError, ckpt.CheckpointError)


@dataclass
class Run:
    """Everything validated before any compile: configs, dataset, samplers, resume point."""

    run_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    dataset: Dataset
    train_batches: BatchSampler
    val_batches: BatchSampler
    total_steps: int
    resume_from: Path | None


@dataclass
class Window:
    """Per-step statistics since the last checkpoint: what meta.json and the charts record."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # mean over the step's microbatches
    micro_losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    grad_norms: list[float | None] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)


# ----------------------------------------------------------------------------- set-up


def prepare_run(run_dir: Path, *, data_root: Path, restart: bool) -> Run:
    """Load and cross-check configs, dataset and checkpoint. Raises INPUT_ERRORS, one line each."""
    model_cfg, train_cfg = load_run_configs(run_dir)
    ds_path = prepare_dataset(train_cfg.dataset.source, train_cfg.tokenizer, data_root,
                              options=train_cfg.dataset.options)
    dataset = open_dataset(ds_path)
    _check_dataset(run_dir, model_cfg, train_cfg, dataset)
    seq_len = train_cfg.seq_len(model_cfg)
    common = dict(microbatch_size=train_cfg.microbatch_size, seq_len=seq_len,
                  seed=train_cfg.seed, targets=train_cfg.targets)
    train_batches = BatchSampler(dataset.train, shuffle=True, **common)
    val_batches = BatchSampler(dataset.val, shuffle=False, **common)
    if train_batches.n_windows < train_cfg.sequences_per_step:
        raise DataError(
            f"{ds_path}: train split has {train_batches.n_windows} sequences of {seq_len} tokens, "
            f"fewer than one optimiser step needs ({train_cfg.sequences_per_step})")
    if restart:
        moved = ckpt.move_aside(run_dir)
        if moved:
            print(f"Moved old checkpoints aside to {moved}")
    resume_from = ckpt.latest_checkpoint(run_dir)
    if resume_from is not None:
        ckpt.read_meta(resume_from)  # a corrupt checkpoint is reported now, not after JAX starts
        _check_resume(resume_from, model_cfg, train_cfg)
    return Run(run_dir, model_cfg, train_cfg, dataset, train_batches, val_batches,
               train_cfg.total_steps(model_cfg), resume_from)


def _check_dataset(run_dir: Path, model: ModelConfig, train: TrainConfig, ds: Dataset) -> None:
    manifest = ds.path / "manifest.json"
    if ds.tokenizer != train.tokenizer:
        raise DataError(f"{manifest}: dataset tokenizer {ds.tokenizer!r} does not match "
                        f"{run_dir}/train.json tokenizer={train.tokenizer!r}")
    if model.vocab_size < ds.vocab_size:
        raise ConfigError(f"{run_dir}/model.json: vocab_size={model.vocab_size} is smaller than the "
                          f"{ds.tokenizer} tokenizer's {ds.vocab_size} ids ({manifest})")
    if ds.max_token_id >= model.vocab_size:
        raise DataError(f"{manifest}: token id {ds.max_token_id} is out of range for "
                        f"{run_dir}/model.json vocab_size={model.vocab_size}")


# Changing these mid-run would silently change which batches come next or what the weights mean.
_DATA_ORDER_KEYS = ("dataset", "tokenizer", "targets", "sequence_length", "microbatch_size",
                    "gradient_accumulation_steps", "seed")


def _check_resume(ckpt_dir: Path, model: ModelConfig, train: TrainConfig) -> None:
    saved = ckpt.read_configs(ckpt_dir)
    old_model, old_train = saved.get("model.json"), saved.get("train.json")
    if old_model is not None and old_model != to_dict(model):
        diff = {k: (old_model.get(k), v) for k, v in to_dict(model).items() if old_model.get(k) != v}
        key, (was, now) = next(iter(diff.items()))
        raise ConfigError(f"model.json: {key}={now!r} differs from checkpoint {ckpt_dir.name} "
                          f"({key}={was!r}); use --restart to train a new model")
    if old_train is not None:
        for key in _DATA_ORDER_KEYS:
            if old_train.get(key) != to_dict(train)[key]:
                raise ConfigError(f"train.json: {key}={to_dict(train)[key]!r} differs from checkpoint "
                                  f"{ckpt_dir.name} ({key}={old_train.get(key)!r}), which would change "
                                  f"the data order on resume; use --restart")
        changed = [k for k, v in to_dict(train).items() if old_train.get(k) != v]
        if changed:
            print(f"Note: train.json changed since {ckpt_dir.name}: {', '.join(changed)}")


# ----------------------------------------------------------------------------- the loop


class StopFlag:
    """First SIGINT/SIGTERM asks the loop to checkpoint and stop; the second aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._old = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nStopping: finishing this step and writing a checkpoint "
              "(press Ctrl-C again to abort without saving).", file=sys.stderr, flush=True)


def train(run: Run) -> int:
    # jax and the model stack are imported here so that every input error above is reported
    # before JAX starts up, let alone compiles.
    import jax
    from tqdm import tqdm

    import charts
    from model import build_model
    from optim import clip_flag, make_optimizer, make_schedule
    from step import eval_step, step_key, train_step

    cfg, mcfg = run.train_cfg, run.model_cfg
    k, tokens_per_step = cfg.gradient_accumulation_steps, cfg.tokens_per_step(mcfg)
    model = build_model(mcfg, seed=cfg.seed)
    optimizer = make_optimizer(model, cfg, run.total_steps)
    schedule = make_schedule(cfg, run.total_steps)
    start, best, elapsed = 0, None, 0.0
    if run.resume_from is not None:
        meta = ckpt.load_checkpoint(run.resume_from, model, optimizer)
        start, best, elapsed = meta["step"], meta.get("best_loss"), meta.get("elapsed_s", 0.0)
        print(f"Resuming {run.run_dir} from {run.resume_from.name} (step {start})")
    if start >= run.total_steps:
        print(f"Nothing to do: {run.run_dir} already trained {start}/{run.total_steps} steps.")
        return 0

    def validate() -> float:
        total = 0.0
        for i in range(cfg.validation_batches):
            x, y = run.val_batches.microbatch(i)
            total += eval_step(model, jax.device_put(x), jax.device_put(y))
        return float(total) / cfg.validation_batches

    def checkpoint(done: int, window: Window, stats: dict, val: float | None) -> Path:
        nonlocal best
        score = val if val is not None else float(np.mean(window.losses))
        is_best = best is None or score < best
        best = score if is_best else best
        meta = _meta(run, done, window, stats, val, best, is_best, elapsed, schedule)
        path = ckpt.save_checkpoint(run.run_dir, model, optimizer, meta,
                                    {"model.json": to_dict(mcfg), "train.json": to_dict(cfg)},
                                    keep_last=cfg.keep_last_checkpoints)
        charts.draw_charts(run.run_dir, log_y=cfg.charts_log_y)
        return path

    window, last_val, last_loss, t_start = Window(), None, float("nan"), time.perf_counter()
    bar = tqdm(total=run.total_steps, initial=start, unit="step", dynamic_ncols=True, disable=None)
    x, y = run.train_batches.batch(start, k)
    with StopFlag() as stop:
        for s in range(start, run.total_steps):
            losses, stats = train_step(model, optimizer, jax.device_put(x), jax.device_put(y),
                                       step_key(cfg.seed, s))
            if s + 1 < run.total_steps:  # assemble the next batch while the device works
                x, y = run.train_batches.batch(s + 1, k)
            losses, stats = jax.device_get((losses, stats))
            done = s + 1
            last_loss = float(np.mean(losses))
            _record(window, done, losses, stats)
            now = time.perf_counter()
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{float(stats['learning_rate']):.2e}",
                            tok_s=f"{len(window.steps) * tokens_per_step / (now - window.started):,.0f}",
                            refresh=False)
            at_ckpt = done % cfg.checkpoint_interval == 0 or done == run.total_steps or stop.requested
            if at_ckpt or done % cfg.eval_interval() == 0:
                last_val = validate()
            if at_ckpt:
                elapsed += now - window.started
                path = checkpoint(done, window, stats, last_val)
                bar.write(_progress_line(done, run.total_steps, window, stats, last_val,
                                         tokens_per_step, now, cfg.clipping_max_norm, clip_flag) + f" | saved {path.name}")
                window = Window()
            if stop.requested:
                bar.close()
                print(f"Interrupted after step {done}/{run.total_steps}; checkpoint saved.\n"
                      f"Resume with: uv run train.py {run.run_dir}")
                return 130
    bar.close()
    _summary(run, start, tokens_per_step, time.perf_counter() - t_start, last_loss, best)
    return 0


def _record(window: Window, done: int, losses: np.ndarray, stats: dict) -> None:
    window.steps.append(done)
    window.losses.append(float(np.mean(losses)))
    window.micro_losses.extend(float(v) for v in losses)
    window.lrs.append(float(stats["learning_rate"]))
    gn = float(stats["grad_norm"])
    window.grad_norms.append(gn if np.isfinite(gn) else None)


def _meta(run: Run, done: int, window: Window, stats: dict, val: float | None, best: float,
          is_best: bool, elapsed: float, schedule: Any) -> dict[str, Any]:
    cfg, mcfg = run.train_cfg, run.model_cfg
    k, tokens_per_step = cfg.gradient_accumulation_steps, cfg.tokens_per_step(mcfg)
    micro = np.asarray(window.micro_losses)
    seconds = time.perf_counter() - window.started
    return {
        "format": 1,
        "step": done,
        "total_steps": run.total_steps,
        "tokens_seen": done * tokens_per_step,
        "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "train_loss": {"min": float(micro.min()), "max": float(micro.max()),
                       "mean": float(micro.mean()), "last": window.losses[-1]},
        "val_loss": val,
        "best_loss": best,  # validation loss when there is one, else mean train loss
        "is_best": is_best,
        "learning_rate": float(stats["learning_rate"]),  # used by the last step
        "next_learning_rate": float(schedule(done)),
        "grad_norm": window.grad_norms[-1],  # pre-clip norm of the last accumulated gradient
        "clip_max_norm": cfg.clipping_max_norm,
        "clipped_steps": sum(g is not None and g > cfg.clipping_max_norm for g in window.grad_norms),
        "skipped_updates": {"consecutive": int(stats["notfinite_count"]),
                            "total": int(stats["total_notfinite"])},
        "optimizer_steps_applied": int(stats["gradient_step"]),
        "throughput_tokens_per_s": len(window.steps) * tokens_per_step / max(seconds, 1e-9),
        "elapsed_s": elapsed,
        "data_position": {"next_step": done, "microbatches_consumed": done * k,
                          "sequences_consumed": done * k * cfg.microbatch_size,
                          "epoch": run.train_batches.epoch_of(done, k),
                          "dataset": str(run.dataset.path),
                          "fingerprint": run.dataset.manifest.get("fingerprint")},
        # Dropout keys are fold_in(key(seed), step): the seed and the step are the whole RNG state.
        "rng": {"seed": cfg.seed, "next_step": done, "scheme": "fold_in(key(seed), step)"},
        "series": {"step": window.steps, "loss": window.losses, "learning_rate": window.lrs,
                   "grad_norm": window.grad_norms},
    }


def _progress_line(done: int, total: int, window: Window, stats: dict, val: float | None,
                   tokens_per_step: int, now: float, max_norm: float, clip_flag: Any) -> str:
    gn = window.grad_norms[-1]
    clipped = " (clipped)" if clip_flag(gn, max_norm) else ""
    val_txt = f" | val {val:.4f}" if val is not None else ""
    rate = len(window.steps) * tokens_per_step / max(now - window.started, 1e-9)
    return (f"step {done}/{total} | loss {np.mean(window.losses):.4f}{val_txt} | "
            f"lr {float(stats['learning_rate']):.3e} | grad norm {gn if gn is None else round(gn, 4)}{clipped} | "
            f"{rate:,.0f} tok/s")


def _summary(run: Run, start: int, tokens_per_step: int, seconds: float, last_loss: float,
             best: float | None) -> None:
    tokens = (run.total_steps - start) * tokens_per_step
    print(f"Training complete in {seconds:,.3f} seconds")
    print(f"Tokens seen: {run.total_steps * tokens_per_step:,} ({tokens:,} in this session)")
    print(f"Throughput: {tokens / seconds:,.0f} tokens/second")
    print(f"Final train loss: {last_loss:.4f}")
    if best is not None:
        print(f"Best validation loss: {best:.4f}")


# ----------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    parser.add_argument("--restart", action="store_true",
                        help="start over: move checkpoints/ aside to checkpoints.old-<time>/")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where datasets live (default: $JAXGPT_DATA_DIR or ./data)")
    args = parser.parse_args(argv)
    try:
        run = prepare_run(args.run_dir, data_root=args.data_dir or default_data_root(),
                          restart=args.restart)
        return train(run)  # may still raise CheckpointError while loading, before compiling
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
