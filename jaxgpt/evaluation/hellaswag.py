"""HellaSwag accuracy, scored as llm.c's dev/data/hellaswag.py scores it, batched on the device.

    path = fetch_val(data_root / "downloads")            # downloaded once, or --hellaswag-file
    examples = read_examples(path, limit=500)            # rowanz jsonl: ctx, endings (4), label
    r = evaluate.hellaswag_score(model, examples, get_tokenizer("gpt2"))   # {"acc", "acc_norm", ...}

Each example is 4 rows, context + " " + ending, the loss summed over the ending's tokens only;
`acc` is the share of examples whose lowest summed loss is the labelled ending's, `acc_norm` the
same by mean loss per token. Figures compare with llm.c's only with the `gpt2` tokenizer. A row
longer than the context keeps its last context_length tokens, and the result counts the examples
cut. Rows are padded to 32, 64, 128, ... tokens: one program per length. Pure numpy and the
standard library (jaxgpt/training/run.py reads the file before JAX starts); the device loop is
scoring.hellaswag_score. More: docs/evaluation.md "HellaSwag".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import files as sources
from jaxgpt.data.tokenizer import Tokenizer

VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VAL_FILE = "hellaswag_val.jsonl"
N_VAL = 10_042  # examples in the validation file: a download with any other count is refused
_MIN_BUCKET = 32


class HellaSwagError(DataError):
    """A missing, unreadable or malformed HellaSwag file (one line naming the file and line)."""


@dataclass(frozen=True)
class Example:
    ctx: str
    endings: tuple[str, str, str, str]
    label: int  # index of the right ending


# ----------------------------------------------------------------------------- the file


def _parse(line: bytes, where: str) -> Example:
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HellaSwagError(f"{where}: not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise HellaSwagError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise HellaSwagError(f"{where}: expected a JSON object, got {type(record).__name__}")
    ctx, endings, label = record.get("ctx"), record.get("endings"), record.get("label")
    if not isinstance(ctx, str):
        raise HellaSwagError(f"{where}: 'ctx' must be a string, got {ctx!r:.60}")
    if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) and e for e in endings)):
        raise HellaSwagError(f"{where}: 'endings' must be a list of 4 non-empty strings, got {endings!r:.80}")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < 4:
        raise HellaSwagError(f"{where}: 'label' must be an integer 0..3, got {label!r}")
    return Example(ctx, tuple(endings), label)  # type: ignore[arg-type]


def read_examples(path: Path, limit: int | None = None) -> list[Example]:
    """The first `limit` (default: all) examples of a rowanz-format jsonl file, in file order;
    blank lines are skipped; anything else malformed is a HellaSwagError naming file:line."""
    path = Path(path)
    examples: list[Example] = []
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if limit is not None and len(examples) >= limit:
                    break
                if line.strip():
                    examples.append(_parse(line, f"{path}:{number}"))
    except FileNotFoundError:
        raise HellaSwagError(f"{path}: HellaSwag file not found") from None
    except IsADirectoryError:
        raise HellaSwagError(f"{path}: is a directory, not a HellaSwag jsonl file") from None
    if not examples:
        raise HellaSwagError(f"{path}: no examples")
    return examples


def fetch_val(downloads: Path, log: Callable[[str], None] = print, *, url: str = VAL_URL, n_val: int = N_VAL) -> Path:
    """The validation file under `downloads`, downloaded once from `url`.

    The download goes to a temporary name and is renamed into place only once it parses into
    exactly `n_val` examples; its sha256 is then recorded beside it (`<file>.sha256`) and checked at
    every later use, so a truncated or edited copy is never scored silently. (The upstream file's
    hash is not pinned here: it could not be checked offline when this was written.)
    """

    def validate(tmp: Path) -> None:
        n = len(read_examples(tmp))
        if n != n_val:
            raise HellaSwagError(f"{url}: {n} examples downloaded, expected {n_val}; the address may have changed")

    return sources.fetch_recorded(
        url,
        Path(downloads) / VAL_FILE,
        validate=validate,
        offline_hint="pass --hellaswag-file <file>",
        error=HellaSwagError,
        log=log,
    )


# ----------------------------------------------------------------------------- rows


def render(example: Example, tok: Tokenizer, context_length: int) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
    """llm.c's render_example: per ending, the ids of context + " " + ending and a 0/1 mask over the
    ending's ids; rows longer than context_length keep their last context_length ids. Returns
    (4 rows, 4 masks, whether any row was cut)."""
    ctx = tok.encode(example.ctx)
    rows, masks, cut = [], [], False
    for ending in example.endings:
        end = tok.encode(" " + ending)
        row = np.asarray(ctx + end, np.int32)[-context_length:]
        mask = np.asarray([0] * len(ctx) + [1] * len(end), np.float32)[-context_length:]
        cut |= len(ctx) + len(end) > context_length
        rows.append(row)
        masks.append(mask)
    return rows, masks, cut


def bucket(length: int, context_length: int) -> int:
    """The padded row length for a row of `length` ids: 32, 64, 128, ..., at most the context."""
    size = _MIN_BUCKET
    while size < length:
        size *= 2
    return min(size, context_length)


def batches(
    examples: list[Example], tok: Tokenizer, *, context_length: int, vocab_size: int, batch_examples: int
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], dict[str, Any]]:
    """The device calls: (example indices, (4E, T) int32 rows, (4E, T) float32 masks) per call, E =
    batch_examples, rows of examples of one padded length T together, the last call of a length
    filled with empty rows (so each length is one shape); and facts about them for the report."""
    rendered = [render(ex, tok, context_length) for ex in examples]
    top = max(int(r.max()) for rows, _m, _c in rendered for r in rows)
    if top >= vocab_size:  # before any compile: an out-of-range id would be read silently
        raise HellaSwagError(
            f"HellaSwag: token id {top} of the {tok.name} tokenizer is out of range for the "
            f"model's vocab_size={vocab_size}"
        )
    sizes = np.array([bucket(max(len(r) for r in rows), context_length) for rows, _m, _c in rendered])
    E = min(batch_examples, len(examples))
    calls = []
    for size in np.unique(sizes):  # order does not matter: each example is scored alone
        order = np.flatnonzero(sizes == size)
        for chunk in (order[i : i + E] for i in range(0, len(order), E)):
            tokens, mask = np.zeros((4 * E, int(size)), np.int32), np.zeros((4 * E, int(size)), np.float32)
            for slot, e in enumerate(chunk):
                for j, (row, m) in enumerate(zip(*rendered[e][:2])):
                    tokens[4 * slot + j, : len(row)], mask[4 * slot + j, : len(m)] = row, m
            calls.append((chunk, tokens, mask))
    info = {"truncated": sum(c for _r, _m, c in rendered), "row_lengths": sorted(int(s) for s in np.unique(sizes))}
    return calls, info


def accuracy(examples: list[Example], sums: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    """acc (lowest summed ending loss) and acc_norm (lowest mean per ending token) from the (n, 4)
    summed losses and token counts, with the figures behind them."""
    labels = np.array([ex.label for ex in examples])
    means = sums / counts
    pred, pred_norm = sums.argmin(1), means.argmin(1)  # ties: the first, as torch's argmin in llm.c
    return {
        "acc": float((pred == labels).mean()),
        "acc_norm": float((pred_norm == labels).mean()),
        "examples": len(examples),
        "sum_losses": sums,
        "mean_losses": means,
        "pred": pred,
        "pred_norm": pred_norm,
    }
