"""Prepare a tokenized training corpus on disk (train/val safetensors shards + manifest.json).

Usage:
    uv run download_dataset.py builtin [--tokenizer gpt2]          # offline corpus -> data/builtin-bytes
    uv run download_dataset.py text ~/books notes/*.md dump.jsonl  # local text -> data/text-books-bytes
    uv run download_dataset.py tinyshakespeare [--from input.txt]  # -> data/tinyshakespeare-bytes
    uv run download_dataset.py fineweb10B-gpt2 --train-tokens 1e9  # -> data/fineweb10B-gpt2-gpt2
    uv run download_dataset.py conversations alpaca.json chats.jsonl --tokenizer gpt2   # instruction data + loss mask
    uv run download_dataset.py instructions                        # the built-in instruction set (no download)
    uv run download_dataset.py run runs/gpt2-small                 # what train.py would prepare for that run
    uv run download_dataset.py tasks                               # GSM8K, ARC-Easy/Challenge, MMLU test files
    uv run download_dataset.py text corpus/ --tokenizer gpt2 --name mine --validation-fraction 0.1 --verify

The sources, their options and the format: docs/data.md. `tasks` fetches the public evaluation
files into <data>/downloads/tasks/ (jaxgpt/tasks/download.py). The data root is --data-dir, else
$JAXGPT_DATA_DIR, else the repository's data/ folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxgpt.config import ConfigError, load_run_configs
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources import fineweb, fineweb_edu
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import TokenizerError
from jaxgpt.preparation import bpe
from jaxgpt.preparation.prepare import FINEWEB, FINEWEB_EDU, TINYSHAKESPEARE_SPLITS, default_data_root, prepare_dataset
from jaxgpt.tasks import download as task_files


def _count(text: str) -> int:
    """A token count such as 1000000 or 1e9."""
    value = float(text)
    if not value.is_integer() or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--data-dir", type=Path, default=None, help="data root (default: $JAXGPT_DATA_DIR or <project>/data)"
    )
    common = argparse.ArgumentParser(add_help=False, parents=[where])
    common.add_argument("--verify", action="store_true", help="afterwards, check every shard's sha256")
    split = argparse.ArgumentParser(add_help=False)
    split.add_argument(
        "--validation-fraction",
        type=float,
        default=None,
        help="share held out for validation (default: 0.05; tinyshakespeare 0.1)",
    )
    tokenized = argparse.ArgumentParser(add_help=False, parents=[common, split])
    tokenized.add_argument(
        "--tokenizer",
        default="bytes",
        help="bytes (default), gpt2, or the name of a trained tokenizer (the tokenizer command)",
    )
    parser = argparse.ArgumentParser(
        description="Tokenize a corpus into train/val safetensors shards (reused when already prepared).",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    _text_sources(sub, tokenized)
    _web_sources(sub, common)
    _conversation_sources(sub, tokenized)
    run = sub.add_parser("run", parents=[common], help="the dataset a run's train.json names, for its length")
    run.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    run.add_argument(
        "--from",
        dest="from_path",
        type=Path,
        default=None,
        help="a local copy of a downloadable source (tinyshakespeare file, FineWeb .bin folder, "
        "FineWeb-Edu .parquet folder)",
    )
    _tokenizer_command(sub, where, split)
    _tasks_command(sub, where)
    return parser


def _tasks_command(sub: argparse._SubParsersAction, where: argparse.ArgumentParser) -> None:
    """`download_dataset.py tasks [NAME ...]`: the public evaluation files, as published."""
    tasks = sub.add_parser(
        "tasks", parents=[where], help="the public task files for evaluate.py --tasks (as published)"
    )
    tasks.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"any of {', '.join(task_files.PUBLIC)} (default: {', '.join(task_files.DEFAULT)})",
    )


def _download_tasks(names: list[str], data_root: Path) -> None:
    """`download_dataset.py tasks [NAME ...]`: each file fetched once, then the --tasks words reading them."""
    paths = task_files.fetch_tasks(names, data_root / "downloads")
    for name, path in paths.items():
        print(f"{name}: {path}")
    if task_files.tasks_argument(paths):
        print(f"evaluate with: --tasks {task_files.tasks_argument(paths)}")


def _web_sources(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """FineWeb (GPT-2 ids) and FineWeb-Edu (text): downloaded for the length asked."""
    for source, unit, what, folder in (
        (
            FINEWEB,
            "100M-token train files",
            "FineWeb-10B as GPT-2 tokens (llm.c .bin files)",
            "a folder holding the .bin files (e.g. modded-nanogpt's data/fineweb10B)",
        ),
        (
            FINEWEB_EDU,
            "train shards",
            "FineWeb-Edu text (nanochat's parquet shards), tokenized here, resumable",
            "a folder holding shard_NNNNN.parquet files (read in place)",
        ),
    ):
        web = sub.add_parser(source, parents=[common], help=what)
        if source == FINEWEB_EDU:
            web.add_argument(
                "--tokenizer", default="gpt2", help="gpt2 (default), bytes, or the name of a trained tokenizer"
            )
        most = fineweb.N_TRAIN_FILES if source == FINEWEB else fineweb_edu.N_TRAIN_FILES
        size = web.add_mutually_exclusive_group()
        size.add_argument(
            "--train-tokens",
            type=_count,
            default=None,
            help=f"take {unit} in order until they hold this many tokens (default: 1)",
        )
        size.add_argument("--train-shards", type=int, default=None, help=f"take exactly this many {unit} (1..{most})")
        web.add_argument("--from", dest="from_path", type=Path, default=None, help=folder)


def _tokenizer_command(
    sub: argparse._SubParsersAction, where: argparse.ArgumentParser, split: argparse.ArgumentParser
) -> None:
    """`download_dataset.py tokenizer NAME SOURCE`: a BPE trained on a source's train split."""
    trainer = argparse.ArgumentParser(add_help=False, parents=[where])
    trainer.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        help=f"tokens in all, end-of-text included ({bpe.MIN_VOCAB}..{bpe.MAX_VOCAB})",
    )
    trainer.add_argument("--force", action="store_true", help="replace a different tokenizer of that name")
    tok = sub.add_parser("tokenizer", help="train a byte-level BPE on a source's train split (docs/tokenizers.md)")
    tok.add_argument(
        "tokenizer_name", metavar="NAME", help='saved as <data>/tokenizers/NAME; train.json "tokenizer": NAME uses it'
    )
    corpora = tok.add_subparsers(dest="corpus", required=True, metavar="SOURCE")
    _text_sources(corpora, argparse.ArgumentParser(add_help=False, parents=[trainer, split]))
    edu = corpora.add_parser(FINEWEB_EDU, parents=[trainer], help="FineWeb-Edu's first train shards, as nanochat")
    edu.add_argument(
        "--from",
        dest="from_path",
        type=Path,
        default=None,
        help="a folder holding shard_NNNNN.parquet files (read in place)",
    )
    for key, meaning in ("max_chars", "characters to train on in all"), ("doc_cap", "characters kept of each document"):
        edu.add_argument(
            f"--{key.replace('_', '-')}",
            type=_count,
            default=None,
            help=f"{meaning} (default: {bpe.EDU_OPTIONS[key]:,}, nanochat's)",
        )


