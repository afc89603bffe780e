"""Score a fine-tuned model's answers with a larger model as the judge (the book's chapter 7 evaluation).

    export OPENAI_API_KEY=...
    uv run judge.py runs/gpt2-alpaca --url https://api.openai.com/v1 --model gpt-4o-mini --out judged.jsonl
    uv run judge.py runs/gpt2-alpaca --url http://localhost:11434/v1 --model llama3 --api-key-env NONE  # Ollama
    uv run judge.py runs/gpt2 --questions runs/gpt2-alpaca --out base.jsonl   # the base model, same questions

The questions are the held-out conversations of the run's dataset (or of --questions), answered
greedily; each answer is scored 0-100 by the judge (jaxgpt/conversations/judge.py), one JSONL line
each, the mean in <out>.summary.json. One request probes the judge first (exit code 2 if it fails);
exit code 1 when no answer was scored. More: docs/fine-tuning.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from jaxgpt import caches
from jaxgpt.checkpoints import layout
from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import ConfigError
from jaxgpt.conversations.judge import RUBRIC, Judge, summary
from jaxgpt.conversations.prepare import VAL_FILE
from jaxgpt.conversations.template import ChatTemplate, TemplateError
from jaxgpt.data.errors import DataError
from jaxgpt.data.tokenizer import Tokenizer, TokenizerError
from jaxgpt.evaluation.answers import Questions
from jaxgpt.generation.sampling import SamplingParams


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(__doc__)
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder, latest/best link or run dir")
    parser.add_argument("--url", required=True, help="the judge's OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--model", required=True, help="the judge model's name at that endpoint")
    parser.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default OPENAI_API_KEY; NONE: no key)",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file: one line per answer")
    parser.add_argument(
        "--questions",
        type=Path,
        default=None,
        help="whose held-out conversations to ask (default: the checkpoint's own dataset)",
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="longest answer (default 256)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per judge request (default 60)")
    parser.add_argument("--retries", type=int, default=2, help="retries per judge request (default 2)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where datasets live")
    return parser


def _instruction(tok: Tokenizer, template: ChatTemplate, messages: list[dict]) -> str:
    """The instruction as the model saw it, without the assistant's opening (the book's format_input)."""
    text = tok.decode(template.prompt(tok, messages))
    opening = template.assistant.partition("{content}")[0]
    return text[: -len(opening)].rstrip() if opening and text.endswith(opening) else text


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command line's numbers and the API key (returned), checked before anything loads."""
    for name in ("limit", "max_new_tokens", "timeout"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be > 0")
    if args.retries < 0:
        parser.error(f"--retries={args.retries} must be >= 0")
    key = "none" if args.api_key_env == "NONE" else os.environ.get(args.api_key_env)
    if not key:
        parser.error(f"--api-key-env: ${args.api_key_env} is not set (NONE: a judge without a key)")
    return key


def _answers(q: Questions, max_tokens: int) -> list[str]:
    """Greedy answers to every question, drawn together by the engine."""
    from jaxgpt.checkpoints.store import load_model  # JAX starts here, after every input check and the probe
    from jaxgpt.conversations.assistant import Assistant

    caches.enable_compile_cache()
    model, _cfg, _tok, _path = load_model(q.ckpt_dir)
    bot = Assistant(model, q.tok, q.template, str(q.ckpt_dir), rows=16)
    return bot.answer_all([m for m, _ in q.items], SamplingParams(max_tokens, temperature=0.0))


def _score_all(judge: Judge, out: Path, rows_in: list[tuple[str, str, str]]) -> list[dict]:
    """Each (instruction, reference, answer) scored, one JSONL line each as it comes."""
    rows = []
    with open(out, "w", encoding="utf-8") as f:
        for i, (instruction, reference, answer) in enumerate(rows_in):
            verdict = judge.score(instruction, reference, answer)
            row = {"instruction": instruction, "reference": reference, "answer": answer, "score": verdict.score}
            rows.append(row | {"judge_reply": verdict.reply, "error": verdict.error})
            f.write(json.dumps(rows[-1], ensure_ascii=False) + "\n")
            f.flush()
            shown = verdict.score if verdict.score is not None else f"none ({verdict.error or 'no number'})"
            print(f"[{i + 1}/{len(rows_in)}] score {shown}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """0 when at least one answer was scored; 1 when none was; 2 for bad input or an unreachable judge."""
    parser = _parser()
    args = parser.parse_args(argv)
    key = _check(parser, args)
    try:
        q = Questions.load(args.checkpoint, args.questions, args.data_dir, args.limit)
    except (ConfigError, DataError, TokenizerError, layout.CheckpointError, TemplateError) as e:
        return refuse(e)
    print(f"Checkpoint: {q.ckpt_dir}\nQuestions: {q.dataset.path}/{VAL_FILE} ({len(q.items):,})")
    judge = Judge(args.url, args.model, key, timeout=args.timeout, retries=args.retries)
    problem = judge.probe()
    if problem is not None:
        print(f"error: the judge at {args.url} did not answer a first request ({problem})", file=sys.stderr)
        return 2
    print(f"Judge: {args.model} at {args.url}\nRubric: {RUBRIC}")
    answers = _answers(q, args.max_new_tokens)
    asked = [(_instruction(q.tok, q.template, m), ref, a) for (m, ref), a in zip(q.items, answers)]
    result = summary(_score_all(judge, args.out, asked))
    args.out.with_name(args.out.name + ".summary.json").write_text(json.dumps(result, indent=2) + "\n")
    mean = "n/a" if result["mean"] is None else f"{result['mean']:.2f}"
    print(
        f"mean score {mean} over {result['scored']} of {result['examples']} answers "
        f"({result['unparseable']} replies without a number, {result['failed']} failed requests)"
    )
    if not result["scored"]:
        print(f"error: no answer was scored ({result['failed']} requests failed); see {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
