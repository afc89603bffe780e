"""The memory plan: how a run's train step fits the accelerator it runs on, chosen once at start.

    plan = choose(candidates(model_cfg, train_cfg, data_ways), need, limit, where)   # build_state's
    plan.model_cfg(model_cfg), plan.train_cfg(train_cfg)    # what the model and the optimiser are built with
    split_rows(array, plan.split)                           # each step's (k, B, T) batch -> (k*s, B/s, T)

Where the device reports its memory (a GPU, a TPU), candidate steps are compiled from the run as
configured to the most frugal (the first alone, the later ones at once: state.plan_figures), and the
first whose program XLA fits in the memory is taken: loss_chunk, then remat "dots" (on a TPU
"attention") and "full", then each configured microbatch run as 2, 4, ... smaller ones with as many
more accumulation steps. The global batch, each step's rows and the data order stay: only how the
step computes them changes. A CPU compiles nothing ahead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jaxgpt.config import ConfigError, ModelConfig, TrainConfig

LOSS_CHUNK = 4096  # tokens per chunk of the head and loss, where the plan turns chunking on
HEADROOM = 0.95  # of the device's memory a plan may fill: batches in flight, the allocator's slack
GIB = 2**30


@dataclass(frozen=True)
class Plan:
    remat: bool | str  # model.json remat
    loss_chunk: int | None  # model.json loss_chunk
    split: int = 1  # each configured microbatch as `split` microbatches of microbatch_size / split rows

    def model_cfg(self, cfg: ModelConfig) -> ModelConfig:
        return dataclasses.replace(cfg, remat=self.remat, loss_chunk=self.loss_chunk)

    def train_cfg(self, cfg: TrainConfig) -> TrainConfig:
        return dataclasses.replace(
            cfg,
            microbatch_size=cfg.microbatch_size // self.split,
            gradient_accumulation_steps=cfg.gradient_accumulation_steps * self.split,
        )

    def describe(self, cfg: TrainConfig) -> str:
        t = self.train_cfg(cfg)
        remat = {False: "off", True: "full"}.get(self.remat, self.remat)  # type: ignore[call-overload]
        return (
            f"remat {remat}, loss_chunk {self.loss_chunk or 'off'}, "
            f"{t.gradient_accumulation_steps} microbatch(es) of {t.microbatch_size} per step"
        )


# remat policies from the one that keeps most to the one that keeps least (model.json remat)
KEEPS_LESS = {False: 0, "dots": 1, "attention": 2, "full": 3, True: 3}
# A TPU's: splash attention's residuals kept ("attention") ran GPT-2 124M's step 2.5% faster than
# "full" on a v5e, and "dots" 9-13% slower (HBM traffic for the saved products): docs/log.md#tpu-v5e.
TPU_POLICIES = ("attention", "full")
POLICIES = ("dots", "full")  # elsewhere


def candidates(
    model: ModelConfig,
    train: TrainConfig,
    data_ways: int,
    max_split: int | None = None,
    policies: tuple[str, ...] = POLICIES,
) -> list[Plan]:
    """The plans to try, the run as configured first; each later one needs less memory: loss chunks,
    then each of `policies` that keeps less than the configured remat, then smaller microbatches."""
    chunk = model.loss_chunk or LOSS_CHUNK
    plans = [Plan(model.remat, model.loss_chunk)]
    plans += [Plan(p, chunk) for p in policies if KEEPS_LESS[p] > KEEPS_LESS[model.remat]]
    if model.loss_chunk is None:
        plans.insert(1, Plan(model.remat, chunk))
    split, B = 2, train.microbatch_size
    while B % split == 0 and (B // split) % data_ways == 0 and (max_split is None or split <= max_split):
        plans.append(Plan("full", chunk, split))
        split *= 2
    return list(dict.fromkeys(plans))  # in order, each once


def choose(
    plans: list[Plan], need: Callable[[Plan], int | None], limit: int, where: str, describe: Callable[[Plan], str]
) -> tuple[Plan, int]:
    """The first plan whose step needs at most HEADROOM x `limit` bytes, and what it needs.

    need(plan): the bytes XLA's compiled step asks for, or None where the compiler refused it for
    want of memory (need may also return the figure from that refusal). Raises ConfigError, one
    line naming what the run as configured and the most frugal plan need, when none fits.
    """
    tried: list[tuple[Plan, int | None]] = []
    for plan in plans:
        n = need(plan)
        tried.append((plan, n))
        if n is not None and n <= HEADROOM * limit:
            return plan, n
    first, last = tried[0], tried[-1]
    raise ConfigError(
        f"{where}: the train step does not fit in the device's {size(limit)}: as configured it needs "
        f"{size(first[1])}, and with {describe(last[0])} {size(last[1])}; lower microbatch_size or "
        f"sequence_length, or shard the model over more devices (train.json mesh)"
    )


def size(n: int | None) -> str:
    """Bytes for a person: GiB, or MiB below one GiB."""
    if n is None:
        return "more than the device has"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def compiled_bytes(compiled: object) -> int:
    """What a compiled program needs on its device: arguments, outputs not aliased to them, temporaries, code."""
    m = compiled.memory_analysis()  # type: ignore[attr-defined]
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def refused_bytes(message: str) -> int | None:
    """The bytes an out-of-memory compile error says the program needs, if it says: "Used 36.32G of 15.48G hbm"
    or "the total memory required for HLO temporaries (22.79G) exceeds" (a TPU's two forms)."""
    found = re.search(r"Used ([\d.]+)([KMGT])i?B? of", message) or re.search(
        r"required for HLO temporaries \(([\d.]+)([KMGT])i?B?\)", message
    )
    if found is None:
        return None
    return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2)))


def is_out_of_memory(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


def split_rows(a: np.ndarray, split: int) -> np.ndarray:
    """(k, B, ...) -> (k * split, B / split, ...): microbatch j of each configured one takes its rows
    j, j + split, j + 2 split, ...: every row stays with the process and device that hold it (the data
    axis splits B into contiguous blocks), and the step's rows are the configured ones."""
    if split == 1:
        return a
    k, B, *rest = a.shape
    return a.reshape(k, B // split, split, *rest).swapaxes(1, 2).reshape(k * split, B // split, *rest)


ENGINE_SHARE = 0.25  # of the device's memory an RL run's sampling engine may hold as its KV cache


def engine_rows(wanted: int, group: int, row_bytes: int, limit: int | None) -> int:
    """Rows for an engine that draws `wanted` samples at once in groups of `group` (a prompt's samples
    share its prefill), each row's KV cache `row_bytes`: all of them, or on a device of `limit` bytes
    as many whole groups as ENGINE_SHARE of it holds (at least one); the engine draws the rest in turns."""
    if limit is None or wanted * row_bytes <= ENGINE_SHARE * limit:
        return wanted
    return max(group, int(ENGINE_SHARE * limit // row_bytes) // group * group)
