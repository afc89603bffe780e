"""Import OpenAI GPT-2 weights (Hugging Face layout) into a run directory, and export them back.

    uv run import_gpt2.py import gpt2 runs/gpt2                      # fetch openai-community/gpt2 (network)
    uv run import_gpt2.py import gpt2-xl runs/gpt2-xl                # gpt2, gpt2-medium, gpt2-large, gpt2-xl
    uv run import_gpt2.py import path/to/model.safetensors runs/gpt2 # offline: a local file (or its folder)
    uv run import_gpt2.py export runs/my-run exported/               # -> exported/: model.safetensors, config.json,
                                                                     #    tokenizer.json, tokenizer_config.json

What an import writes and how the weights map: jaxgpt/interop/gpt2.py and docs/evaluation.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxgpt.checkpoints.layout import CheckpointError
from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import MODEL_FILE, TRAIN_FILE, ConfigError
from jaxgpt.interop.gpt2 import VARIANTS, WeightsError, export_run, import_run


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="GPT-2 safetensors (file or variant name) -> run directory")
    imp.add_argument("source", help=f"model.safetensors, a folder holding one, or {', '.join(VARIANTS)}")
    imp.add_argument("run_dir", type=Path)
    imp.add_argument("--n-heads", type=int, default=None, help="attention heads (default: see above)")
    imp.add_argument("--tokenizer", choices=("gpt2", "bytes"), default="gpt2", help="for train.json (default gpt2)")
    imp.add_argument("--force", action="store_true", help="overwrite model.json, train.json and pretrained/")
    exp = sub.add_parser("export", help="checkpoint or run directory -> Hugging Face GPT-2 folder")
    exp.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    exp.add_argument("out_dir", type=Path)
    exp.add_argument("--force", action="store_true", help="overwrite an existing export")
    args = parser.parse_args(argv)
    if args.command == "import" and args.n_heads is not None and args.n_heads < 1:
        parser.error(f"--n-heads={args.n_heads} must be >= 1")
    try:
        if args.command == "import":
            init = import_run(
                args.source, args.run_dir, n_heads=args.n_heads, tokenizer=args.tokenizer, force=args.force
            )
            cfg = json.loads((init / MODEL_FILE).read_text())
            print(
                f"Imported {args.source}: {cfg['n_layers']} layers, {cfg['emb_dim']} dims, {cfg['n_heads']} heads, "
                f"vocab {cfg['vocab_size']}, context {cfg['context_length']}, "
                f"{'tied' if cfg['tie_embeddings'] else 'untied'} embeddings -> {init}\n"
                f"Sample:    uv run test_generation.py {args.run_dir}\n"
                f"Evaluate:  uv run evaluate.py {args.run_dir}\n"
                f"Fine-tune: uv run train.py {args.run_dir}   (edit {args.run_dir / TRAIN_FILE} first)"
            )
        else:
            target = export_run(args.checkpoint, args.out_dir, force=args.force)
            print(
                f"Exported {args.checkpoint} -> {target} (+ config.json and the tokenizer); "
                f"transformers.AutoTokenizer.from_pretrained({str(args.out_dir)!r}) reads the tokenizer; "
                f"GPT2LMHeadModel.from_pretrained needs torch (untested here, as vLLM is)"
            )
    except (WeightsError, ConfigError, CheckpointError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
