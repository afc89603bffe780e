"""Export a modern-recipe run as transformers' `nanochat` model type, and import such a folder back.

    uv run convert_hf.py export runs/<name> out/      # checkpoint, latest/best link or run dir -> out/
    uv run convert_hf.py import out/ runs/<new>       # -> runs/<new>/{model.json, train.json, pretrained/}

    python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('out')"  # torch
    vllm serve out/                                   # vLLM's Transformers backend (untested: no vLLM here)

What maps, what is refused and why: jaxgpt/interop/nanochat_hf.py and docs (transformers export).
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxgpt.checkpoints.layout import CheckpointError
from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import MODEL_FILE, TRAIN_FILE, ConfigError
from jaxgpt.data.tokenizer import TokenizerError
from jaxgpt.interop.nanochat_hf import ConversionError, export_run, import_run


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="checkpoint or run directory -> transformers nanochat folder")
    exp.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    exp.add_argument("out_dir", type=Path)
    exp.add_argument("--force", action="store_true", help="overwrite an existing export")
    imp = sub.add_parser("import", help="transformers nanochat folder -> run directory")
    imp.add_argument("hf_folder", type=Path, help="folder holding config.json, model.safetensors, tokenizer.json")
    imp.add_argument("run_dir", type=Path)
    imp.add_argument(
        "--tokenizer-name", default=None, help="train.json name for a trained tokenizer (default: the folder's name)"
    )
    imp.add_argument("--force", action="store_true", help="overwrite model.json, train.json and pretrained/")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            out = export_run(args.checkpoint, args.out_dir, force=args.force)
            print(
                f"Exported {args.checkpoint} -> {out}\n"
                f"transformers: AutoModelForCausalLM.from_pretrained({str(out)!r}), AutoTokenizer likewise\n"
                f"vLLM:         vllm serve {out}   (untested: vLLM does not run on this project's machines)"
            )
        else:
            init = import_run(args.hf_folder, args.run_dir, force=args.force, tokenizer_name=args.tokenizer_name)
            cfg = json.loads((init / MODEL_FILE).read_text())
            tokenizer = json.loads((args.run_dir / TRAIN_FILE).read_text())["tokenizer"]
            print(
                f"Imported {args.hf_folder}: {cfg['n_layers']} layers, {cfg['emb_dim']} dims, {cfg['n_heads']} "
                f"heads ({cfg['n_kv_heads'] or cfg['n_heads']} key/value), vocab {cfg['vocab_size']}, context "
                f"{cfg['context_length']}, tokenizer {tokenizer!r} -> {init}\n"
                f"Sample:    uv run test_generation.py {args.run_dir}\n"
                f"Evaluate:  uv run evaluate.py {args.run_dir}\n"
                f"Fine-tune: uv run train.py {args.run_dir}   (edit {args.run_dir / TRAIN_FILE} first)"
            )
    except (ConversionError, ConfigError, CheckpointError, TokenizerError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
