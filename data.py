"""Show a prepared dataset: what it was made from, its tokenizer, each split's tokens, documents
and shards; check every shard's hash; decode a sample of a split.

    uv run data.py data/builtin-bytes                  # a dataset folder (download_dataset.py made it)
    uv run data.py runs/tiny                           # the dataset a run trains on (prepared if missing)
    uv run data.py data/builtin-bytes --verify         # also check every shard's sha256
    uv run data.py runs/tiny --sample 200 --split val  # decode 200 tokens from the start of a split

The code: jaxgpt/data/ (shards.py the format, memory-mapped reading and atomic writing;
batches.py the sampler that feeds training and whole-split validation windows; prepare.py,
sources.py, builtin.py and fineweb.py what download_dataset.py prepares; tokenizer.py). The
format and the sources: docs/data.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import ConfigError, load_run_configs
from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import MANIFEST, SPLITS, Dataset, open_dataset
from jaxgpt.data.tokenizer import TokenizerError, get_tokenizer
from jaxgpt.preparation.prepare import default_data_root, prepare_dataset


def resolve(path: Path, data_root: Path) -> Path:
    """A dataset folder as given, or the one a run directory's train.json trains on (prepared
    as train.py would prepare it, for the run's length)."""
    if (path / MANIFEST).is_file():
        return path
    if (path / "train.json").is_file() or (path / "model.json").is_file():
        model_cfg, train_cfg = load_run_configs(path)
        return prepare_dataset(
            train_cfg.dataset.source,
            train_cfg.tokenizer,
            data_root,
            options=train_cfg.dataset.options,
            train_tokens=train_cfg.planned_tokens(model_cfg),
            log=print,
        )
    raise DataError(f"{path}: neither a dataset folder (no {MANIFEST}) nor a run directory (no train.json)")


def summary(ds: Dataset) -> dict[str, Any]:
    m = ds.manifest
    return {
        "path": str(ds.path),
        "source": m.get("source"),
        "options": m.get("options"),
        "fingerprint": m.get("fingerprint"),
        "tokenizer": ds.tokenizer,
        "vocab_size": ds.vocab_size,
        "eot_id": ds.eot_id,
        "max_token_id": ds.max_token_id,
        "splits": {
            split: {
                "tokens": m["splits"][split]["tokens"],
                "documents": m["splits"][split].get("documents"),
                "shards": len(m["splits"][split]["shards"]),
            }
            for split in SPLITS
        },
    }


def report(s: dict[str, Any]) -> str:
    lines = [
        f"{s['path']}: {s['source']} {json.dumps(s['options'])}, tokenizer {s['tokenizer']} "
        f"(vocab {s['vocab_size']}, end of text {s['eot_id']}, largest id {s['max_token_id']})",
        f"  fingerprint {s['fingerprint']}",
    ]
    for split, e in s["splits"].items():
        docs = f"{e['documents']:,} documents, " if e["documents"] is not None else ""
        lines.append(f"  {split:<5} {e['tokens']:>14,} tokens, {docs}{e['shards']} shard{'s' * (e['shards'] != 1)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    parser.add_argument("path", type=Path, help="a prepared dataset folder, or a run directory")
    parser.add_argument("--verify", action="store_true", help="check every shard's sha256 against the manifest")
    parser.add_argument("--sample", type=int, default=0, metavar="N", help="decode N tokens from the start of --split")
    parser.add_argument("--split", choices=SPLITS, default="train", help="the split --sample reads (default train)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data root for a run's dataset (default: $JAXGPT_DATA_DIR, else the repository's data/)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    if args.sample < 0:
        parser.error(f"--sample={args.sample} must be >= 0")
    try:
        ds = open_dataset(resolve(args.path, args.data_dir or default_data_root()), verify=args.verify)
        s = summary(ds)
        print(json.dumps(s, indent=2) if args.json else report(s))
        if args.verify:
            print(f"verified sha256 of every shard in {ds.path}")
        if args.sample:
            split = ds.train if args.split == "train" else ds.val
            tokens = split.read(0, min(args.sample, split.n_tokens)).tolist()
            print(f"--- the first {len(tokens)} tokens of the {args.split} split, decoded ---")
            print(get_tokenizer(ds.tokenizer, ds.path.parent).decode(tokens))  # a trained one sits beside it
    except (ConfigError, DataError, TokenizerError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
