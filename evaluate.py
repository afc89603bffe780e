"""Loss, perplexity and bits per byte of a checkpoint over a dataset split.

    uv run evaluate.py runs/tiny                         # the run's dataset, validation split, all of it
    uv run evaluate.py runs/gpt2 --split train --max-batches 50
    uv run evaluate.py runs/tiny/checkpoints/best --dataset builtin --batch-size 32 --sequence-length 128
    uv run evaluate.py runs/tiny --dataset data/builtin-bytes     # a prepared dataset folder
    uv run evaluate.py runs/gpt2 --hellaswag [--limit 500]        # HellaSwag acc / acc_norm (downloaded once)
    uv run evaluate.py runs/gpt2 --hellaswag-file hellaswag_val.jsonl   # offline: a local copy

The dataset is the run's train.json dataset unless --dataset names another source (prepared
with the model's tokenizer if missing) or a prepared folder. The split is read in order, as
non-overlapping windows of sequence_length + 1 tokens (each window's targets start where the
previous one's end), and scored whole: every token but the split's first is a target exactly
once, the last window and batch padded with weight 0 (--max-batches stops earlier). The report
says how many tokens it scored. Figures:

    loss            mean next-token cross-entropy in nats over every scored token
    perplexity      exp(loss)
    bits per byte   loss x tokens / (ln 2 x bytes), bytes = the UTF-8 bytes the scored target
                    tokens decode to (end-of-text counts 0 bytes), so that models with different
                    tokenizers compare on the same text
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

import checkpoint_files as ckpt_files
import caches
import fast_malloc
from config import ConfigError, TrainConfig, from_dict
from data import DataError, TokenSplit, WholeSplit, open_dataset
from download_dataset import default_data_root, prepare_dataset
from tokenizer import Tokenizer, TokenizerError, get_tokenizer

INPUT_ERRORS = (ConfigError, DataError, TokenizerError, ckpt_files.CheckpointError)


def token_bytes(tok: Tokenizer) -> np.ndarray:
    """(n_vocab,) UTF-8 byte length of each token id; end-of-text is 0."""
    if tok.name == "bytes":
        lengths = np.ones(tok.n_vocab, np.int64)
    elif tok.name == "gpt2":
        import tiktoken  # tokenizer.py has loaded the encoding already: this is a registry lookup

        enc = tiktoken.get_encoding("gpt2")
        lengths = np.array([len(enc.decode_single_token_bytes(i)) for i in range(tok.n_vocab)], np.int64)
    else:  # any other tokenizer: decoding each id alone is exact for whole-character tokens
        lengths = np.array([len(tok.decode([i]).encode("utf-8")) for i in range(tok.n_vocab)], np.int64)
    lengths[tok.eot_id] = 0
    return lengths


def evaluate(model: Any, tok: Tokenizer, split: TokenSplit, *, batch_size: int, seq_len: int,
             targets: str = "next", max_batches: int | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Score `split` in order with the training loss (step.eval_sums: validation's program, the
    model's loss_chunk included), the whole split exactly (data.WholeSplit: every target token
    once, the last batch's padding weighted 0) unless max_batches stops it earlier; returns
    loss, perplexity, bits_per_byte and the counts behind them."""
    import jax
    from tqdm import tqdm

    from step import eval_sums

    windows = -(-max(split.n_tokens - int(targets == "next"), 1) // seq_len)
    batches = WholeSplit(split, microbatch_size=min(batch_size, windows), seq_len=seq_len, targets=targets)
    n_batches = batches.n_batches if max_batches is None else min(batches.n_batches, max_batches)
    nbytes_of = token_bytes(tok)
    total, tokens, nbytes = 0.0, 0, 0
    bar = tqdm(range(n_batches), unit="batch", desc=f"{split.name} split", dynamic_ncols=True,
               disable=None if progress is None else not progress)
    for i in bar:
        x, y, w = batches.microbatch(i)
        total += float(eval_sums(model, *map(jax.device_put, (x, y, w)))[0])
        tokens += int(w.sum())
        nbytes += int(nbytes_of[y[w > 0]].sum())
        bar.set_postfix(loss=f"{total / tokens:.4f}", refresh=False)
    bar.close()
    loss = total / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(loss) if loss < 700 else math.inf,
            "bits_per_byte": total / (math.log(2) * nbytes) if nbytes else math.nan,
            "tokens": tokens, "bytes": nbytes, "batches": n_batches, "batch_size": batches.microbatch_size,
            "seq_len": seq_len, "whole_split": n_batches == batches.n_batches, "split_tokens": split.n_tokens,
            "split_batches": batches.n_batches}


