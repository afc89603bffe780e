"""DCLM's CORE metric as nanochat's nanochat/core_eval.py computes it: prompts, rows, accuracy, CORE.

    tasks = core_bundle.read_tasks(core_bundle.fetch_bundle(data_root / "downloads"))
    prepared = prepare(tasks, get_tokenizer("gpt2"), context_length=1024, vocab_size=50257)
    r = scoring.core_score(model, prepared)            # {"core", "tasks": {label: {accuracy, centered, ...}}}

How each example is rendered, which tokens are scored and how a row with none is decided:
docs/core.md "How an example is scored". Each row starts with the tokenizer's end-of-text id
(nanochat's BOS). A row longer than the context keeps its last context_length tokens, its example
counted in "truncated". A language-modeling row with nothing to score, or a token id outside the
model's vocabulary, raises CoreError. Pure numpy and the standard library; the device loop is
scoring.core_score.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.evaluation.core_bundle import CoreError, Task
from jaxgpt.evaluation.hellaswag import bucket

FEWSHOT_SEED = 1234  # nanochat's: example i's few-shot examples come from random.Random(1234 + i)
_ENCODE_EXAMPLES = 256  # examples whose prompts go to the tokenizer in one call (bounded text in memory)


# ----------------------------------------------------------------------------- prompts


def fewshot(examples: list[dict[str, Any]], index: int, shots: int) -> list[dict[str, Any]]:
    """The few-shot examples of example `index`: `shots` of the others, nanochat's sample."""
    if shots == 0:
        return []
    others = [i for i in range(len(examples)) if i != index]
    return [examples[i] for i in random.Random(FEWSHOT_SEED + index).sample(others, shots)]


def render_mc(item: dict[str, Any], delimiter: str, shots: list[dict[str, Any]]) -> list[str]:
    """A prompt per choice (core_eval.render_prompts_mc)."""
    head = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in shots)
    return [f"{head}{item['query']}{delimiter}{choice}" for choice in item["choices"]]


