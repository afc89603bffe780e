"""Prepare a conversation dataset: each conversation rendered with a chat template into token ids
and a per-token loss mask (download_dataset.py conversations | instructions; train.json "dataset").

    path = prepare_conversations("conversations", "gpt2", data_root, options={"paths": ["alpaca.json"]})
    ds = open_dataset(path)     # ds.train.masks, ds.train.conversation_starts: jaxgpt/conversations/rows.py reads them

Sources: "conversations" (Alpaca and chat records from files: files.py; a seeded choice of whole
conversations held out) and "instructions" (the built-in set: instructions.py). Their options
("template", "too_long", "pack", ...): docs/fine-tuning.md "Conversation data". Each shard holds
whole conversations: "tokens", "loss_mask" (uint8, 1 on the answers and their end) and
"conversation_starts" (int64, in the shard); the manifest has "kind": "conversations" and the
template; val.jsonl holds the held-out conversations as messages. Written atomically and reused
while the manifest matches; the fingerprint names the rendering (RENDERING), so a dataset rendered
otherwise is prepared again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from jaxgpt.conversations import files as conversations
from jaxgpt.conversations import instructions
from jaxgpt.conversations.template import ChatTemplate, TemplateError, default_template, template_named
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources.files import files_fingerprint, hold_out_mask
from jaxgpt.data.storage.shards import KIND_CONVERSATIONS, LOSS_MASK, SPLITS, STARTS, DatasetWriter
from jaxgpt.data.tokenizer import Tokenizer

VAL_FILE = "val.jsonl"
TOO_LONG = ("drop", "crop")
SHARD_TOKENS = 1 << 26  # a shard closes at the first conversation past this many tokens
# In every fingerprint: how chat_template.py turns text into ids. Datasets rendered before the text
# between special tokens was encoded whole (transformers' ids) lack it, so they are prepared again, and
# a checkpoint trained on one is not resumed on the new ids (run.py's fingerprint check).
RENDERING = " ids:whole-text"
Conversation = list[dict]


def check_options(source: str, resolved: dict) -> None:
    """Options of the two conversation sources, checked in place (prepare.resolve_options calls it)."""
    if not isinstance(resolved["pack"], bool):
        raise DataError(
            f"{source}: option 'pack' must be true (whole conversations packed into rows) or false (one "
            f"per row), got {resolved['pack']!r}"
        )
    if resolved["too_long"] not in TOO_LONG:
        raise DataError(
            f"{source}: option 'too_long' must be one of {', '.join(map(repr, TOO_LONG))}, got {resolved['too_long']!r}"
        )
    if resolved["template"] is not None:
        try:
            template_named(resolved["template"], f"{source}: option 'template'")
        except TemplateError as e:
            raise DataError(str(e)) from None
    if source == "instructions":
        for key in ("examples", "validation_examples"):
            value = resolved[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DataError(f"instructions: option {key!r} must be a whole number >= 1, got {value!r}")
        if isinstance(resolved["seed"], bool) or not isinstance(resolved["seed"], int) or resolved["seed"] < 0:
            raise DataError(f"instructions: option 'seed' must be a whole number >= 0, got {resolved['seed']!r}")
        instructions.check_tasks(resolved["tasks"])


def corpus(source: str, options: dict) -> tuple[str, Callable[[], Iterator[tuple[bool, str, Conversation]]]]:
    """(fingerprint, read): read() yields (held out?, where, messages) in order, checking every record."""
    if source == "instructions":
        fingerprint = f"instructions-v1-{options['examples']}-{options['validation_examples']}-{options['seed']}"

        def generated() -> Iterator[tuple[bool, str, Conversation]]:
            train, val = instructions.instruction_splits(
                options["examples"], options["validation_examples"], options["seed"], options["tasks"]
            )
            yield from ((True, f"instructions val {i}", c) for i, c in enumerate(val))
            yield from ((False, f"instructions train {i}", c) for i, c in enumerate(train))

        return fingerprint, generated
    files = conversations.find_conversation_files(options["paths"])
    where = f"conversations {' '.join(options['paths'])}"

    def read() -> Iterator[tuple[bool, str, Conversation]]:
        n = sum(1 for _ in conversations.read_conversations(files))  # every record checked before writing
        held = hold_out_mask(n, options["validation_fraction"], where)
        if held is None:
            raise DataError(
                f"{where}: {n} conversation(s) are too few to hold out "
                f"{options['validation_fraction']:.0%} for validation; add more or raise validation_fraction"
            )
        for i, (place, messages) in enumerate(conversations.read_conversations(files)):
            yield bool(held[i]), place, messages

    return files_fingerprint(files), read


class _Shards:
    """One split's rendered conversations, cut into shards of whole conversations."""

    def __init__(self, writer: DatasetWriter, split: str) -> None:
        self.writer, self.split = writer, split
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.n = self.count = self.trained = 0
        self.lengths: list[int] = []

    def add(self, ids: list[int], mask: list[int]) -> None:
        self.ids.append(np.asarray(ids, np.int64))
        self.masks.append(np.asarray(mask, np.uint8))
        self.n += len(ids)
        self.count += 1
        self.trained += int(sum(mask))
        self.lengths.append(len(ids))
        if self.n >= SHARD_TOKENS:
            self.flush()

    def flush(self) -> None:
        if not self.ids:
            return
        starts = np.cumsum([0] + [a.size for a in self.ids[:-1]], dtype=np.int64)
        self.writer.add_shard(
            self.split,
            np.concatenate(self.ids),
            documents=len(self.ids),
            conversations=len(self.ids),
            tensors={LOSS_MASK: np.concatenate(self.masks), STARTS: starts},
        )
        self.ids, self.masks, self.n = [], [], 0

    def close(self) -> dict:
        self.flush()
        lengths = np.asarray(self.lengths or [0])
        return {
            "conversations": self.count,
            "trained_tokens": self.trained,
            "length": {
                "max": int(lengths.max()),
                "mean": round(float(lengths.mean()), 1),
                "p99": int(np.percentile(lengths, 99)),
            },
        }


