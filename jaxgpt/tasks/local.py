"""Task sets made here or by the user: the built-in instruction tasks, a JSONL of prompts and references.

    builtin_tasks(600, seed=0)              # [Task "builtin-reverse", ..., "builtin-larger"]: held-out questions
    builtin_tasks(20000, 0, split="train")  # their training side (RL prompts), none of them held out
    read_jsonl(Path("mine.jsonl"), "last_number")   # {"prompt", "reference"[, "system"]} per line

builtin_tasks(n, seed)'s held-out side is exactly the validation conversations of an
`instructions` dataset prepared with validation_examples n and that seed (instruction_splits).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from jaxgpt.conversations.instructions import TASKS, check_tasks, instruction_splits
from jaxgpt.data.errors import DataError
from jaxgpt.preparation.prepare import DEFAULT_OPTIONS
from jaxgpt.tasks.base import Example, Reward, Task, TaskError, user_prompt
from jaxgpt.tasks.rewards import ExactMatch, reward_rule
from jaxgpt.tasks.rows import field_of, records

BUILTIN_EXAMPLES = DEFAULT_OPTIONS["instructions"]["validation_examples"]  # an instructions dataset's held-out count
BUILTIN_SEED = DEFAULT_OPTIONS["instructions"]["seed"]
_JSONL_KEYS = ("prompt", "reference", "system")


def builtin_tasks(
    examples: int,
    seed: int,
    tasks: Sequence[str] = tuple(TASKS),
    *,
    split: Literal["validation", "train"] = "validation",
    validation_examples: int = BUILTIN_EXAMPLES,
) -> list[Task]:
    """One Task per instruction task ("builtin-add", ...), exact match on the answer, from
    instruction_splits' `split` side: "validation" holds `examples` questions in all (the tasks in
    turn); "train" holds `examples` after the `validation_examples` held out (the training side)."""
    for key, value in ("examples", examples), ("validation_examples", validation_examples), ("seed", seed):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "seed" else 1):
            raise TaskError(f"builtin tasks: {key} must be a whole number >= {int(key != 'seed')}, got {value!r}")
    if split not in ("validation", "train"):
        raise TaskError(f"builtin tasks: split must be 'validation' or 'train', got {split!r}")
    try:
        names = check_tasks(list(tasks))
        train, val = instruction_splits(
            examples if split == "train" else 0, examples if split == "validation" else validation_examples, seed, names
        )
    except DataError as e:
        raise TaskError(f"builtin tasks: {e}") from None
    conversations = val if split == "validation" else train
    by_task: dict[str, list[Example]] = {name: [] for name in names}
    # instruction_splits takes the tasks in turn from the first conversation drawn, the held-out ones first.
    offset = 0 if split == "validation" else validation_examples
    for i, conversation in enumerate(conversations):
        *prompt, answer = conversation
        by_task[names[(offset + i) % len(names)]].append(Example(tuple(prompt), answer["content"]))
    return [
        Task(f"builtin-{name}", "generative", tuple(found), ExactMatch(), 0.0)
        for name, found in by_task.items()
        if found
    ]


def _jsonl_example(record: Any, where: str, rule: Reward) -> Example:
    prompt = field_of(record, "prompt", str, where)
    reference = field_of(record, "reference", str, where)
    unknown = sorted(set(record) - set(_JSONL_KEYS))
    if unknown:
        raise TaskError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (known: {', '.join(_JSONL_KEYS)})")
    system = field_of(record, "system", str, where) if "system" in record else None
    try:
        rule.check(reference)
    except ValueError as e:
        raise TaskError(f"{where}: {e}; the rule is {rule.describe()}") from None
    return Example(messages=user_prompt(prompt, system), reference=reference)


def read_jsonl(path: Path, rule: Reward | str | dict, limit: int | None = None) -> Task:
    """A user's JSONL of {"prompt", "reference"} (optionally "system") per line, in file order, scored
    by `rule` (a rule, or a config value for rewards.reward_rule); the task is named "jsonl:<file stem>"."""
    path = Path(path).expanduser()
    if isinstance(rule, (str, dict)):
        rule = reward_rule(rule, f"{path}: reward rule")
    if limit is not None and limit < 1:
        raise TaskError(f"limit must be a whole number >= 1, got {limit!r}")
    examples: list[Example] = []
    for where, record in records(path, "jsonl"):
        if limit is not None and len(examples) >= limit:
            break
        examples.append(_jsonl_example(record, where, rule))
    if not examples:
        raise TaskError(f"{path}: no prompts (the file is empty)")
    return Task(f"jsonl:{path.stem}", "generative", tuple(examples), rule, 0.0)
