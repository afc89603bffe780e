"""Tasks by name, as a command line gives them.

    --tasks gsm8k=test.jsonl arc-easy=ARC-Easy-Test.jsonl mmlu=data/test/ builtin   # evaluate.py's form

    specs = parse_task_args(["gsm8k=test.jsonl", "builtin"])   # [("gsm8k", Path("test.jsonl")), ("builtin", None)]
    tasks = load_task("gsm8k", Path("test.jsonl"), limit=100)  # [Task]; "builtin" gives one Task per instruction task
    tasks = load_tasks(["gsm8k=test.jsonl", "builtin"])        # both at once

Names: gsm8k, arc-easy, arc-challenge, mmlu (a file or a folder of one split's files), jsonl (a
user's {"prompt", "reference"} file, scored by `rule`), builtin (no file: the built-in instruction
tasks' held-out questions). Every mistake is one TaskError line naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from jaxgpt.tasks.base import Reward, Task, TaskError
from jaxgpt.tasks.local import BUILTIN_EXAMPLES, BUILTIN_SEED, builtin_tasks, read_jsonl
from jaxgpt.tasks.public import read_arc, read_gsm8k, read_mmlu

TASK_NAMES = ("gsm8k", "arc-easy", "arc-challenge", "mmlu", "builtin", "jsonl")
_USAGE = "NAME=PATH for gsm8k, arc-easy, arc-challenge, mmlu and jsonl; builtin alone"


def parse_task_args(args: Sequence[str], where: str = "--tasks") -> list[tuple[str, Path | None]]:
    """(name, path) for each "NAME=PATH" or "builtin"; names other than jsonl at most once."""
    if not args:
        raise TaskError(f"{where}: no tasks given ({_USAGE})")
    out: list[tuple[str, Path | None]] = []
    labels: set[str] = set()  # two entries of one task name would be two rows of one name in the report
    for arg in args:
        name, sep, text = arg.partition("=")
        name = name.strip().lower()
        if name not in TASK_NAMES:
            raise TaskError(f"{where}: unknown task {name!r} in {arg!r} (known: {', '.join(TASK_NAMES)}; {_USAGE})")
        if name == "builtin" and sep:
            raise TaskError(f"{where}: builtin takes no file, got {arg!r}")
        if name != "builtin" and not text.strip():
            raise TaskError(f"{where}: {name} needs its file or folder, as {name}=PATH; got {arg!r}")
        path = Path(text.strip()).expanduser() if name != "builtin" else None
        label = f"jsonl:{path.stem}" if name == "jsonl" and path is not None else name
        if label in labels:
            raise TaskError(f"{where}: task {label} is given twice (in {arg!r})")
        labels.add(label)
        out.append((name, path))
    return out


def load_task(
    spec: str,
    path: Path | None,
    *,
    limit: int | None = None,
    rule: Reward | str | dict = "exact",
    seed: int = BUILTIN_SEED,
    builtin_examples: int = BUILTIN_EXAMPLES,
) -> list[Task]:
    """The task(s) named `spec` (one of TASK_NAMES) read from `path`, at most `limit` examples each:
    a list because "builtin" is one Task per instruction task. `rule` scores "jsonl" tasks; `seed`
    and `builtin_examples` choose the built-in questions (an instructions dataset's seed and
    validation_examples)."""
    if spec == "builtin":
        if path is not None:
            raise TaskError(f"builtin takes no file, got {path}")
        tasks = builtin_tasks(builtin_examples, seed)
        return tasks if limit is None else [_capped(t, limit) for t in tasks]
    if spec not in TASK_NAMES:
        raise TaskError(f"unknown task {spec!r} (known: {', '.join(TASK_NAMES)})")
    if path is None:
        raise TaskError(f"{spec} needs its file or folder")
    if spec == "gsm8k":
        return [read_gsm8k(path, limit)]
    if spec == "mmlu":
        return [read_mmlu(path, limit)]
    if spec == "jsonl":
        return [read_jsonl(path, rule, limit)]
    return [read_arc(path, limit, name=spec)]


def load_tasks(
    args: Sequence[str],
    *,
    where: str = "--tasks",
    limit: int | None = None,
    rule: Reward | str | dict = "exact",
    seed: int = BUILTIN_SEED,
    builtin_examples: int = BUILTIN_EXAMPLES,
) -> list[Task]:
    """parse_task_args(args, where), each loaded by load_task with these options, in order."""
    options = {"limit": limit, "rule": rule, "seed": seed, "builtin_examples": builtin_examples}
    return [task for name, path in parse_task_args(args, where) for task in load_task(name, path, **options)]


def _capped(task: Task, limit: int) -> Task:
    if limit < 1:
        raise TaskError(f"limit must be a whole number >= 1, got {limit!r}")
    return Task(task.name, task.kind, task.examples[:limit], task.rule, task.baseline)