def write_conversations(
    path: Path,
    *,
    source: str,
    options: dict,
    fingerprint: str,
    tok: Tokenizer,
    template: ChatTemplate,
    records: Iterable[tuple[bool, str, Conversation]],
) -> dict:
    """Render and write every conversation (atomically: see DatasetWriter); returns the manifest."""
    with DatasetWriter.for_tokenizer(path, tok, source=source, options=options, fingerprint=fingerprint) as writer:
        shards = {split: _Shards(writer, split) for split in SPLITS}
        held: list[str] = []
        for is_val, where, messages in records:
            try:
                ids, mask = template.render(tok, messages)
            except TemplateError as e:
                raise DataError(f"{where}: {e}") from None
            if not any(mask):
                raise DataError(f"{where}: every assistant message has weight 0: nothing to train on")
            shards["val" if is_val else "train"].add(ids, mask)
            if is_val:
                held.append(json.dumps({"messages": messages}, ensure_ascii=False))
        for split in SPLITS:
            if not shards[split].count:
                raise DataError(f"{path}: no {split} conversations")
        writer.manifest.update(
            kind=KIND_CONVERSATIONS,
            template=template.to_dict(),
            conversations={split: shards[split].close() for split in SPLITS},
        )
        writer.add_file(VAL_FILE, ("\n".join(held) + "\n").encode("utf-8"))
        return writer.commit()


def resolve_template(options: dict, tok: Tokenizer, source: str) -> ChatTemplate:
    """The dataset's template (its option, or the tokenizer's default), checked against the tokenizer."""
    spec = options["template"] if options["template"] is not None else default_template(tok)
    try:
        template = template_named(spec, f"{source}: option 'template'")
        template.check(tok)
    except TemplateError as e:
        raise DataError(str(e)) from None
    return template


def describe(manifest: dict, path: Path, seconds: float) -> str:
    parts = []
    for split in SPLITS:
        c = manifest["conversations"][split]
        parts.append(
            f"{split} {c['conversations']:,} conversations / {manifest['splits'][split]['tokens']:,} tokens "
            f"({c['trained_tokens']:,} trained on; longest {c['length']['max']:,})"
        )
    return f"wrote {path}: {'; '.join(parts)}; template {manifest['template']['name']!r}; {seconds:.1f} s"


def prepare(
    path: Path,
    source: str,
    tok: Tokenizer,
    options: dict,
    log: Callable[[str], None],
    reuse_problem: Callable[[Path, dict], str | None],
) -> Path:
    """Make sure `path` holds the conversation dataset these options describe (reused when it does)."""
    template = resolve_template(options, tok, source)
    fingerprint, read = corpus(source, options)
    fingerprint += RENDERING
    expected = {
        "source": source,
        "options": options,
        "fingerprint": fingerprint,
        "tokenizer": tok.name,
        "template": template.to_dict(),
    }
    if getattr(tok, "sha256", None) is not None:
        expected["tokenizer_sha256"] = tok.sha256
    problem = reuse_problem(path, expected)
    if problem is None:
        log(f"reusing dataset {path} (manifest matches)")
        return path
    log(f"preparing dataset {path}: {problem}")
    started = time.perf_counter()
    manifest = write_conversations(
        path, source=source, options=options, fingerprint=fingerprint, tok=tok, template=template, records=read()
    )
    log(describe(manifest, path, time.perf_counter() - started))
    return path
