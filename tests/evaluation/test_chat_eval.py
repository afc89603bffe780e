"""evaluate.py --tasks: a chat checkpoint scored through the engine on small files of each public format;
multiple choice answered by the letter with the highest logit (against the model's own forward pass),
generative tasks by their rule over k samples, the table and ChatCORE."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, SLOW

import evaluate
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.checkpoints.store import load_model
from jaxgpt.config import ModelConfig, to_dict
from jaxgpt.conversations.assistant import Assistant
from jaxgpt.conversations.template import ChatTemplate
from jaxgpt.evaluation.chat_eval import score_task
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model
from jaxgpt.tasks.base import Example, Task
from jaxgpt.tasks.load import load_tasks
from jaxgpt.tasks.report import pass_at_k
from jaxgpt.tasks.rewards import ExactMatch

FIXTURES = ROOT / "tests" / "fixtures" / "tasks"
SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 512, "emb_dim": 32, "n_heads": 2, "n_layers": 1}
TASKS = [
    f"gsm8k={FIXTURES / 'gsm8k-test.jsonl'}",
    f"arc-easy={FIXTURES / 'arc-easy-allenai.jsonl'}",
    f"arc-challenge={FIXTURES / 'arc-easy-hf.parquet'}",
    f"mmlu={FIXTURES / 'mmlu-hf.jsonl'}",
    "builtin",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat checkpoint as fine-tuning writes one, random weights: what evaluate.py reads."""
    folder = tmp_path_factory.mktemp("chat") / "ckpt"
    folder.mkdir()
    cfg = ModelConfig(**MODEL)
    ckpt.save_weights(build_model(cfg, seed=4), folder / ckpt.WEIGHTS)
    (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
    (folder / "train.json").write_text(json.dumps({"tokenizer": "bytes"}))
    (folder / "chat_template.json").write_text(json.dumps(ChatTemplate.from_dict(SHORT).to_dict()))
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    return folder


@SLOW  # the model's own forward pass, unjitted, per question (the fast tier scores every format below)
def test_multiple_choice_takes_the_letter_with_the_highest_logit_at_the_answer(checkpoint: Path) -> None:
    bot = Assistant.load(checkpoint, rows=4)
    (task,) = load_tasks([f"mmlu={FIXTURES / 'mmlu-hf.jsonl'}"])
    outcomes = score_task(bot, task, SamplingParams(8, temperature=1.0, seed=3), samples=4)  # one greedy letter each
    net, *_ = load_model(checkpoint)  # the model's own forward pass, not the engine's programs
    for example, outcome in zip(task.examples, outcomes):
        ids = bot.template.prompt(bot.tok, list(example.messages))
        logits = np.asarray(net(jnp.asarray([ids]))[0, -1])
        letter_ids = [bot.tok.encode(letter)[0] for letter in example.letters]
        picked = example.letters[int(np.argmax(logits[letter_ids]))]
        assert outcome == [picked == example.reference]


def test_generative_answers_are_scored_by_the_tasks_rule_over_k_samples(checkpoint: Path) -> None:
    """References made from the first of each question's 3 draws: exactly those are right."""
    bot = Assistant.load(checkpoint, rows=8)
    (source,) = load_tasks([f"jsonl={FIXTURES / 'prompts.jsonl'}"])
    params = SamplingParams(6, temperature=1.0, seed=5)
    drawn = bot.requests([list(e.messages) for e in source.examples], params, n=3)
    examples = tuple(Example(e.messages, drawn[3 * i].text.text) for i, e in enumerate(source.examples))
    task = Task("drawn", "generative", examples, ExactMatch(), 0.0)
    outcomes = score_task(bot, task, params, samples=3)
    assert [row[0] for row in outcomes] == [True] * len(examples)
    for i, row in enumerate(outcomes):  # the others right only where they drew the same text
        assert row[1:] == [drawn[3 * i + j].text.text.strip() == drawn[3 * i].text.text.strip() for j in (1, 2)]
    assert pass_at_k(outcomes)["pass@k"] == 1.0


def test_evaluate_tasks_reports_every_format_and_chatcore(checkpoint: Path, capsys: pytest.CaptureFixture) -> None:
    args = [str(checkpoint), "--tasks", *TASKS, "--limit", "3", "--max-new-tokens", "6", "--samples", "2"]
    assert evaluate.main(args) == 0
    out = capsys.readouterr().out
    for name in ("gsm8k", "arc-easy", "arc-challenge", "mmlu", "builtin-add", "builtin-reverse"):
        assert re.search(rf"^{re.escape(name)}\s+3\s+\d\.\d{{4}}", out, re.M), name
    assert re.search(r"^ChatCORE\s+-?\d\.\d{4}$", out, re.M) and "2 answer(s) per question, temperature 1" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tasks", "nosuch=x"], "unknown task 'nosuch'"),
        (["--tasks", "gsm8k=/no/such/file.jsonl"], "/no/such/file.jsonl"),
        (["--tasks", "builtin", "--samples", "2", "--temperature", "0"], "draws the same greedy answer"),
        (["--tasks", "builtin", "--exact-match"], "--tasks is a run of its own"),
    ],
)
def test_bad_task_arguments_are_one_line(checkpoint: Path, args: list[str], needle: str, capsys) -> None:
    try:
        code = evaluate.main([str(checkpoint), *args])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1]
