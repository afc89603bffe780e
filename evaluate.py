"""Score a checkpoint: loss, perplexity and bits per byte over a dataset split, HellaSwag, CORE, chat tasks.

    uv run evaluate.py runs/tiny                         # the run's dataset, validation split, all of it
    uv run evaluate.py runs/gpt2 --split train --max-batches 50
    uv run evaluate.py runs/tiny/checkpoints/best --dataset builtin --batch-size 32 --sequence-length 128
    uv run evaluate.py runs/gpt2 --hellaswag [--limit 500]        # HellaSwag acc / acc_norm (downloaded once)
    uv run evaluate.py runs/gpt2 --core [--limit 500]             # DCLM's CORE (bundle downloaded once)
    uv run evaluate.py runs/tiny-instruct --exact-match           # answers to its held-out instructions
    uv run evaluate.py runs/tiny-rl --tasks builtin               # a chat model on checkable tasks: pass@1, ChatCORE
    uv run evaluate.py runs/gpt2-rl --tasks gsm8k=test.jsonl arc-easy=ARC-Easy.parquet mmlu=mmlu/ --samples 8

The dataset is the run's train.json dataset unless --dataset names another. The split is scored
whole, in order, every token but the first a target once; what each figure means: docs/evaluation.md.
Inputs are checked before JAX starts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxgpt import backend, caches
from jaxgpt.checkpoints import layout
from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig
from jaxgpt.conversations.template import TemplateError
from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import TokenizerError
from jaxgpt.evaluation import core, core_bundle, hellaswag
from jaxgpt.evaluation.answers import Questions, check_dataset, exact_match
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.preparation.prepare import default_data_root, prepare_dataset
from jaxgpt.tasks.load import load_tasks
from jaxgpt.tasks.report import report_lines

INPUT_ERRORS = (ConfigError, DataError, TokenizerError, layout.CheckpointError)


def _model(ckpt_dir: Path) -> Any:
    """The checkpoint's model: JAX starts here, after every input check."""
    from jaxgpt.checkpoints.store import load_model

    caches.enable_compile_cache()
    return load_model(ckpt_dir)[0]


def main_hellaswag(args: argparse.Namespace) -> int:
    """evaluate.py --hellaswag: acc and acc_norm over the validation examples (hellaswag.py)."""
    try:
        ckpt_dir, model_cfg, _cfg, tok = layout.checkpoint_run(args.checkpoint, args.data_dir)  # hellaswag.py: why
        path = args.hellaswag_file or hellaswag.fetch_val((args.data_dir or default_data_root()) / "downloads")
        examples = hellaswag.read_examples(path, args.limit)
        model = _model(ckpt_dir)
        from jaxgpt.evaluation.scoring import hellaswag_score

        print(
            f"Checkpoint: {ckpt_dir}\nHellaSwag: {path} ({len(examples):,} examples, {tok.name} tokenizer"
            f"{'' if tok.name == 'gpt2' else f'; llm.c scores with gpt2, so compare with {tok.name} models only'})"
        )
        r = hellaswag_score(model, examples, tok, batch_examples=args.batch_size or 16)
    except INPUT_ERRORS as e:  # HellaSwagError is a DataError
        return refuse(e)
    cut = f"; {r['truncated']:,} cut to the model's context of {model_cfg.context_length}" if r["truncated"] else ""
    print(f"Scored {r['examples']:,} examples (4 endings each, rows padded to {r['row_lengths']} tokens{cut})")
    print(f"hellaswag acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f}")
    return 0


def main_core(args: argparse.Namespace) -> int:
    """evaluate.py --core: each task's accuracy and centred accuracy, and CORE (core.py)."""
    try:
        ckpt_dir, model_cfg, _cfg, tok = layout.checkpoint_run(args.checkpoint, args.data_dir)  # core.py: why
        path = args.core_from or core_bundle.fetch_bundle((args.data_dir or default_data_root()) / "downloads")
        tasks = core_bundle.read_tasks(path, args.limit)
        prepared = core.prepare(tasks, tok, context_length=model_cfg.context_length, vocab_size=model_cfg.vocab_size)
        model = _model(ckpt_dir)
        from jaxgpt.evaluation.scoring import core_score

        print(
            f"Checkpoint: {ckpt_dir}\nCORE: {path} ({len(tasks)} tasks, {tok.name} tokenizer, "
            f"context {model_cfg.context_length})"
        )
        r = core_score(model, prepared, rows_per_call=args.batch_size or 64)
    except INPUT_ERRORS as e:  # CoreError is a DataError
        return refuse(e)
    print("\n".join(core.report(r)))
    return 0


