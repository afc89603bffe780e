"""DCLM's eval bundle as nanochat's scripts/base_eval.py reads it: the CORE tasks and their examples.

    path = fetch_bundle(data_root / "downloads")     # eval_bundle.zip, downloaded once (or --core-from)
    tasks = read_tasks(path, limit=None)             # [Task]: label, kind, shots, delimiter, baseline, examples

The bundle is a zip (read in place, never unpacked) or the folder it unpacks to, either possibly
under `eval_bundle/`; its files: docs/core.md "The bundle". Each task's examples are shuffled with
random.Random(1337), as nanochat does, then capped to `limit` (a capped figure is a quick one, not
the CORE metric). Whatever base_eval.py reads, this reads (JSONL lines split as Python's text mode
splits them, blank lines skipped, a UTF-8 BOM dropped, a task's first CSV row and first
num_fewshot used); whatever nanochat could not score either is one CoreError naming the file and
line. Pure Python: jaxgpt/training/run.py reads the bundle before JAX starts.
"""

from __future__ import annotations

import csv
import io
import json
import random
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import files as sources

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
BUNDLE_FILE = "eval_bundle.zip"
KINDS = ("multiple_choice", "schema", "language_modeling")
SHUFFLE_SEED = 1337  # nanochat's: the order a capped run takes its examples in
# The fields each kind's examples need (str: a string, "" too; list: a non-empty list of strings; gold: an
# index into it). nanochat would render other types through jinja's str(); no bundle holds them.
_FIELDS = {
    "multiple_choice": {"query": str, "choices": list, "gold": int},
    "schema": {"context_options": list, "continuation": str, "gold": int},
    "language_modeling": {"context": str, "continuation": str},
}


class CoreError(DataError):
    """A missing, unreadable or malformed eval bundle file (one line naming the file, and line)."""


@dataclass(frozen=True)
class Task:
    label: str
    kind: str  # one of KINDS
    shots: int  # few-shot examples before each one (num_fewshot[0])
    delimiter: str  # between context and continuation (continuation_delimiter)
    baseline: float  # random baseline, percent (eval_meta_data.csv)
    examples: list[dict[str, Any]]  # shuffled (SHUFFLE_SEED), then capped
    total: int  # examples in the task's file