def _text_sources(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    """The sources of text documents: for preparing a dataset, and for training a tokenizer on."""
    sub.add_parser("builtin", parents=[parent], help="offline corpus of Python's own documentation")
    text = sub.add_parser("text", parents=[parent], help="local .txt/.md/.jsonl/.parquet files, folders or globs")
    text.add_argument("paths", nargs="+", help="files, folders (searched recursively) or quoted globs")
    text.add_argument("--text-column", default=None, help="the string column of .parquet files (default: text)")
    text.add_argument(
        "--name", default=None, help="dataset folder text-<name>-<tokenizer> (default: the first path's name)"
    )
    shakespeare = sub.add_parser("tinyshakespeare", parents=[parent], help="the 1.1 MB char-rnn corpus")
    shakespeare.add_argument(
        "--from", dest="from_path", type=Path, default=None, help="a local copy of input.txt instead of downloading it"
    )
    shakespeare.add_argument(
        "--split",
        choices=TINYSHAKESPEARE_SPLITS,
        default=None,
        help="nanogpt (default): nanoGPT's exact cut, no end-of-text; newline: cut at the "
        "next newline, end-of-text after each part",
    )


def _template(text: str) -> str | dict:
    """--template: a built-in template's name, or a JSON file holding a template object."""
    if Path(text).suffix.lower() != ".json":
        return text
    try:
        return json.loads(Path(text).read_text())
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text}: not a readable JSON template ({e})") from None


