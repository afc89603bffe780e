"""What a checkable prompt set is: examples (a prompt and its reference), a reward rule, a chance baseline.

    task = read_gsm8k(Path("gsm8k-test.jsonl"))       # or read_arc, read_mmlu, builtin_tasks, read_jsonl
    ex = task.examples[0]                             # Example(messages=({"role": "user", ...},), reference="18")
    task.reward("... so she makes 18 dollars.", ex)   # 1.0: the rule (task.rule) says so

As nanochat's tasks/common.py: a "multiple_choice" task is answered by one of `letters`, a
"generative" one sampled and scored by the rule; render_mc is nanochat's. No JAX in jaxgpt/tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from jaxgpt.data.errors import DataError

KINDS = ("generative", "multiple_choice")


class TaskError(DataError):
    """A task file that is missing, malformed or unusable, or a bad task option (one line naming the
    file and line, or the option, and the value). A DataError, so a ValueError."""


class Reward(Protocol):
    """How an answer is scored: 1.0 right, 0.0 wrong (the rules are in rewards.py)."""

    def __call__(self, answer: str, reference: str) -> float: ...

    def describe(self) -> str: ...

    def check(self, reference: str) -> None: ...


@dataclass(frozen=True)
class Example:
    messages: tuple[dict, ...]  # the prompt: a conversation ending with a user message ({"role", "content"})
    reference: str  # generative: the reference answer; multiple choice: the correct letter
    letters: tuple[str, ...] = ()  # multiple choice: the answer letters offered ("A", "B", ...); () = generative


@dataclass(frozen=True)
class Task:
    name: str  # "gsm8k", "arc-easy", "arc-challenge", "mmlu", "builtin-add", "jsonl:<file stem>", ...
    kind: Literal["generative", "multiple_choice"]
    examples: tuple[Example, ...]
    rule: Reward  # how an answer is scored (rewards.py)
    baseline: float  # chance accuracy for ChatCORE's centring: 0 generative, 1/len(letters) multiple choice

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TaskError(f"task {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.examples:
            raise TaskError(f"task {self.name}: no examples")
        if not 0.0 <= self.baseline < 1.0:
            raise TaskError(f"task {self.name}: baseline must be in [0, 1), got {self.baseline!r}")
        for i, ex in enumerate(self.examples):
            if (self.kind == "multiple_choice") != bool(ex.letters):
                raise TaskError(f"task {self.name}: example {i} has letters {ex.letters!r} in a {self.kind} task")
            if ex.letters and ex.reference not in ex.letters:
                raise TaskError(f"task {self.name}: example {i}'s answer {ex.reference!r} is not in {ex.letters!r}")
            if not ex.messages or ex.messages[-1].get("role") != "user":
                raise TaskError(f"task {self.name}: example {i}'s prompt does not end with a user message")

    def reward(self, answer: str, example: Example) -> float:
        """1.0 if `answer` is right for `example` by this task's rule, else 0.0."""
        return self.rule(answer, example.reference)


def render_mc(question: str, letters: Sequence[str], choices: Sequence[str]) -> str:
    """nanochat's tasks/common.py render_mc: the letter after each choice ("- choice=A"), with no space
    before it, so the prompt holds the very token the answer is (small models bind better so)."""
    query = f"Multiple Choice question: {question}\n"
    query += "".join(f"- {choice}={letter}\n" for letter, choice in zip(letters, choices))
    query += "\nRespond only with the letter of the correct answer."
    return query


def chance(examples: Sequence[Example]) -> float:
    """The accuracy of guessing among each example's letters uniformly: the mean of 1/len(letters)."""
    if not examples or not examples[0].letters:
        return 0.0
    return sum(1.0 / len(ex.letters) for ex in examples) / len(examples)


def user_prompt(content: str, system: str | None = None) -> tuple[dict, ...]:
    """A prompt of one user message, after a system message when one is given."""
    head = ({"role": "system", "content": system},) if system is not None else ()
    return head + ({"role": "user", "content": content},)
