"""What the root commands share on their command lines: the parser's opening, the one-line refusal of a
bad input, and the sampling flags of every command that draws answers (checked before JAX starts).

    parser = command_parser(__doc__)                # the docstring's first paragraph, then its examples
    except ConfigError as e: return refuse(e)        # "error: ..." on stderr, exit code 2
    add_sampling_args(parser, max_new_tokens=256, temperature=0.6)
    args = parser.parse_args(); check_sampling_args(parser, args); params = sampling_params(args)
"""

from __future__ import annotations

import argparse
import math
import sys

from jaxgpt.generation.sampling import ON_FULL, SamplingParams


def command_parser(doc: str) -> argparse.ArgumentParser:
    """A root command's parser: its docstring's first paragraph as the description, the whole docstring
    (its examples) after the options."""
    return argparse.ArgumentParser(
        description=doc.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc,
    )


def refuse(error: Exception) -> int:
    """A bad input: its one line on stderr, and exit code 2."""
    print(f"error: {error}", file=sys.stderr)
    return 2


def add_sampling_args(
    parser: argparse.ArgumentParser,
    *,
    max_new_tokens: int = 50,
    temperature: float = 0.0,
    top_k_note: str = "",
    on_full: bool = True,
) -> None:
    """The sampling flags; the defaults are the command's (test_generation.py: greedy; chat.py:
    temperature 0.6 and, when sampling, top-k 50, as nanochat's chat_cli)."""
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=f"(default {max_new_tokens})")
    parser.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help=f"0 = greedy, the most likely token every time (default {temperature:g})",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"sample from the k most likely tokens only{top_k_note}; needs --temperature > 0",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample from the smallest set of tokens with this much probability; needs --temperature > 0",
    )
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same text")
    if on_full:
        parser.add_argument(
            "--on-full",
            choices=ON_FULL,
            default="slide",
            help="when the context is full: slide (re-read the last context_length/2 tokens, default) or stop",
        )


def check_sampling_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error (exit 2, one line) for a flag out of range or meaningless with the others."""
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 0")
    if args.temperature < 0 or not math.isfinite(args.temperature):
        parser.error(f"--temperature={args.temperature} must be a finite number >= 0")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k={args.top_k} must be >= 1")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p={args.top_p} must be in (0, 1]")
    if args.temperature == 0 and (args.top_p is not None or args.top_k is not None):
        # Greedy decoding takes the most likely token whatever the filters keep: they would be ignored.
        given = "--top-p" if args.top_p is not None else "--top-k"
        parser.error(
            f"{given} filters what is sampled, but --temperature is 0 (greedy, nothing is sampled); "
            f"give --temperature (e.g. 1.0) to sample, or drop {given}"
        )
    if args.seed < 0:
        parser.error(f"--seed={args.seed} must be >= 0")


def sampling_params(args: argparse.Namespace, top_k: int | None = None) -> SamplingParams:
    """The engine's parameters for the checked flags (`top_k`: the command's default when none is given)."""
    return SamplingParams(
        max_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k if args.top_k is not None else top_k,
        top_p=args.top_p,
        seed=args.seed,
        on_full=getattr(args, "on_full", "stop"),
    )