class Bundle:
    """A bundle's files by their names inside it (core.yaml, eval_data/...), from a folder or a zip."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.zip: zipfile.ZipFile | None = None
        if self.path.is_dir():
            self.prefix = "eval_bundle/" if (self.path / "eval_bundle" / "core.yaml").is_file() else ""
        elif self.path.is_file():
            try:
                self.zip = zipfile.ZipFile(self.path)
            except (zipfile.BadZipFile, OSError) as e:
                raise CoreError(f"{self.path}: not a readable zip file ({e})") from None
            self.prefix = "eval_bundle/" if "eval_bundle/core.yaml" in self.zip.namelist() else ""
        else:
            raise CoreError(f"{self.path}: eval bundle not found (a folder or eval_bundle.zip)")

    def where(self, name: str) -> str:
        return f"{self.path}:{self.prefix}{name}" if self.zip else str(self.path / self.prefix / name)

    def read(self, name: str) -> str:
        try:
            data = self.zip.read(self.prefix + name) if self.zip else (self.path / self.prefix / name).read_bytes()
        except (KeyError, FileNotFoundError, IsADirectoryError):
            raise CoreError(f"{self.where(name)}: not in the eval bundle") from None
        try:
            # A BOM would be part of the CSV's first column name; pandas (base_eval.py) drops it.
            return data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise CoreError(f"{self.where(name)}: not UTF-8 (byte {e.start})") from None

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


def _task_entries(bundle: Bundle) -> list[dict[str, Any]]:
    where = bundle.where("core.yaml")
    try:
        config = yaml.safe_load(bundle.read("core.yaml"))
    except yaml.YAMLError as e:
        raise CoreError(f"{where}: malformed YAML ({str(e).splitlines()[0]})") from None
    tasks = config.get("icl_tasks") if isinstance(config, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise CoreError(f"{where}: expected a non-empty list under 'icl_tasks'")
    labels = set()
    for i, t in enumerate(tasks):
        here = f"{where}: icl_tasks[{i}]"
        if not isinstance(t, dict) or not all(isinstance(t.get(k), str) for k in ("label", "dataset_uri")):
            raise CoreError(f"{here}: needs string 'label' and 'dataset_uri', got {t!r:.80}")
        if t.get("icl_task_type") not in KINDS:
            raise CoreError(f"{here} ({t['label']}): icl_task_type={t.get('icl_task_type')!r} is not one of {KINDS}")
        shots = t.get("num_fewshot")
        if not (isinstance(shots, list) and shots and type(shots[0]) is int and shots[0] >= 0):  # nanochat reads [0]
            raise CoreError(
                f"{here} ({t['label']}): num_fewshot={shots!r} must be a list whose first value is an integer >= 0"
            )
        if not isinstance(t.get("continuation_delimiter", " "), str):
            raise CoreError(f"{here} ({t['label']}): continuation_delimiter must be a string")
        if t["label"] in labels:
            raise CoreError(f"{here}: label {t['label']!r} appears twice")
        labels.add(t["label"])
    return tasks


def _baselines(bundle: Bundle, labels: set[str]) -> dict[str, float]:
    """The random baselines of the tasks `labels` names: base_eval.py looks up only those, each in
    the first row that has its label."""
    where = bundle.where("eval_meta_data.csv")
    rows = csv.DictReader(io.StringIO(bundle.read("eval_meta_data.csv")))
    if not {"Eval Task", "Random baseline"} <= set(rows.fieldnames or ()):
        raise CoreError(f"{where}: needs the columns 'Eval Task' and 'Random baseline', got {rows.fieldnames}")
    out = {}
    for row in rows:
        if row["Eval Task"] not in labels or row["Eval Task"] in out:
            continue
        try:
            out[row["Eval Task"]] = value = float(row["Random baseline"])
        except (TypeError, ValueError):
            raise CoreError(
                f"{where}:{rows.line_num}: Random baseline {row['Random baseline']!r} is not a number"
            ) from None
        if not 0 <= value < 100:
            raise CoreError(f"{where}:{rows.line_num}: Random baseline {value} must be a percentage in [0, 100)")
    return out


def _check_example(record: Any, kind: str, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise CoreError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key, kind_of in _FIELDS[kind].items():
        if key not in record:  # nanochat: a KeyError, or "" where only its jinja template reads the key
            raise CoreError(f"{where}: {kind} example has no '{key}' (its keys: {list(record)!r:.80})")
        value = record[key]
        if kind_of is str and not isinstance(value, str):
            raise CoreError(f"{where}: {kind} needs a string '{key}', got {value!r:.60}")
        if kind_of is list and not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            raise CoreError(f"{where}: {kind} needs '{key}' as a non-empty list of strings, got {value!r:.60}")
    options = record.get("choices", record.get("context_options"))
    if "gold" in _FIELDS[kind]:
        gold = record["gold"]
        if type(gold) is not int or not 0 <= gold < len(options):
            raise CoreError(f"{where}: 'gold' must be an index into the {len(options)} options, got {gold!r}")
    return record


def _examples(bundle: Bundle, name: str, kind: str) -> list[dict[str, Any]]:
    out = []
    # base_eval.py: `for line in open(path)` (text mode: a line ends at \n, \r\n or \r only; str.splitlines()
    # would also cut at U+2028, U+0085 and the like, which JSON strings may hold), json.loads(line.strip()).
    lines = io.StringIO(bundle.read(name), newline=None)
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if text:  # a blank line would stop nanochat (json.loads("")); it holds no example
            where = f"{bundle.where(name)}:{number}"
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise CoreError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
            out.append(_check_example(record, kind, where))
    if not out:
        raise CoreError(f"{bundle.where(name)}: no examples")
    return out


def read_tasks(path: Path, limit: int | None = None) -> list[Task]:
    """Every task of the bundle at `path` (core.yaml's order), each with its examples shuffled as
    nanochat shuffles them and capped to `limit` (None: all). Few-shot examples come from the same
    (capped) examples, so each task needs more than num_fewshot of them."""
    bundle = Bundle(path)
    try:
        entries = _task_entries(bundle)
        baselines = _baselines(bundle, {t["label"] for t in entries})
        tasks = []
        for t in entries:
            if t["label"] not in baselines:
                raise CoreError(f"{bundle.where('eval_meta_data.csv')}: no row for task {t['label']!r} (core.yaml)")
            name = "eval_data/" + t["dataset_uri"]
            data = _examples(bundle, name, t["icl_task_type"])
            total = len(data)
            random.Random(SHUFFLE_SEED).shuffle(data)
            data = data if limit is None else data[:limit]
            shots = t["num_fewshot"][0]
            if len(data) <= shots:
                cap = f" (capped to {limit})" if limit is not None and limit < total else ""
                raise CoreError(
                    f"{bundle.where(name)}: task {t['label']} has {len(data)} examples{cap}, but "
                    f"num_fewshot={shots} needs at least {shots + 1}"
                )
            tasks.append(
                Task(
                    t["label"],
                    t["icl_task_type"],
                    shots,
                    t.get("continuation_delimiter", " "),
                    baselines[t["label"]],
                    data,
                    total,
                )
            )
        return tasks
    finally:
        bundle.close()


def fetch_bundle(downloads: Path, log: Callable[[str], None] = print, *, url: str = BUNDLE_URL) -> Path:
    """eval_bundle.zip under `downloads`, downloaded once from `url`: renamed into place only once every
    task reads (read_tasks), its sha256 recorded beside it (`<file>.sha256`) and checked at every later
    use, so a damaged copy is never scored silently (the upstream hash is not pinned here)."""
    return sources.fetch_recorded(
        url,
        Path(downloads) / BUNDLE_FILE,
        validate=read_tasks,
        offline_hint="pass --core-from <zip or folder>",
        error=CoreError,
        log=log,
    )
