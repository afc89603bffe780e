"""A chat model scored on checkable tasks (jaxgpt/tasks/) through the generation engine: generative tasks by
their rule on k sampled answers, multiple choice by the letter the model puts first (nanochat's chat_eval).

    bot = Assistant.load(Path("runs/tiny-instruct"), rows=64)
    outcomes = score_task(bot, task, SamplingParams(max_tokens=64, temperature=0.0))   # [[True], [False], ...]
    outcomes = score_task(bot, task, SamplingParams(max_tokens=64, temperature=1.0), samples=8)   # pass@8

A task's examples are drawn in one engine call; answer i of an example draws with params.seed + i.
A multiple-choice answer is the letter whose token has the highest logit among the letters' at
the answer's first position.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.tasks.base import Task, TaskError
from jaxgpt.tasks.report import pass_at_k

if TYPE_CHECKING:
    from jaxgpt.conversations.assistant import Assistant

RIGHT = 0.5  # an answer whose reward reaches this counts as right (the rules give 0 or 1)


def score_task(bot: Assistant, task: Task, params: SamplingParams, samples: int = 1) -> list[list[bool]]:
    """Each example's `samples` outcomes (multiple choice: one, greedy among the letters). An example whose
    prompt leaves no room for an answer in the model's context is wrong (too_long counts them)."""
    if task.kind == "multiple_choice":
        params = dataclasses.replace(params, max_tokens=1, temperature=0.0, top_k=None, top_p=None)
        samples = 1
    prompts = [bot.render(list(e.messages), params) for e in task.examples]
    outcomes = [[False] * samples for _ in task.examples]
    groups: dict[tuple[str, ...], list[int]] = {}  # multiple choice: the questions with the same letters
    for i, prompt in enumerate(prompts):
        if prompt is not None:
            groups.setdefault(task.examples[i].letters, []).append(i)
    for letters, which in groups.items():
        ids = letter_ids(bot, letters, task.name) if letters else None
        drawn = bot.engine.generate([prompts[i] for i in which], bot.params(params, allowed_ids=ids), n=samples)
        for row, i in enumerate(which):
            example, answers = task.examples[i], drawn[row * samples : (row + 1) * samples]
            if letters:
                outcomes[i] = [letters[ids.index(answers[0].sampled[0])] == example.reference]
            else:
                outcomes[i] = [task.reward(r.text.text, example) >= RIGHT for r in answers]
    return outcomes


def too_long(bot: Assistant, task: Task, params: SamplingParams) -> int:
    """How many of a task's prompts leave no room for an answer (score_task counts them wrong)."""
    return sum(bot.render(list(e.messages), params) is None for e in task.examples)


def letter_ids(bot: Assistant, letters: tuple[str, ...], task: str) -> tuple[int, ...]:
    """Each answer letter's token id (a letter must be one token of the model's tokenizer)."""
    ids = []
    for letter in letters:
        encoded = bot.tok.encode(letter)
        if len(encoded) != 1:
            raise TaskError(
                f"task {task}: answer letter {letter!r} is {len(encoded)} tokens of the {bot.tok.name} "
                f"tokenizer, not one"
            )
        ids.append(encoded[0])
    return tuple(ids)


def summary(task: Task, outcomes: list[list[bool]]) -> dict[str, float | int]:
    """pass@1, pass@k and the counts of one task (tasks/report.py), with its chance baseline."""
    return pass_at_k(outcomes) | {"baseline": task.baseline}