def hellaswag_score(model: Any, examples: list[Any], tok: Tokenizer, *, batch_examples: int = 16,
                    progress: bool | None = None) -> dict[str, Any]:
    """HellaSwag acc and acc_norm of `model` (hellaswag.py: llm.c's scoring), many examples per
    device call (step.ending_losses), with the per-ending figures behind them."""
    import jax
    from tqdm import tqdm

    import hellaswag
    from step import ending_losses

    calls, info = hellaswag.batches(examples, tok, context_length=model.cfg.context_length,
                                    vocab_size=model.cfg.vocab_size, batch_examples=batch_examples)
    sums, counts = np.zeros((len(examples), 4)), np.zeros((len(examples), 4))
    for chunk, tokens, mask in tqdm(calls, unit="batch", desc="HellaSwag", dynamic_ncols=True,
                                    disable=None if progress is None else not progress):
        # numpy in: uncommitted, so jit places it beside the parameters, wherever (however sharded) they are.
        s, c = jax.device_get(ending_losses(model, tokens, mask))
        sums[chunk], counts[chunk] = s.reshape(-1, 4)[:len(chunk)], c.reshape(-1, 4)[:len(chunk)]
    return hellaswag.accuracy(examples, sums, counts) | info | {"tokenizer": tok.name}


def report_line(r: dict[str, Any], split: str, targets: str) -> str:
    """How many tokens the figures are over, and which ones."""
    if r["whole_split"]:
        which = (f"the whole {split} split of {r['split_tokens']:,} tokens, every one but the first"
                 if targets == "next" else f"the whole {split} split of {r['split_tokens']:,} tokens")
    else:
        which = f"the first {r['batches']} of the {split} split's {r['split_batches']} batches"
    return (f"Scored {r['tokens']:,} tokens ({r['bytes']:,} bytes; {r['batches']} batches x {r['batch_size']} "
            f"x {r['seq_len']}): {which}")


def _train_config(train: dict[str, Any], where: str) -> TrainConfig:
    if not train:  # a checkpoint without a train.json: the defaults (builtin corpus, bytes tokenizer)
        return TrainConfig(microbatch_size=8, train_steps=1)
    return from_dict(TrainConfig, train, where)


