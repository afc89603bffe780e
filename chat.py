"""Talk to a fine-tuned model: an interactive conversation that streams the answers, or one answer for scripts.

    uv run chat.py runs/tiny-instruct                                # interactive; /clear starts over, /quit ends
    uv run chat.py runs/tiny-instruct -p "Reverse the letters: abc"  # one shot: the answer on stdout
    echo "Add 2 and 3." | uv run chat.py runs/tiny-instruct -p -     # the prompt from stdin
    uv run chat.py runs/tiny-instruct --system "Answer briefly." --temperature 0 -p "..."
    uv run chat.py runs/tiny --raw -p "Every effort moves you"       # a base model: plain continuation

Prompts use the checkpoint's chat template (a base model needs --raw). Sampling defaults to
temperature 0.6 and top-k 50; --temperature 0 is greedy; the same --seed gives the same answers.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from jaxgpt import caches
from jaxgpt.checkpoints.layout import CheckpointError
from jaxgpt.cli import add_sampling_args, check_sampling_args, command_parser, refuse, sampling_params
from jaxgpt.config import ConfigError
from jaxgpt.conversations.template import TemplateError
from jaxgpt.data.tokenizer import TokenizerError
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.generation.text import REPLACEMENT

if TYPE_CHECKING:
    from jaxgpt.conversations.assistant import Assistant

DEFAULT_TOP_K = 50  # when sampling (temperature > 0) and --top-k is not given: nanochat's chat_cli


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(__doc__)
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument("-p", "--prompt", default=None, help="one message, answered once ('-': read it from stdin)")
    parser.add_argument("--system", default=None, help="a system message opening the conversation")
    parser.add_argument("--raw", action="store_true", help="no chat template: continue the text as a base model")
    add_sampling_args(
        parser,
        max_new_tokens=256,
        temperature=0.6,
        on_full=False,
        top_k_note=f" (default {DEFAULT_TOP_K} when sampling)",
    )
    return parser


def _raw(checkpoint: Path, text: str, params: SamplingParams) -> str:
    """A base model's continuation of `text` (no template), ending at end-of-text or the context."""
    from jaxgpt.checkpoints.store import load_model
    from jaxgpt.generation.engine import Engine

    model, _cfg, tok, _path = load_model(checkpoint)
    params = replace(params, stop_ids=frozenset({tok.eot_id}), on_full="stop")
    (done,) = Engine(model, tok, rows=1).generate([tok.encode(text)], params)
    return done.text.text.rstrip(REPLACEMENT)


def _interactive(bot: Assistant, system: str | None, params: SamplingParams) -> int:
    print(f"Chatting with {bot.where} (template {bot.template.name!r}). /clear starts over, /quit or Ctrl-D ends.")
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    turn = 0
    while True:
        try:
            text = input("\nYou: ").strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:  # at the prompt: the line is dropped, the conversation goes on
            print("\n(Ctrl-C stops an answer; /quit or Ctrl-D ends the chat)")
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/clear":
            messages = messages[:1] if system else []
            print("(a new conversation)")
            continue
        if not text:
            continue
        answer = _answer(bot, [*messages, {"role": "user", "content": text}], replace(params, seed=params.seed + turn))
        if answer is not None:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
            turn += 1


def _answer(bot: Assistant, messages: list[dict], params: SamplingParams) -> str | None:
    """The answer, streamed as it is drawn (Ctrl-C stops it, keeping what came); None when the message
    leaves no room for an answer in the model's context (said in one line; the conversation is kept)."""
    try:
        stream = bot.stream(messages, params)
    except TemplateError as e:
        print(f"(not sent: {e}; the conversation so far is kept)")
        return None
    print("Assistant: ", end="", flush=True)
    pieces = []
    try:
        for piece in stream:
            pieces.append(piece)
            print(piece, end="", flush=True)
    except KeyboardInterrupt:  # stop this answer, keep the conversation
        print(" [stopped]", end="")
    print()
    return "".join(pieces)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_sampling_args(parser, args)
    if args.raw and args.system:
        parser.error("--system belongs to a chat template; --raw continues plain text")
    if args.raw and args.prompt is None:
        parser.error("--raw needs --prompt (the text to continue)")
    prompt = sys.stdin.read().strip() if args.prompt == "-" else args.prompt
    if prompt is not None and not prompt:
        parser.error("--prompt must not be empty")
    params = sampling_params(args, top_k=None if args.temperature == 0 else DEFAULT_TOP_K)
    caches.enable_compile_cache()
    try:
        if args.raw:
            print(prompt + _raw(args.checkpoint, prompt, params))
            return 0
        from jaxgpt.conversations.assistant import Assistant  # JAX starts here, after the checks

        bot = Assistant.load(args.checkpoint)
        if prompt is None:
            return _interactive(bot, args.system, params)
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": prompt}
        ]
        for piece in bot.stream(messages, params):
            print(piece, end="", flush=True)
        print()
    except (ConfigError, CheckpointError, TokenizerError, TemplateError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
