"""Scoring a model's answers to the held-out conversations of a conversation dataset.

    questions = held_out(dataset)                 # [(prompt messages, reference answer)], val.jsonl's order
    r = exact_match(bot, questions)               # {"accuracy", "correct", "examples", "rows": [...]}

A question is a validation conversation (val.jsonl): the messages up to the last user message are
the prompt, the last assistant message the reference. Exact match compares the greedy answer with
the reference, both stripped: for short answers; free text is judged instead (judge.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxgpt.checkpoints import layout
from jaxgpt.config import TrainConfig, from_json
from jaxgpt.conversations.prepare import VAL_FILE
from jaxgpt.conversations.template import ChatTemplate, template_of
from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import KIND_CONVERSATIONS, Dataset, open_dataset
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.preparation.prepare import default_data_root, prepare_dataset

if TYPE_CHECKING:  # the answering imports JAX: only once every input is checked
    from jaxgpt.conversations.assistant import Assistant

Question = tuple[list[dict[str, Any]], str]


def check_dataset(dataset: Dataset, tok: Tokenizer, vocab_size: int) -> None:
    """The dataset holds the model's tokenizer's ids (for a trained one, of the same file), all in range."""
    if dataset.tokenizer != tok.name:
        raise DataError(f"{dataset.path}: dataset tokenizer {dataset.tokenizer!r} is not the model's {tok.name!r}")
    sha = getattr(tok, "sha256", None)  # a trained tokenizer's file
    if sha is not None and dataset.manifest.get("tokenizer_sha256", sha) != sha:
        raise DataError(
            f"{dataset.path}: prepared with another {tok.name!r} tokenizer file than the checkpoint's "
            f"(sha256 {dataset.manifest['tokenizer_sha256'][:12]}..., checkpoint {sha[:12]}...)"
        )
    if dataset.max_token_id >= vocab_size:
        raise DataError(f"{dataset.path}: token id {dataset.max_token_id} is out of range for vocab_size={vocab_size}")


def conversation_dataset(spec: Path, data_root: Path | None) -> Dataset:
    """The dataset whose held-out conversations are asked: a prepared folder, or a run's (or a
    checkpoint's) train.json dataset, prepared if missing."""
    if (spec / "manifest.json").is_file():
        return open_dataset(spec)
    if (spec / "train.json").is_file():  # a run directory, trained or not
        cfg = from_json(TrainConfig, spec / "train.json")
    else:
        ckpt_dir, _model, train = layout.checkpoint_configs(spec)
        cfg = layout.train_config(train, str(ckpt_dir / "train.json"))
    return open_dataset(
        prepare_dataset(
            cfg.dataset.source, cfg.tokenizer, data_root or default_data_root(), options=cfg.dataset.options, log=print
        )
    )


def held_out(dataset: Dataset, limit: int | None = None) -> list[Question]:
    """(prompt messages, reference) of each held-out conversation, its last answer as the reference."""
    if dataset.manifest.get("kind") != KIND_CONVERSATIONS:
        raise DataError(
            f"{dataset.path}: not a conversation dataset (source {dataset.manifest.get('source')!r}); "
            f"answers are scored on the held-out conversations of one"
        )
    path = Path(dataset.path) / VAL_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(f"{path}: unreadable ({e.strerror or e}); prepare the dataset again") from None
    out: list[Question] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f"{path}:{number}: not a held-out conversation (corrupt; prepare the dataset again)"
            ) from None
        out.append((messages[:-1], messages[-1]["content"]))
        if limit is not None and len(out) >= limit:
            break
    return out


@dataclass(frozen=True)
class Questions:
    """A checkpoint and the held-out questions it is asked (evaluate.py --exact-match, judge.py)."""

    ckpt_dir: Path
    tok: Tokenizer
    template: ChatTemplate  # the checkpoint's own, else its questions' dataset's (a base model asked)
    dataset: Dataset
    items: list[Question]

    @classmethod
    def load(cls, checkpoint: Path, source: Path | None, data_root: Path | None, limit: int | None) -> Questions:
        """`checkpoint` asked the held-out conversations of `source`'s dataset (None: its own), no JAX."""
        ckpt_dir, model_cfg, _cfg, tok = layout.checkpoint_run(checkpoint, data_root)
        dataset = conversation_dataset(source or ckpt_dir, data_root)
        check_dataset(dataset, tok, model_cfg.vocab_size)
        template = template_of(ckpt_dir, dataset.manifest, f"{dataset.path}/manifest.json")
        return cls(ckpt_dir, tok, template, dataset, held_out(dataset, limit))


def task_of(messages: list[dict[str, Any]]) -> str:
    """A label for grouping results: the last user message's first word (the built-in tasks' verbs)."""
    words = messages[-1]["content"].split()
    return words[0] if words else ""


def exact_match(bot: Assistant, questions: list[Question]) -> dict[str, Any]:
    """Greedy answers to every question (drawn together in the bot's engine rows), compared with the references."""
    from jaxgpt.generation.sampling import SamplingParams

    longest = max(len(bot.tok.encode(ref)) for _, ref in questions)
    answers = bot.answer_all([m for m, _ in questions], SamplingParams(max_tokens=2 * longest + 8, temperature=0.0))
    rows = [
        {
            "prompt": m[-1]["content"],
            "reference": ref,
            "answer": a,
            "correct": a.strip() == ref.strip(),
            "task": task_of(m),
        }
        for (m, ref), a in zip(questions, answers)
    ]
    correct = sum(r["correct"] for r in rows)
    totals, hits = Counter(r["task"] for r in rows), Counter(r["task"] for r in rows if r["correct"])
    return {
        "accuracy": correct / len(rows),
        "correct": correct,
        "examples": len(rows),
        "rows": rows,
        "tasks": {t: hits[t] / n for t, n in sorted(totals.items())},
    }