def _conversation_sources(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    """The instruction fine-tuning sources: conversations rendered with a chat template, plus a loss mask."""
    chat = argparse.ArgumentParser(add_help=False, parents=[parent])
    chat.add_argument(
        "--template",
        type=_template,
        default=None,
        help="alpaca, nanochat, or a .json file holding a template (default: nanochat for a tokenizer "
        "trained here, else alpaca; docs/fine-tuning.md)",
    )
    chat.add_argument(
        "--too-long",
        choices=("drop", "crop"),
        default=None,
        help="what training does with a conversation longer than a row (default: drop)",
    )
    conv = sub.add_parser("conversations", parents=[chat], help="Alpaca and chat records (.json/.jsonl/.parquet)")
    conv.add_argument("paths", nargs="+", help="files, folders (searched recursively) or quoted globs")
    conv.add_argument(
        "--name", default=None, help="dataset folder conversations-<name>-<tokenizer> (default: the first path's name)"
    )
    ins = sub.add_parser("instructions", parents=[chat], help="the built-in instruction set with checkable answers")
    ins.add_argument("--examples", type=_count, default=None, help="training conversations (default 20,000)")
    ins.add_argument("--validation-examples", type=_count, default=None, help="held-out ones (default 500)")
    ins.add_argument("--seed", type=int, default=None, help="which conversations (default 0)")


def _request(args: argparse.Namespace) -> tuple[str, str, dict, int | None]:
    """(source, tokenizer, options, train_tokens) from the command line; only options given are passed."""
    if args.source == "run":
        model_cfg, train_cfg = load_run_configs(args.run_dir)
        return (
            train_cfg.dataset.source,
            train_cfg.tokenizer,
            train_cfg.dataset.options,
            train_cfg.planned_tokens(model_cfg),
        )
    if args.source == FINEWEB:
        options = {} if args.train_shards is None else {"train_shards": args.train_shards}
        return FINEWEB, "gpt2", options, args.train_tokens
    if args.source == FINEWEB_EDU:
        options = {} if args.train_shards is None else {"train_shards": args.train_shards}
        return FINEWEB_EDU, args.tokenizer, options, args.train_tokens
    source = args.corpus if args.source == "tokenizer" else args.source
    if source == FINEWEB_EDU:  # the tokenizer command's
        return source, "", {k: getattr(args, k) for k in bpe.EDU_OPTIONS if getattr(args, k) is not None}, None
    options = {} if args.validation_fraction is None else {"validation_fraction": args.validation_fraction}
    if getattr(args, "split", None) is not None:
        options["split"] = args.split
    if source in ("text", "conversations"):
        options["paths"] = args.paths
        if args.name is not None:
            options["name"] = args.name
    if source == "text" and args.text_column is not None:
        options["text_column"] = args.text_column
    if source in ("conversations", "instructions"):
        given = {"template": args.template, "too_long": args.too_long}
        if source == "instructions":
            given |= {"examples": args.examples, "validation_examples": args.validation_examples, "seed": args.seed}
        options |= {k: v for k, v in given.items() if v is not None}
    return source, getattr(args, "tokenizer", ""), options, None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data_root = args.data_dir if args.data_dir is not None else default_data_root()
    try:
        if args.source == "tasks":
            _download_tasks(args.names, data_root)
            return 0
        source, tokenizer, options, train_tokens = _request(args)
        if args.source == "tokenizer":
            bpe.train_tokenizer(
                args.tokenizer_name,
                source,
                data_root,
                vocab_size=args.vocab_size,
                options=options,
                from_path=getattr(args, "from_path", None),
                force=args.force,
            )
            return 0
        path = prepare_dataset(
            source,
            tokenizer,
            data_root,
            options=options,
            train_tokens=train_tokens,
            from_path=getattr(args, "from_path", None),
        )
        if args.verify:
            open_dataset(path, verify=True)
            print(f"verified sha256 of every shard in {path}")
    except (DataError, TokenizerError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # writes are atomic: a half-written dataset was removed on the way out
        print("interrupted: no half-written dataset was kept (run the command again to prepare it)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
