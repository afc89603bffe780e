"""The built-in instruction set: short tasks with one checkable answer, made here (no download).

    train, val = instruction_splits(examples=20000, validation_examples=500, seed=0)
    train[0] -> [{"role": "user", "content": "Reverse the letters: qmvx"}, {"role": "assistant", "content": "xvmq"}]

Tasks (TASKS), each over random inputs drawn from a seeded generator:
    reverse   "Reverse the letters: qmvx"           -> "xvmq"        (3-6 lowercase letters)
    spell     "Spell the word: qmvx"                -> "q-m-v-x"
    sort      "Sort the letters of: qmvx"           -> "mqvx"
    upper     "Write in capitals: qmvx"             -> "QMVX"
    add       "Add 27 and 45."                      -> "72"          (0-99 each)
    larger    "Which is larger, 318 or 52?"         -> "318"         (0-999, never equal)

The same options give the same conversations, in the same order. Every instruction appears once in
all, and no validation instruction is ever a training one: exact match measures the task, not
recall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jaxgpt.data.errors import DataError

Pair = tuple[str, str]  # (instruction, answer)
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def _word(rng: np.random.Generator) -> str:
    return "".join(rng.choice(_LETTERS, size=int(rng.integers(3, 7))))


def _reverse(rng: np.random.Generator) -> Pair:
    w = _word(rng)
    return f"Reverse the letters: {w}", w[::-1]


def _spell(rng: np.random.Generator) -> Pair:
    w = _word(rng)
    return f"Spell the word: {w}", "-".join(w)


def _sort(rng: np.random.Generator) -> Pair:
    w = _word(rng)
    return f"Sort the letters of: {w}", "".join(sorted(w))


def _upper(rng: np.random.Generator) -> Pair:
    w = _word(rng)
    return f"Write in capitals: {w}", w.upper()


def _add(rng: np.random.Generator) -> Pair:
    a, b = (int(x) for x in rng.integers(0, 100, size=2))
    return f"Add {a} and {b}.", str(a + b)


def _larger(rng: np.random.Generator) -> Pair:
    a, b = (int(x) for x in rng.choice(1000, size=2, replace=False))
    return f"Which is larger, {a} or {b}?", str(max(a, b))


TASKS: dict[str, Callable[[np.random.Generator], Pair]] = {
    "reverse": _reverse,
    "spell": _spell,
    "sort": _sort,
    "upper": _upper,
    "add": _add,
    "larger": _larger,
}


def check_tasks(tasks: object) -> list[str]:
    if not isinstance(tasks, list) or not tasks or any(t not in TASKS for t in tasks) or len(set(tasks)) < len(tasks):
        raise DataError(
            f"instructions: option 'tasks' must be a list of distinct names from {', '.join(TASKS)}, got {tasks!r}"
        )
    return tasks


def instruction_splits(
    examples: int, validation_examples: int, seed: int, tasks: Sequence[str] = tuple(TASKS)
) -> tuple[list[list[dict]], list[list[dict]]]:
    """(train, val) conversations: the tasks taken in turn, each instruction distinct across both splits."""
    rng = np.random.default_rng([seed, 0x5EED])
    seen: set[str] = set()
    out: list[list[dict]] = []
    attempts = 0
    while len(out) < validation_examples + examples:
        instruction, answer = TASKS[tasks[len(out) % len(tasks)]](rng)
        attempts += 1
        if attempts > 50 * (validation_examples + examples):
            raise DataError(
                f"instructions: cannot draw {validation_examples + examples} distinct instructions "
                f"from tasks {list(tasks)}; ask for fewer examples"
            )
        if instruction in seen:
            continue
        seen.add(instruction)
        out.append([{"role": "user", "content": instruction}, {"role": "assistant", "content": answer}])
    return out[validation_examples:], out[:validation_examples]
