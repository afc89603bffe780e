"""Prepare a tokenized training corpus on disk (train/val safetensors shards + manifest.json).

Usage:
    uv run download_dataset.py builtin [--tokenizer gpt2]          # offline corpus -> data/builtin-bytes
    uv run download_dataset.py text ~/books notes/*.md dump.jsonl  # local text -> data/text-books-bytes
    uv run download_dataset.py tinyshakespeare [--from input.txt]  # -> data/tinyshakespeare-bytes
    uv run download_dataset.py fineweb10B-gpt2 --train-tokens 1e9  # -> data/fineweb10B-gpt2-gpt2
    uv run download_dataset.py run runs/gpt2-small                 # what train.py would prepare for that run
    uv run download_dataset.py text corpus/ --tokenizer gpt2 --name mine --validation-fraction 0.1 --verify

The sources, their options and the format: docs/data.md; the code: jaxgpt/data/ (prepare.py).
The data root is --data-dir, else $JAXGPT_DATA_DIR, else the repository's data/ folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxgpt.config import ConfigError, load_run_configs
from jaxgpt.data import fineweb
from jaxgpt.data.prepare import FINEWEB, TINYSHAKESPEARE_SPLITS, default_data_root, prepare_dataset
from jaxgpt.data.shards import DataError, open_dataset
from jaxgpt.data.tokenizer import TOKENIZER_NAMES, TokenizerError


def _count(text: str) -> int:
    """A token count such as 1000000 or 1e9."""
    value = float(text)
    if not value.is_integer() or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, default=None,
                        help="data root (default: $JAXGPT_DATA_DIR or <project>/data)")
    common.add_argument("--verify", action="store_true", help="afterwards, check every shard's sha256")
    tokenized = argparse.ArgumentParser(add_help=False, parents=[common])
    tokenized.add_argument("--tokenizer", choices=TOKENIZER_NAMES, default="bytes", help="default: bytes")
    tokenized.add_argument("--validation-fraction", type=float, default=None,
                           help="share held out for validation (default: 0.05; tinyshakespeare 0.1)")
    parser = argparse.ArgumentParser(description="Tokenize a corpus into train/val safetensors shards "
                                     "(reused when already prepared).", epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    sub.add_parser("builtin", parents=[tokenized], help="offline corpus of Python's own documentation")
    text = sub.add_parser("text", parents=[tokenized], help="local .txt/.md/.jsonl files, folders or globs")
    text.add_argument("paths", nargs="+", help="files, folders (searched recursively) or quoted globs")
    text.add_argument("--name", default=None,
                      help="dataset folder text-<name>-<tokenizer> (default: the first path's name)")
    shakespeare = sub.add_parser("tinyshakespeare", parents=[tokenized], help="the 1.1 MB char-rnn corpus")
    shakespeare.add_argument("--from", dest="from_path", type=Path, default=None,
                             help="a local copy of input.txt instead of downloading it")
    shakespeare.add_argument("--split", choices=TINYSHAKESPEARE_SPLITS, default=None,
                             help="nanogpt (default): nanoGPT's exact cut, no end-of-text; newline: cut at the "
                                  "next newline, end-of-text after each part")
    web = sub.add_parser(FINEWEB, parents=[common], help="FineWeb-10B as GPT-2 tokens (llm.c .bin files)")
    size = web.add_mutually_exclusive_group()
    size.add_argument("--train-tokens", type=_count, default=None,
                      help="take as many 100M-token train files as this many tokens need (default: 1 file)")
    size.add_argument("--train-shards", type=int, default=None,
                      help=f"take exactly this many train files (1..{fineweb.N_TRAIN_FILES})")
    web.add_argument("--from", dest="from_path", type=Path, default=None,
                     help="a folder holding the .bin files (e.g. modded-nanogpt's data/fineweb10B)")
    run = sub.add_parser("run", parents=[common], help="the dataset a run's train.json names, for its length")
    run.add_argument("run_dir", type=Path, help="run directory with model.json and train.json")
    run.add_argument("--from", dest="from_path", type=Path, default=None,
                     help="a local copy of a downloadable source (tinyshakespeare file, FineWeb .bin folder)")
    return parser


def _request(args: argparse.Namespace) -> tuple[str, str, dict, int | None]:
    """(source, tokenizer, options, train_tokens) from the command line; only options given are passed."""
    if args.source == "run":
        model_cfg, train_cfg = load_run_configs(args.run_dir)
        tokens = train_cfg.total_steps(model_cfg) * train_cfg.tokens_per_step(model_cfg)
        return train_cfg.dataset.source, train_cfg.tokenizer, train_cfg.dataset.options, tokens
    if args.source == FINEWEB:
        options = {} if args.train_shards is None else {"train_shards": args.train_shards}
        return FINEWEB, "gpt2", options, args.train_tokens
    options = {} if args.validation_fraction is None else {"validation_fraction": args.validation_fraction}
    if getattr(args, "split", None) is not None:
        options["split"] = args.split
    if args.source == "text":
        options["paths"] = args.paths
        if args.name is not None:
            options["name"] = args.name
    return args.source, args.tokenizer, options, None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data_root = args.data_dir if args.data_dir is not None else default_data_root()
    try:
        source, tokenizer, options, train_tokens = _request(args)
        path = prepare_dataset(source, tokenizer, data_root, options=options, train_tokens=train_tokens,
                               from_path=getattr(args, "from_path", None))
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