def main_hellaswag(args: argparse.Namespace) -> int:
    """evaluate.py --hellaswag: acc and acc_norm over the validation examples (hellaswag.py)."""
    import hellaswag

    try:
        ckpt_dir, model_cfg, train = ckpt_files.checkpoint_configs(args.checkpoint)
        cfg = _train_config(train, str(ckpt_dir / "train.json"))
        path = args.hellaswag_file or hellaswag.fetch_val((args.data_dir or default_data_root()) / "downloads")
        examples = hellaswag.read_examples(path, args.limit)
        tok = get_tokenizer(cfg.tokenizer)  # the run's: see hellaswag.py
        from checkpointing import load_model  # JAX starts here, after every input check

        caches.enable_compile_cache()
        model, _cfg, _tok, _path = load_model(ckpt_dir)
        print(f"Checkpoint: {ckpt_dir}\nHellaSwag: {path} ({len(examples):,} examples, {tok.name} tokenizer"
              f"{'' if tok.name == 'gpt2' else '; llm.c scores with gpt2, so compare with byte models only'})")
        r = hellaswag_score(model, examples, tok, batch_examples=args.batch_size or 16)
    except INPUT_ERRORS as e:  # HellaSwagError is a DataError
        print(f"error: {e}", file=sys.stderr)
        return 2
    cut = f"; {r['truncated']:,} cut to the model's context of {model_cfg.context_length}" if r["truncated"] else ""
    print(f"Scored {r['examples']:,} examples (4 endings each, rows padded to {r['row_lengths']} tokens{cut})")
    print(f"hellaswag acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument("--dataset", default=None, help="a dataset source (e.g. builtin) or a prepared dataset "
                        "folder (default: the run's train.json dataset)")
    parser.add_argument("--split", choices=("train", "val"), default="val")
    parser.add_argument("--max-batches", type=int, default=None, help="score at most this many batches")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the run's microbatch_size")
    parser.add_argument("--sequence-length", type=int, default=None, help="default: the run's sequence_length")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where datasets live (default: $JAXGPT_DATA_DIR or ./data)")
    parser.add_argument("--hellaswag", action="store_true", help="score HellaSwag (validation) instead of the loss; "
                        "--batch-size is then examples per device call (default 16)")
    parser.add_argument("--hellaswag-file", type=Path, default=None,
                        help="a local hellaswag_val.jsonl (rowanz format) instead of the download; implies --hellaswag")
    parser.add_argument("--limit", type=int, default=None, help="HellaSwag: score the first N examples only")
    args = parser.parse_args(argv)
    for name in ("max_batches", "batch_size", "sequence_length", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} must be >= 1")
    if args.hellaswag or args.hellaswag_file is not None:
        return main_hellaswag(args)
    try:
        ckpt_dir, model_cfg, train = ckpt_files.checkpoint_configs(args.checkpoint)
        cfg = _train_config(train, str(ckpt_dir / "train.json"))
        seq_len = args.sequence_length or cfg.seq_len(model_cfg)
        if seq_len > model_cfg.context_length:
            raise ConfigError(f"--sequence-length={seq_len} exceeds the model's context_length={model_cfg.context_length}")
        if args.dataset is not None and (Path(args.dataset) / "manifest.json").is_file():
            ds_path = Path(args.dataset)
        else:
            same = args.dataset is None or args.dataset == cfg.dataset.source
            ds_path = prepare_dataset(args.dataset or cfg.dataset.source, cfg.tokenizer,
                                      args.data_dir or default_data_root(),
                                      options=cfg.dataset.options if same else None, log=print)
        dataset = open_dataset(ds_path)
        if dataset.tokenizer != cfg.tokenizer:
            raise DataError(f"{ds_path}: dataset tokenizer {dataset.tokenizer!r} is not the model's {cfg.tokenizer!r}")
        if dataset.max_token_id >= model_cfg.vocab_size:
            raise DataError(f"{ds_path}: token id {dataset.max_token_id} is out of range for vocab_size={model_cfg.vocab_size}")
        split = dataset.train if args.split == "train" else dataset.val
        from checkpointing import load_model  # JAX starts here, after every input check

        caches.enable_compile_cache()
        model, _cfg, _tok, _path = load_model(ckpt_dir)
        tok = get_tokenizer(cfg.tokenizer)  # the dataset's, which the byte counts must follow
        print(f"Checkpoint: {ckpt_dir}\nDataset: {ds_path} ({args.split} split, {split.n_tokens:,} tokens)")
        r = evaluate(model, tok, split, batch_size=args.batch_size or cfg.microbatch_size, seq_len=seq_len,
                     targets=cfg.targets, max_batches=args.max_batches)
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report_line(r, args.split, cfg.targets))
    print(f"loss {r['loss']:.4f} | perplexity {r['perplexity']:.3f} | bits per byte {r['bits_per_byte']:.4f}")
    return 0


if __name__ == "__main__":
    fast_malloc.reexec()  # restarts once with huge-page malloc where that helps (fast_malloc.py)
    raise SystemExit(main())
