"""`uv run -m bench data`: how fast the loader feeds training.

How fast the loader assembles a run's optimiser-step batches (k x B x T inputs and targets, drawn
by BatchSampler from memory-mapped shards) and hands them to the device with `jax.device_put`, the
two things train.py does per step, against an upper bound of the run's training throughput on
this machine (measured matmul FLOP/s over the model's training FLOPs per token) or a measured
--train-tokens-per-s; the target is a ratio of at least 50, so the data never limits training.
Without --dataset it writes random shards of the run's vocabulary to a temporary folder (small
shards, so windows cross shard boundaries).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.train_step import matmul_flops, train_flops_per_token
from jaxgpt.config import load_run_configs
from jaxgpt.data.samplers.windows import BatchSampler
from jaxgpt.data.storage.shards import open_dataset, write_dataset
from jaxgpt.data.tokenizer import GPT2_EOT_ID, GPT2_N_VOCAB

TARGET_RATIO = 50  # data throughput / training throughput


@dataclass(frozen=True)
class _Vocab:  # what write_dataset needs of a tokenizer, without loading tiktoken's files
    name: str
    n_vocab: int
    eot_id: int


_VOCABS = {"bytes": _Vocab("bytes", 257, 256), "gpt2": _Vocab("gpt2", GPT2_N_VOCAB, GPT2_EOT_ID)}


def _synthetic_dataset(folder: Path, tokenizer: str, n_tokens: int) -> Path:
    vocab = _VOCABS[tokenizer]
    tokens = np.random.default_rng(0).integers(0, vocab.n_vocab, n_tokens, dtype=np.int64)
    path = folder / f"synthetic-{tokenizer}"
    write_dataset(
        path,
        source="synthetic",
        options={},
        fingerprint="bench",
        tokenizer=vocab,
        splits={"train": [tokens], "val": [tokens[:1024]]},
        shard_tokens=max(1, n_tokens // 4),
    )
    return path


def _time_steps(sampler: BatchSampler, k: int, seconds: float, min_steps: int) -> tuple[list[float], list[float]]:
    """Seconds per optimiser step spent assembling the batch and putting it on the device."""
    import jax

    assemble, put = [], []
    sampler.batch(0, k)  # builds the epoch's permutation, once per epoch in training too
    started = time.perf_counter()
    step = 0
    while step < min_steps or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        x, y = sampler.batch(step, k)[:2]
        t1 = time.perf_counter()
        jax.block_until_ready((jax.device_put(x), jax.device_put(y)))
        t2 = time.perf_counter()
        assemble.append(t1 - t0)
        put.append(t2 - t1)
        step += 1
    return assemble, put


def bench_data(
    run_dir: Path,
    *,
    dataset: Path | None = None,
    seconds: float = 5.0,
    min_steps: int = 3,
    synthetic_tokens: int = 2**24,
    train_tokens_per_s: float | None = None,
    matmul_size: int = 2048,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Figures for `uv run -m bench data` (tokens/s counts input tokens, k x B x T per step)."""
    import jax

    model_cfg, train_cfg = load_run_configs(run_dir)
    B, T, k = train_cfg.microbatch_size, train_cfg.seq_len(model_cfg), train_cfg.gradient_accumulation_steps
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        path = dataset if dataset is not None else _synthetic_dataset(Path(tmp), train_cfg.tokenizer, synthetic_tokens)
        ds = open_dataset(path)
        sampler = BatchSampler(ds.train, microbatch_size=B, seq_len=T, seed=0, targets=train_cfg.targets)
        assemble, put = _time_steps(sampler, k, seconds, min_steps)
        desc = f"{path}" if dataset is not None else f"synthetic, {ds.train.n_tokens:,} tokens"
        desc += f" in {len(ds.train.shards)} shard(s)"
    step_tokens = k * B * T
    data_rate = step_tokens * len(assemble) / (sum(assemble) + sum(put))
    flops = matmul_flops(matmul_size)
    per_token = train_flops_per_token(model_cfg, T)
    train_rate = train_tokens_per_s if train_tokens_per_s is not None else flops / per_token
    result = {
        "run": str(run_dir),
        "device": str(jax.devices()[0]),
        "dataset": desc,
        "microbatch_size": B,
        "seq_len": T,
        "accumulation_steps": k,
        "tokens_per_step": step_tokens,
        "steps_timed": len(assemble),
        "assemble_ms_per_step_median": 1e3 * float(np.median(assemble)),
        "device_put_ms_per_step_median": 1e3 * float(np.median(put)),
        "assemble_tokens_per_s": step_tokens * len(assemble) / sum(assemble),
        "device_put_tokens_per_s": step_tokens * len(put) / sum(put),
        "data_tokens_per_s": data_rate,
        "matmul_gflops": flops / 1e9,
        "train_flops_per_token": per_token,
        "train_tokens_per_s": train_rate,
        "train_tokens_per_s_source": (
            "given" if train_tokens_per_s is not None else "upper bound: matmul FLOP/s / FLOPs"
        ),
        "ratio": data_rate / train_rate,
        "target_ratio": TARGET_RATIO,
    }
    result["meets_target"] = result["ratio"] >= TARGET_RATIO
    log(_report(result))
    return result


def _report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"data loader for {r['run']} on {r['device']}: k={r['accumulation_steps']} x B={r['microbatch_size']} "
            f"x T={r['seq_len']} = {r['tokens_per_step']:,} tokens/step, {r['dataset']}, {r['steps_timed']} steps",
            f"  assemble batch  {r['assemble_ms_per_step_median']:9.2f} ms/step  "
            f"{r['assemble_tokens_per_s']:15,.0f} tokens/s",
            f"  device_put      {r['device_put_ms_per_step_median']:9.2f} ms/step  "
            f"{r['device_put_tokens_per_s']:15,.0f} tokens/s",
            f"  together                          {r['data_tokens_per_s']:15,.0f} tokens/s",
            f"  training        {r['train_tokens_per_s']:,.0f} tokens/s ({r['train_tokens_per_s_source']}; "
            f"{r['matmul_gflops']:.0f} GFLOP/s, {r['train_flops_per_token'] / 1e6:,.0f} MFLOP/token)",
            f"  ratio {r['ratio']:,.0f}x (target >= {r['target_ratio']}x): {'OK' if r['meets_target'] else 'TOO SLOW'}",
        ]
    )
