"""The public task files, fetched once into <data>/downloads/tasks/ (download_dataset.py tasks).

    path = fetch_public("gsm8k", data_root / "downloads")    # downloads/tasks/gsm8k-test.jsonl
    fetch_public("mmlu", downloads, url=mirror_file.as_uri(), examples=5)   # another address, another count

A file is renamed into place only if its task's reader finds exactly the published number of
examples; its sha256 is then recorded beside it and checked at every later use (as HellaSwag's
file). Upstream hashes are not pinned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jaxgpt.data.sources import files as sources
from jaxgpt.tasks.base import TaskError
from jaxgpt.tasks.public import read_arc, read_gsm8k, read_mmlu

_HF = "https://huggingface.co/datasets"
_GSM8K = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"


@dataclass(frozen=True)
class PublicFile:
    task: str  # the task name it is read as (load_task's)
    url: str
    file: str  # its name under <downloads>/tasks/
    examples: int  # the published count: a download holding any other is refused


PUBLIC = {
    "gsm8k": PublicFile("gsm8k", f"{_GSM8K}/test.jsonl", "gsm8k-test.jsonl", 1319),
    "gsm8k-train": PublicFile("gsm8k", f"{_GSM8K}/train.jsonl", "gsm8k-train.jsonl", 7473),
    "arc-easy": PublicFile(
        "arc-easy",
        f"{_HF}/allenai/ai2_arc/resolve/main/ARC-Easy/test-00000-of-00001.parquet",
        "arc-easy-test.parquet",
        2376,
    ),
    "arc-challenge": PublicFile(
        "arc-challenge",
        f"{_HF}/allenai/ai2_arc/resolve/main/ARC-Challenge/test-00000-of-00001.parquet",
        "arc-challenge-test.parquet",
        1172,
    ),
    "mmlu": PublicFile(
        "mmlu", f"{_HF}/cais/mmlu/resolve/main/all/test-00000-of-00001.parquet", "mmlu-test.parquet", 14042
    ),
}
DEFAULT = ("gsm8k", "arc-easy", "arc-challenge", "mmlu")  # the test sets ChatCORE is formed on (HumanEval aside)


def _count(task: str, path: Path, fmt: str) -> int:
    if task == "gsm8k":
        return len(read_gsm8k(path, shuffle=False, fmt=fmt).examples)
    if task == "mmlu":
        return len(read_mmlu(path, shuffle=False, fmt=fmt).examples)
    return len(read_arc(path, name=task, shuffle=False, fmt=fmt).examples)


def fetch_public(
    name: str,
    downloads: Path,
    *,
    url: str | None = None,
    examples: int | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """PUBLIC[name]'s file under `downloads`/tasks/, downloaded once (from `url` if given, holding
    `examples` examples if given: a test's local copy) and checked; a TaskError of one line if not."""
    if name not in PUBLIC:
        raise TaskError(f"unknown public task file {name!r} (known: {', '.join(PUBLIC)})")
    public = PUBLIC[name]
    url = url or public.url
    expected = public.examples if examples is None else examples
    fmt = public.file.rpartition(".")[2]

    def validate(tmp: Path) -> None:
        n = _count(public.task, tmp, fmt)
        if n != expected:
            raise TaskError(f"{url}: {n} examples downloaded, expected {expected}; the address may have changed")

    return sources.fetch_recorded(
        url,
        Path(downloads) / "tasks" / public.file,
        validate=validate,
        offline_hint=f"pass any local copy to evaluate.py as --tasks {public.task}=<file>",
        error=TaskError,
        log=log,
    )


def fetch_tasks(names: list[str], downloads: Path, log: Callable[[str], None] = print) -> dict[str, Path]:
    """fetch_public for each name (default: DEFAULT, the test sets), in order: {name: path}."""
    unknown = [name for name in names if name not in PUBLIC]
    if unknown:
        raise TaskError(f"unknown public task file(s) {', '.join(map(repr, unknown))} (known: {', '.join(PUBLIC)})")
    return {name: fetch_public(name, downloads, log=log) for name in (names or DEFAULT)}


def tasks_argument(paths: dict[str, Path]) -> str:
    """The --tasks words that evaluate on these files' test sets: "gsm8k=<path> arc-easy=<path> ..."."""
    return " ".join(f"{PUBLIC[name].task}={path}" for name, path in paths.items() if name in DEFAULT)