def main_exact_match(args: argparse.Namespace) -> int:
    """evaluate.py --exact-match: greedy answers to a conversation dataset's held-out instructions."""
    try:
        q = Questions.load(args.checkpoint, args.exact_match, args.data_dir, args.limit)
        model = _model(q.ckpt_dir)
        from jaxgpt.conversations.assistant import Assistant

        print(
            f"Checkpoint: {q.ckpt_dir}\nQuestions: {q.dataset.path}/val.jsonl ({len(q.items):,}, template "
            f"{q.template.name!r})"
        )
        r = exact_match(Assistant(model, q.tok, q.template, str(q.ckpt_dir), rows=args.batch_size or 16), q.items)
    except (*INPUT_ERRORS, TemplateError) as e:
        return refuse(e)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in r["rows"]))
    for task, acc in r["tasks"].items():
        print(f"  {task:<12} {acc:.1%}")
    print(f"exact match {r['accuracy']:.4f} ({r['correct']:,} of {r['examples']:,})")
    return 0


def main_tasks(args: argparse.Namespace) -> int:
    """evaluate.py --tasks: a chat checkpoint on checkable tasks through the engine: pass@1 (pass@k), ChatCORE."""
    try:
        ckpt_dir, _model_cfg, _train = layout.checkpoint_configs(args.checkpoint)
        tasks = load_tasks(args.tasks, limit=args.limit, rule=args.rule)
        from jaxgpt.conversations.assistant import Assistant  # JAX starts here, after every input check
        from jaxgpt.evaluation.chat_eval import score_task, too_long

        caches.enable_compile_cache()
        bot = Assistant.load(ckpt_dir, rows=args.batch_size or 64)
        temperature = args.temperature if args.temperature is not None else (0.0 if args.samples == 1 else 1.0)
        params = SamplingParams(args.max_new_tokens, temperature, seed=args.seed)
        print(
            f"Checkpoint: {ckpt_dir} (template {bot.template.name!r}); {args.samples} answer(s) per question, "
            f"temperature {temperature:g}"
        )
        results = {}
        for task in tasks:
            results[task.name] = (score_task(bot, task, params, args.samples), task.baseline)
            if skipped := too_long(bot, task, params):
                print(f"  {task.name}: {skipped:,} prompts leave no room for an answer in the context: counted wrong")
    except (*INPUT_ERRORS, TemplateError) as e:
        return refuse(e)
    print("\n".join(report_lines(results)))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(__doc__)
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument(
        "--dataset",
        default=None,
        help="a dataset source (e.g. builtin) or a prepared dataset folder (default: the run's train.json dataset)",
    )
    parser.add_argument("--split", choices=("train", "val"), default="val")
    parser.add_argument("--max-batches", type=int, default=None, help="score at most this many batches")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the run's microbatch_size")
    parser.add_argument("--sequence-length", type=int, default=None, help="default: the run's sequence_length")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where datasets live (default: $JAXGPT_DATA_DIR, else the repository's data/)",
    )
    _add_benchmark_args(parser)
    return parser


def _add_benchmark_args(parser: argparse.ArgumentParser) -> None:
    """The flags that score something other than the loss: HellaSwag, CORE, exact match."""
    parser.add_argument(
        "--hellaswag",
        action="store_true",
        help="score HellaSwag (validation) instead of the loss; "
        "--batch-size is then examples per device call (default 16)",
    )
    parser.add_argument(
        "--hellaswag-file",
        type=Path,
        default=None,
        help="a local hellaswag_val.jsonl (rowanz format) instead of the download; implies --hellaswag",
    )
    parser.add_argument(
        "--core",
        action="store_true",
        help="score DCLM's CORE (the eval bundle's 22 tasks) instead "
        "of the loss; --batch-size is then rows per device call (default 64)",
    )
    parser.add_argument(
        "--core-from",
        type=Path,
        default=None,
        help="a local eval_bundle.zip or its unpacked folder instead of the download; implies --core",
    )
    parser.add_argument(
        "--exact-match",
        type=Path,
        nargs="?",
        const=Path(""),
        default=None,
        metavar="RUN",
        help="greedy answers to the held-out instructions of a conversation dataset: RUN's (a run dir, "
        "checkpoint or prepared dataset folder; default: the checkpoint's own), with its chat "
        "template; --batch-size is then conversations at once (default 16)",
    )
    parser.add_argument("--out", type=Path, default=None, help="--exact-match: write each answer to this JSONL file")
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="HellaSwag: score the first N examples only; CORE: N examples per task (a quick figure, not "
        "the CORE metric); exact match: N questions; --tasks: N questions per task",
    )
    _add_task_args(parser)


