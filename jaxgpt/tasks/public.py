"""The public task sets in their published formats: GSM8K, ARC-Easy/Challenge, MMLU.

    read_gsm8k(Path("test.jsonl"))                      # openai/grade-school-math JSONL (or HF parquet)
    read_arc(Path("ARC-Easy-Test.jsonl"), name="arc-easy")   # AllenAI JSONL, or HF allenai/ai2_arc rows
    read_mmlu(Path("data/test/"))                       # the original subject CSVs, or HF cais/mmlu rows

The prompts are nanochat's (GSM8K's question as the one user message; ARC and MMLU through
render_mc), in nanochat's order (seed 42), so `limit` takes what its --max-problems takes;
`shuffle=False` keeps the file's order. A file may be .jsonl, .parquet or (MMLU) .csv, or a folder
of one split's files. Bad input is a TaskError naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxgpt.tasks.base import Example, Task, TaskError, chance, render_mc, user_prompt
from jaxgpt.tasks.rewards import ExactMatch, LastNumber
from jaxgpt.tasks.rows import field_of, nanochat_order, records, strings, task_files

ARC_NAMES = ("arc-easy", "arc-challenge")
MMLU_LETTERS = ("A", "B", "C", "D")


def _read(path: Path, what: str, fmt: str | None, parse: Any, shuffle: bool, limit: int | None) -> list[Example]:
    """parse(record, where) of every record of every file `path` names, then nanochat's order and the cap."""
    files = task_files(path, what)
    examples = [parse(record, where) for file in files for where, record in records(file, fmt)]
    if not examples:
        raise TaskError(f"{path}: no {what} examples (the file is empty)")
    return nanochat_order(examples, shuffle, limit)


def _gsm8k_example(record: Any, where: str) -> Example:
    question = field_of(record, "question", str, where)
    answer = field_of(record, "answer", str, where)
    if "####" not in answer:
        raise TaskError(f"{where}: 'answer' does not end in '#### N' (got ...{answer[-40:]!r})")
    reference = answer.rsplit("####", 1)[1].strip().replace(",", "")
    try:
        LastNumber().check(reference)
    except ValueError as e:
        raise TaskError(f"{where}: the answer after '####': {e}") from None
    return Example(messages=user_prompt(question), reference=reference)


def read_gsm8k(path: Path, limit: int | None = None, *, shuffle: bool = True, fmt: str | None = None) -> Task:
    """GSM8K rows ({"question", "answer": "... #### N"}): the question as a user message, N (commas
    removed) as the reference, scored by the answer's last number (rewards.LastNumber)."""
    examples = _read(Path(path), "gsm8k", fmt, _gsm8k_example, shuffle, limit)
    return Task("gsm8k", "generative", tuple(examples), LastNumber(), 0.0)


def _mc_example(question: str, labels: list[str], texts: list[str], answer: str, where: str) -> Example:
    if len(labels) != len(texts) or len(texts) < 2:
        raise TaskError(f"{where}: {len(texts)} choices with {len(labels)} labels (expected 2 or more, one each)")
    if len(set(labels)) != len(labels) or not all(label.strip() for label in labels):
        raise TaskError(f"{where}: the choices' labels must be distinct and non-empty, got {labels}")
    if answer not in labels:
        raise TaskError(f"{where}: answer {answer!r} is not among the choices' labels {labels}")
    return Example(messages=user_prompt(render_mc(question, labels, texts)), reference=answer, letters=tuple(labels))


def _arc_example(record: Any, where: str) -> Example:
    field_of(record, "question", object, where)
    answer = field_of(record, "answerKey", str, where)
    if isinstance(record["question"], dict):  # AllenAI: {"question": {"stem", "choices": [{"text", "label"}]}}
        question = field_of(record["question"], "stem", str, where)
        choices = field_of(record["question"], "choices", list, where)
        if not all(isinstance(c, dict) for c in choices):
            raise TaskError(f"{where}: 'choices' must be a list of {{'text', 'label'}} objects, got {choices!r:.80}")
        texts = [field_of(c, "text", str, where) for c in choices]
        labels = [field_of(c, "label", str, where) for c in choices]
    else:  # Hugging Face's allenai/ai2_arc: "question" str, "choices": {"text": [...], "label": [...]}
        question = field_of(record, "question", str, where)
        choices = field_of(record, "choices", dict, where)
        texts = strings(field_of(choices, "text", list, where), "choices.text", where)
        labels = strings(field_of(choices, "label", list, where), "choices.label", where)
    # Labels are used as they stand, as nanochat's tasks/arc.py does: "1".."4" in the few rows that have them.
    return _mc_example(question, labels, texts, answer, where)


def read_arc(
    path: Path, limit: int | None = None, *, name: str = "arc-easy", shuffle: bool = True, fmt: str | None = None
) -> Task:
    """ARC rows, AllenAI's JSONL or Hugging Face's (JSONL or parquet): render_mc of the question and
    its choices with their labels, the answer key as the reference (exact match); multiple choice."""
    if name not in ARC_NAMES:
        raise TaskError(f"ARC task name must be one of {', '.join(ARC_NAMES)}, got {name!r}")
    examples = _read(Path(path), name, fmt, _arc_example, shuffle, limit)
    return Task(name, "multiple_choice", tuple(examples), ExactMatch(), chance(examples))


def _mmlu_example(record: Any, where: str) -> Example:
    if isinstance(record, list):  # the original CSV: question, A, B, C, D, answer letter; no header
        if len(record) != 6:
            raise TaskError(f"{where}: expected 6 columns (question, A, B, C, D, answer), got {len(record)}")
        question, *choices, answer = record
        return _mc_example(question, list(MMLU_LETTERS), choices, answer.strip(), where)
    question = field_of(record, "question", str, where)
    choices = strings(field_of(record, "choices", list, where), "choices", where)
    if len(choices) != len(MMLU_LETTERS):
        raise TaskError(f"{where}: 'choices' must hold 4 texts, got {len(choices)}")
    answer = field_of(record, "answer", object, where)
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(MMLU_LETTERS):
        answer = MMLU_LETTERS[answer]
    elif not isinstance(answer, str):
        raise TaskError(f"{where}: answer {answer!r} is not among the choices (0-3 or A-D)")
    return _mc_example(question, list(MMLU_LETTERS), choices, answer, where)


def read_mmlu(path: Path, limit: int | None = None, *, shuffle: bool = True, fmt: str | None = None) -> Task:
    """MMLU rows, Hugging Face's cais/mmlu ({"question", "subject", "choices": [4], "answer": 0-3}; JSONL
    or parquet) or the original CSVs (a file or a folder of "<subject>_test.csv"): render_mc with A-D."""
    examples = _read(Path(path), "mmlu", fmt, _mmlu_example, shuffle, limit)
    return Task("mmlu", "multiple_choice", tuple(examples), ExactMatch(), chance(examples))
