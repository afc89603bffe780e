"""`uv run -m bench engine`: the generation engine's tokens/s at the RL sampling shape, 1 row against 16.

    uv run -m bench engine                         # runs/tiny-rl's model and rl section, random weights
    uv run -m bench engine runs/tiny-rl --rounds 3 --json engine.json

The shape is an RL step's: prompts of the run's rl.prompts (the built-in questions rendered with a short
template), rl.samples_per_prompt answers of rl.max_new_tokens each at rl.temperature, no stop token (every
answer is full length). The same answers are drawn by an engine of 1 row (one at a time) and of 16 rows
(16 at once), in-process, each timed after an untimed round that compiles its programs, drawn again
for at least half a second a round; rounds alternate. Target: 16 rows at least 4x the tokens per second of one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.compare import cpu_line
from bench.train_step import BenchError
from jaxgpt.config import load_run_configs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN = ROOT / "runs" / "tiny-rl"
TARGET = 4.0  # tokens/s with 16 rows over tokens/s with 1
TEMPLATE = {
    "name": "short",
    "user": "### Instruction:\n{content}\n\n",
    "assistant": "### Response:\n{content}",
    "end": "<|endoftext|>",
}


def _prompts(count: int, tok: Any) -> list[list[int]]:
    """The first `count` built-in add questions, rendered as runs/tiny-instruct renders them."""
    from jaxgpt.conversations.template import ChatTemplate
    from jaxgpt.tasks.local import builtin_tasks

    (task,) = builtin_tasks(count * 6, 0, ("add",), split="train")
    template = ChatTemplate.from_dict(TEMPLATE)
    return [template.prompt(tok, list(e.messages)) for e in task.examples[:count]]


def _time(engine: Any, prompts: list[list[int]], params: Any, samples: int, least: float) -> tuple[float, int]:
    """The same answers drawn again until `least` seconds have passed: one call lasts tens of
    milliseconds, too short to time alone on a shared machine."""
    started, tokens = time.perf_counter(), 0
    while not tokens or time.perf_counter() - started < least:
        tokens += sum(len(r.sampled) for r in engine.generate(prompts, params, n=samples))
    return time.perf_counter() - started, tokens


def bench_engine(
    run: Path | None, *, rounds: int = 3, least: float = 0.5, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Each round: the same answers by the 1-row engine, then the 16-row one, each for at least
    `least` seconds; tokens/s of each round."""
    from jaxgpt.cpu import kernels as cpu_kernels
    from jaxgpt.data.tokenizer import get_tokenizer
    from jaxgpt.generation.engine import Engine
    from jaxgpt.generation.sampling import SamplingParams
    from jaxgpt.model.gpt import build_model

    model_cfg, train_cfg = load_run_configs(run or DEFAULT_RUN)
    rl = train_cfg.rl
    if rl is None:
        raise BenchError(f"{run}: not an rl run (train.json has no rl section)")
    tok = get_tokenizer("bytes")
    prompts = _prompts(max(1, 16 // rl.samples_per_prompt), tok)
    params = SamplingParams(rl.max_new_tokens, rl.temperature, rl.top_k, seed=1)
    model = build_model(model_cfg, seed=0)
    log(cpu_line(cpu_kernels.cpu_info()) + f"; load average now {os.getloadavg()[0]:.2f}")
    log(
        f"model: {model_cfg.n_layers} layers, {model_cfg.emb_dim} dims, context {model_cfg.context_length} "
        f"(random weights); {len(prompts)} prompt(s) of {len(prompts[0])} tokens x {rl.samples_per_prompt} "
        f"samples of {rl.max_new_tokens} tokens, temperature {rl.temperature:g}"
    )
    engines = {rows: Engine(model, tok, rows=rows) for rows in (1, 16)}
    for engine in engines.values():
        _time(engine, prompts, params, rl.samples_per_prompt, 0.0)  # untimed: compiles the programs
    rates: dict[int, list[float]] = {1: [], 16: []}
    for r in range(rounds):
        for rows, engine in engines.items():
            seconds, tokens = _time(engine, prompts, params, rl.samples_per_prompt, least)
            rates[rows].append(tokens / seconds)
        log(f"round {r + 1}: 1 row {rates[1][-1]:,.0f} tok/s | 16 rows {rates[16][-1]:,.0f} tok/s")
    ratio = float(np.median(rates[16]) / np.median(rates[1]))
    log(
        f"16 rows over 1: {ratio:.1f}x (median of {rounds} rounds; target {TARGET:g}x): "
        f"{'met' if ratio >= TARGET else 'MISSED'}"
    )
    return {
        "tokens_per_s": {str(k): v for k, v in rates.items()},
        "ratio": ratio,
        "target": TARGET,
        "met": ratio >= TARGET,
    }