def _add_task_args(parser: argparse.ArgumentParser) -> None:
    """The flags of --tasks: a chat model on checkable tasks (jaxgpt/evaluation/chat_eval.py)."""
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        metavar="TASK",
        help="score a chat checkpoint on checkable tasks: builtin, gsm8k=FILE, arc-easy=FILE, arc-challenge=FILE, "
        "mmlu=FILE_OR_FOLDER, jsonl=FILE (public formats; download_dataset.py tasks fetches them); pass@1, pass@k "
        "and ChatCORE; --batch-size is then the engine's rows (default 64)",
    )
    parser.add_argument("--samples", type=int, default=1, help="--tasks: answers per question, for pass@k (default 1)")
    parser.add_argument(
        "--temperature", type=float, default=None, help="--tasks: 0 with one sample, else 1.0 (default)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="--tasks: longest answer (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="--tasks: answer i draws with seed + i (default 0)")
    parser.add_argument(
        "--rule",
        default="exact",
        help="--tasks: how a jsonl task's answers are scored: exact, exact_nocase, last_number (default exact)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("max_batches", "batch_size", "sequence_length", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} must be >= 1")
    if (args.hellaswag or args.hellaswag_file is not None) and (args.core or args.core_from is not None):
        parser.error("--hellaswag and --core are separate runs: give one of them")
    if args.tasks is not None:
        problem = _check_task_args(args)
        if problem:
            parser.error(problem)
        return main_tasks(args)
    if args.exact_match is not None:
        if str(args.exact_match) in ("", "."):
            args.exact_match = None
        return main_exact_match(args)
    if args.hellaswag or args.hellaswag_file is not None:
        return main_hellaswag(args)
    if args.core or args.core_from is not None:
        return main_core(args)
    return main_loss(args)


def _check_task_args(args: argparse.Namespace) -> str | None:
    """What is wrong with --tasks' flags, in one line (None: nothing)."""
    if args.samples < 1 or args.max_new_tokens < 1 or args.seed < 0:
        return f"--samples={args.samples} and --max-new-tokens={args.max_new_tokens} must be >= 1, --seed >= 0"
    if args.temperature is not None and not 0 <= args.temperature < float("inf"):
        return f"--temperature={args.temperature} must be a finite number >= 0"
    if args.samples > 1 and args.temperature == 0:
        return f"--samples={args.samples} at --temperature 0 draws the same greedy answer {args.samples} times"
    if args.exact_match is not None or args.hellaswag or args.core or args.hellaswag_file or args.core_from:
        return "--tasks is a run of its own: leave out --exact-match, --hellaswag and --core"
    return None


def _loss_dataset(args: argparse.Namespace, cfg: TrainConfig, model_cfg: ModelConfig) -> Path:
    """The dataset --dataset names (a prepared folder or a source), else the run's own, prepared if missing."""
    if args.dataset is not None and (Path(args.dataset) / "manifest.json").is_file():
        return Path(args.dataset)
    same = args.dataset is None or args.dataset == cfg.dataset.source
    # The run's length too: without it a FineWeb(-Edu) dataset would be rebuilt with one train shard.
    length = cfg.planned_tokens(model_cfg) if same else None
    return prepare_dataset(
        args.dataset or cfg.dataset.source,
        cfg.tokenizer,
        args.data_dir or default_data_root(),
        options=cfg.dataset.options if same else None,
        train_tokens=length,
        log=print,
    )


def main_loss(args: argparse.Namespace) -> int:
    """evaluate.py without a benchmark flag: loss, perplexity and bits per byte over a whole split."""
    try:
        ckpt_dir, model_cfg, cfg, tok = layout.checkpoint_run(args.checkpoint, args.data_dir)  # bytes follow its ids
        seq_len = args.sequence_length or cfg.seq_len(model_cfg)
        if seq_len > model_cfg.context_length:
            raise ConfigError(
                f"--sequence-length={seq_len} exceeds the model's context_length={model_cfg.context_length}"
            )
        ds_path = _loss_dataset(args, cfg, model_cfg)
        dataset = open_dataset(ds_path)
        check_dataset(dataset, tok, model_cfg.vocab_size)
        split = dataset.train if args.split == "train" else dataset.val
        model = _model(ckpt_dir)
        from jaxgpt.evaluation.scoring import evaluate, report_line

        print(f"Checkpoint: {ckpt_dir}\nDataset: {ds_path} ({args.split} split, {split.n_tokens:,} tokens)")
        batch_size = args.batch_size or cfg.microbatch_size
        r = evaluate(
            model, tok, split, batch_size=batch_size, seq_len=seq_len, targets=cfg.targets, max_batches=args.max_batches
        )
    except INPUT_ERRORS as e:
        return refuse(e)
    print(report_line(r, args.split, cfg.targets))
    print(f"loss {r['loss']:.4f} | perplexity {r['perplexity']:.3f} | bits per byte {r['bits_per_byte']:.4f}")
    return 0


if __name__ == "__main__":
    backend.prepare_process()  # on the CPU: restarts once with huge-page malloc where that helps
    raise SystemExit(main())
