"""RL's prompts: a prompt set of train.json's rl section read as tasks (jaxgpt/tasks/), rendered with the
chat template, and the prompts of each step. No JAX.

    tasks = read_prompt_set(cfg.rl.prompts, run_dir, split="train")
    pool = PromptPool.build(tasks, template, tok, width=cfg.seq_len(model) + 1 - cfg.rl.max_new_tokens)
    pool.for_step(step, 16, seed)      # [prompt index, ...]: a pure function of (seed, step)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from jaxgpt.config_rl import PromptSet
from jaxgpt.conversations.instructions import TASKS
from jaxgpt.conversations.template import ChatTemplate
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.preparation.prepare import DEFAULT_OPTIONS
from jaxgpt.tasks.base import Example, Task
from jaxgpt.tasks.local import BUILTIN_EXAMPLES, BUILTIN_SEED, builtin_tasks, read_jsonl
from jaxgpt.tasks.public import read_gsm8k
from jaxgpt.tasks.rewards import reward_rule

# Built-in questions drawn for training when rl.prompts.examples is null: an instructions dataset's
# (runs/tiny-instruct's training questions), so none is one of its held-out ones.
BUILTIN_TRAIN_EXAMPLES = DEFAULT_OPTIONS["instructions"]["examples"]


def read_prompt_set(cfg: PromptSet, run_dir: Path, split: Literal["train", "validation"]) -> list[Task]:
    """The tasks of a prompt set (TaskError, one line, for a bad file); paths are the run directory's.
    The built-in questions are an instructions dataset's (every task drawn in turn, the same seed), then
    those of rl.prompts.tasks kept: the training side never holds one of its held-out questions."""
    where = f"{run_dir}/train.json: rl.{'prompts' if split == 'train' else 'validation'}"
    if cfg.task == "builtin":  # drawn as an instructions dataset draws them (every task), then chosen
        default = BUILTIN_TRAIN_EXAMPLES if split == "train" else BUILTIN_EXAMPLES
        tasks = builtin_tasks(cfg.examples or default, BUILTIN_SEED, tuple(TASKS), split=split)
        tasks = [t for t in tasks if cfg.tasks is None or t.name.removeprefix("builtin-") in cfg.tasks]
    elif cfg.task == "gsm8k":
        tasks = [read_gsm8k(Path(run_dir) / cfg.path, cfg.examples)]
    else:
        tasks = [read_jsonl(Path(run_dir) / cfg.path, reward_rule(cfg.reward, where), cfg.examples)]
    if cfg.reward is not None and cfg.task != "jsonl":
        rule = reward_rule(cfg.reward, where)
        tasks = [dataclasses.replace(t, rule=rule) for t in tasks]
    return tasks


@dataclass
class PromptPool:
    """Every (task, example) of a prompt set whose prompt leaves room for an answer, rendered once."""

    items: list[tuple[Task, Example]]
    ids: list[list[int]]  # the prompt's ids: the conversation, then the assistant's opening
    dropped: dict[str, tuple[int, int]]  # task name -> (its examples whose prompt was too long, its examples)

    @classmethod
    def build(cls, tasks: list[Task], template: ChatTemplate, tok: Tokenizer, longest: int) -> PromptPool:
        """`longest`: the most prompt tokens that leave room for the answer."""
        items, ids, dropped = [], [], {}
        for task in tasks:
            too_long = 0
            for example in task.examples:
                prompt = template.prompt(tok, list(example.messages))
                if len(prompt) > longest:
                    too_long += 1
                    continue
                items.append((task, example))
                ids.append(prompt)
            if too_long:
                dropped[task.name] = (too_long, len(task.examples))
        return cls(items, ids, dropped)

    def for_step(self, step: int, count: int, seed: int) -> list[int]:
        """The `count` prompts of RL step `step`: sequence s = step x count + j is prompt
        perm(seed, epoch)[s % n] with epoch = s // n, so each epoch visits every prompt once."""
        n = len(self.ids)
        epochs, positions = np.divmod(step * count + np.arange(count, dtype=np.int64), n)
        perms = {int(e): np.random.default_rng([seed, int(e), 0x5A11]).permutation(n) for e in np.unique(epochs)}
        return [int(perms[int(e)][p]) for e, p in zip(epochs, positions)]


def sample_seed(seed: int, step: int, slot: int) -> int:
    """The engine seed of prompt `slot` of step `step` (its g-th sample draws with this + g): a pure
    function of (seed, step), so a resumed run draws exactly the samples the uninterrupted one did."""
    return int(np.random.SeedSequence([seed, step, slot]).generate_state(1, np.uint32)[0])
