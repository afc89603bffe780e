"""Load a trained model from a checkpoint and sample from it (used by test_generation.py).

Decoding runs the full forward pass over a fixed (1, context_length) window for each new token,
so one program is compiled once and reused; past context_length the window slides.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import checkpointing as ckpt
from config import ModelConfig, TrainConfig, from_dict, from_json
from model import build_model
from tokenizer import Tokenizer, get_tokenizer


def load_model(path: Path) -> tuple[nnx.Module, ModelConfig, Tokenizer, Path]:
    """Model, its config and tokenizer from a checkpoint folder, `latest`/`best` link or run dir.

    The architecture comes from the run's model.json (the checkpoint's own copy when the folder
    was moved out of its run); the tokenizer from the train.json saved with the checkpoint.
    """
    ckpt_dir = ckpt.resolve_checkpoint(path)
    run_model_json = ckpt_dir.parent.parent / "model.json"
    if run_model_json.is_file():
        model_cfg = from_json(ModelConfig, run_model_json)
    else:
        model_cfg = from_dict(ModelConfig, ckpt.read_configs(ckpt_dir)["model.json"], str(ckpt_dir / "model.json"))
    saved_train = ckpt.read_configs(ckpt_dir).get("train.json")
    tokenizer_name = saved_train["tokenizer"] if saved_train else TrainConfig.__dataclass_fields__["tokenizer"].default
    model = build_model(model_cfg)
    ckpt.load_weights(model, ckpt_dir / ckpt.WEIGHTS)
    return model, model_cfg, get_tokenizer(tokenizer_name), ckpt_dir


@nnx.jit
def _logits_at(model: nnx.Module, window: jax.Array, pos: jax.Array) -> jax.Array:
    """Logits (V,) predicting the token after window[0, pos]. window: (1, T) int32."""
    logits = model(window)  # (1, T, V); causal, so the padding after pos cannot leak back
    return logits[0, pos].astype(jnp.float32)


def filter_logits(logits: np.ndarray, top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """Set every logit outside the top-k and outside the top-p nucleus to -inf.

    top_p keeps the smallest set of most likely tokens whose probability adds up to >= top_p.
    """
    out = np.asarray(logits, dtype=np.float64).copy()
    if top_k is not None and top_k < out.size:
        kth = np.sort(out)[-top_k]
        out[out < kth] = -np.inf
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-out, kind="stable")
        probs = np.exp(out[order] - out[order[0]])
        probs /= probs.sum()
        # Keep token i if the mass before it is still short of top_p.
        keep = np.cumsum(probs) - probs < top_p
        out[order[~keep]] = -np.inf
    return out


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float,
                top_k: int | None, top_p: float | None) -> int:
    if temperature <= 0.0:
        return int(np.argmax(logits))
    filtered = filter_logits(np.asarray(logits, np.float64) / temperature, top_k, top_p)
    probs = np.exp(filtered - filtered.max())
    return int(rng.choice(probs.size, p=probs / probs.sum()))


def generate(model: nnx.Module, prompt: list[int], *, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             eot_id: int | None = None, n_vocab: int | None = None) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids (stops early at eot_id).

    n_vocab: the tokenizer's vocabulary; ids past it (a vocab_size padded for speed) are never drawn.
    """
    ctx = model.cfg.context_length
    if not prompt:
        raise ValueError("generate: the prompt must hold at least one token")
    rng = np.random.default_rng(seed)
    ids = list(prompt)
    for _ in range(max_new_tokens):
        recent = ids[-ctx:]  # slide once the context is full
        window = np.zeros((1, ctx), np.int32)
        window[0, :len(recent)] = recent
        logits = np.asarray(_logits_at(model, jnp.asarray(window), jnp.int32(len(recent) - 1)))
        token = sample_next(logits[: n_vocab or model.cfg.vocab_size], rng, temperature, top_k, top_p)
        if token == eot_id:
            return
        ids.append(token)
        yield token


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)


def check_sampling_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 0")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k={args.top_k} must be >= 1")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p={args.top_p} must be in (0, 1]")


def continuation(model: nnx.Module, tok: Tokenizer, prompt: str, args: argparse.Namespace) -> str:
    new = generate(model, tok.encode(prompt), max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed, eot_id=tok.eot_id, n_vocab=tok.n_vocab)
    return tok.decode(list(new))