def render_schema(item: dict[str, Any], delimiter: str, shots: list[dict[str, Any]]) -> list[str]:
    """A prompt per context option (core_eval.render_prompts_schema)."""
    head = "".join(f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n" for ex in shots)
    return [f"{head}{option}{delimiter}{item['continuation']}" for option in item["context_options"]]


def render_lm(item: dict[str, Any], delimiter: str, shots: list[dict[str, Any]]) -> list[str]:
    """[prompt without the continuation, prompt with it] (core_eval.render_prompts_lm): contexts
    trimmed (jinja's trim is str.strip), the one without stripped whole, as nanochat does."""
    head = "".join(f"{ex['context'].strip()}{delimiter}{ex['continuation']}\n\n" for ex in shots)
    prompt = f"{head}{item['context'].strip()}{delimiter}"
    return [prompt.strip(), prompt + item["continuation"]]


RENDER = {"multiple_choice": render_mc, "schema": render_schema, "language_modeling": render_lm}


def prompts(task: Task, index: int) -> list[str]:
    """Example `index` of `task`, rendered with its few-shot examples."""
    return RENDER[task.kind](task.examples[index], task.delimiter, fewshot(task.examples, index, task.shots))


# ----------------------------------------------------------------------------- rows


def common_length(rows: list[Any], direction: str) -> int:
    """Length of the common prefix ("left") or suffix ("right") of the rows of token ids
    (core_eval.find_common_length), compared as one array: rows share hundreds of few-shot tokens."""
    n = min(len(r) for r in rows)
    cut = np.array([np.asarray(r)[:n] if direction == "left" else np.asarray(r)[len(r) - n :] for r in rows])
    differs = np.flatnonzero((cut != cut[0]).any(0)[:: 1 if direction == "left" else -1])
    return int(differs[0]) if differs.size else n


def spans(kind: str, rows: list[Any]) -> tuple[list[Any], list[int], list[int]]:
    """The rows to score and, per row, the [start, end) of the tokens scored (core_eval.batch_sequences_*);
    start == end where nothing is left to score (a choice inside the common prefix)."""
    ends = [len(r) for r in rows]
    if kind == "multiple_choice":
        return rows, [common_length(rows, "left")] * len(rows), ends
    if kind == "schema":
        suffix = common_length(rows, "right")
        # A row wholly inside the common suffix (the options all alike) would be scored from position
        # 0; nanochat's slice of it, losses[i, -1:e - 1], is empty: nothing scored.
        return rows, [e - suffix if e > suffix else e for e in ends], ends
    without, with_ = rows
    # nanochat asserts the prompt without the continuation tokenizes to a prefix of the one with it
    # (true of GPT-2's BPE on the bundle); where a tokenizer merges across the join, the common
    # prefix is the start instead.
    prefix = len(with_) >= len(without) and np.array_equal(np.asarray(with_)[: len(without)], without)
    return [with_], [len(without) if prefix else common_length(rows, "left")], [len(with_)]


@dataclass
class PreparedTask:
    """A task's rows, tokenized once (a run scores the same rows at every evaluation)."""

    task: Task
    rows: list[np.ndarray]  # int32 token ids, cropped to the context
    starts: np.ndarray  # (rows,) first scored position of each row
    ends: np.ndarray  # (rows,) one past the last
    first_row: np.ndarray  # (examples + 1,) example e's rows are first_row[e] .. first_row[e + 1] - 1
    truncated: int  # examples with a row cut to the context


def prepare(tasks: list[Task], tok: Tokenizer, *, context_length: int, vocab_size: int) -> list[PreparedTask]:
    """Render and tokenize every example of every task (end-of-text first), crop to the context;
    a token id the model's vocabulary lacks is a CoreError here, before any compile."""
    if tok.eot_id >= vocab_size:
        raise CoreError(
            f"CORE: the {tok.name} tokenizer's end-of-text id {tok.eot_id} is out of range for the "
            f"model's vocab_size={vocab_size}"
        )
    out = []
    for task in tasks:
        rows, starts, ends, first, cut = [], [], [], [0], 0
        for lo in range(0, len(task.examples), _ENCODE_EXAMPLES):  # one encode_batch call per slice
            rendered = [prompts(task, i) for i in range(lo, min(lo + _ENCODE_EXAMPLES, len(task.examples)))]
            encoded = iter(tok.encode_batch([p for ps in rendered for p in ps]))
            for index, ps in enumerate(rendered, start=lo):
                ids = [np.concatenate([[tok.eot_id], next(encoded)]).astype(np.int32) for _ in ps]
                these, s, e = spans(task.kind, ids)
                if task.kind == "language_modeling" and s[0] >= e[0]:  # MC and schema rows score NaN instead
                    raise CoreError(
                        f"CORE task {task.label}, example {index}: nothing to score (the {tok.name} "
                        f"tokenization leaves the continuation empty; nanochat's assert stops there too)"
                    )
                for row, si, ei in zip(these, s, e):
                    crop = max(len(row) - context_length, 0)
                    rows.append(row[crop:])
                    starts.append(max(si - crop, 1))  # position 0 has no token before it to predict it
                    ends.append(ei - crop)
                cut += max(len(row) for row in these) > context_length
                first.append(len(rows))
        top = max(int(r.max()) for r in rows)
        if top >= vocab_size:
            raise CoreError(
                f"CORE task {task.label}: token id {top} of the {tok.name} tokenizer is out of range "
                f"for the model's vocab_size={vocab_size}"
            )
        out.append(PreparedTask(task, rows, np.asarray(starts), np.asarray(ends), np.asarray(first), cut))
    return out


class Calls:
    """The device calls over every row of every task, built one at a time as they are iterated.

    Each call is (row numbers, (R, T) int32 rows, (R, T) float32 0/1 masks of the scored tokens),
    R = rows_per_call, T one padded length (32, 64, ..., at most the context); the last call of a
    length is filled with empty rows, so a run compiles one program per length. Row numbers count
    over the tasks in order."""

    def __init__(self, prepared: list[PreparedTask], *, context_length: int, rows_per_call: int) -> None:
        self.rows = [r for p in prepared for r in p.rows]
        self.starts = np.concatenate([p.starts for p in prepared])
        self.ends = np.concatenate([p.ends for p in prepared])
        sizes = np.array([bucket(len(r), context_length) for r in self.rows])
        self.R = min(rows_per_call, len(self.rows))
        self.plan = [
            (chunk, int(size))
            for size in np.unique(sizes)
            for order in [np.flatnonzero(sizes == size)]
            for chunk in (order[i : i + self.R] for i in range(0, len(order), self.R))
        ]

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for chunk, size in self.plan:
            tokens, mask = np.zeros((self.R, size), np.int32), np.zeros((self.R, size), np.float32)
            for slot, n in enumerate(chunk):
                tokens[slot, : len(self.rows[n])] = self.rows[n]
                mask[slot, self.starts[n] : self.ends[n]] = 1.0
            yield chunk, tokens, mask


# ----------------------------------------------------------------------------- figures


def centred(accuracy: float, baseline_percent: float) -> float:
    """base_eval's centred accuracy: 0 at the random baseline, 1 at every example right."""
    b = 0.01 * baseline_percent
    return (accuracy - b) / (1.0 - b)


def lowest_mean(means: list[float]) -> int:
    """The row nanochat picks, `mean_losses.index(min(mean_losses))`, spelled out for the NaN mean
    of a row with nothing scored: min() keeps its running best unless a value compares strictly
    below it, and nothing compares below NaN nor NaN below anything; index() then finds that very
    object. So a NaN first row wins whatever the others score, a later NaN never wins, and a tie
    goes to the first row."""
    best = 0
    for i in range(1, len(means)):
        if means[i] < means[best]:
            best = i
    return best


def task_accuracy(p: PreparedTask, sums: np.ndarray, counts: np.ndarray, hits: np.ndarray) -> float:
    """The share of the task's examples right, from its rows' summed losses, scored-token counts and
    argmax hits (core_eval.evaluate_example's decision)."""
    right = []
    for e in range(len(p.task.examples)):
        lo, hi = p.first_row[e], p.first_row[e + 1]
        if p.task.kind == "language_modeling":
            right.append(bool(hits[lo] == counts[lo]))
        else:
            # torch's mean over zero tokens is NaN: the same here, without numpy's 0/0 warning
            means = [float(s) / float(c) if c else math.nan for s, c in zip(sums[lo:hi], counts[lo:hi])]
            right.append(lowest_mean(means) == p.task.examples[e]["gold"])
    return float(np.mean(right))


def results(prepared: list[PreparedTask], sums: np.ndarray, counts: np.ndarray, hits: np.ndarray) -> dict[str, Any]:
    """Per task accuracy and centred accuracy, and CORE (their mean), from every row's figures
    (row numbers as Calls counts them)."""
    tasks, at = {}, 0
    for p in prepared:
        n = len(p.rows)
        acc = task_accuracy(p, sums[at : at + n], counts[at : at + n], hits[at : at + n])
        at += n
        tasks[p.task.label] = {
            "accuracy": acc,
            "centered": centred(acc, p.task.baseline),
            "kind": p.task.kind,
            "shots": p.task.shots,
            "examples": len(p.task.examples),
            "of": p.task.total,
            "truncated": p.truncated,
        }
    core = float(np.mean([t["centered"] for t in tasks.values()]))
    capped = any(t["examples"] < t["of"] for t in tasks.values())
    return {"core": core, "tasks": tasks, "capped": capped}


def report(r: dict[str, Any]) -> list[str]:
    """The lines evaluate.py prints: one per task, then CORE (said to be capped when it is)."""
    lines = []
    for label, t in r["tasks"].items():
        cut = f", {t['truncated']} cut to the context" if t["truncated"] else ""
        lines.append(
            f"{label:<34} {t['kind']:<17} {t['shots']:>2}-shot  accuracy {t['accuracy']:.4f} | "
            f"centered {t['centered']:.4f}  ({t['examples']:,} of {t['of']:,} examples{cut})"
        )
    note = " (examples capped per task: a quick figure, not the CORE metric)" if r["capped"] else ""
    lines.append(f"CORE {r['core']:.4f}{note}")
    return lines
