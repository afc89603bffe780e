"""train.json's "rl" section: a reinforcement-learning run from checkable rewards (jaxgpt/rl/).

    "rl": {"prompts": {"task": "builtin", "tasks": ["add"]}, "samples_per_prompt": 16, "max_new_tokens": 8}

Frozen, typed and checked like every config (config.py holds the rest of train.json); a bad value is
a ConfigError of one line naming train.json, the key and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from jaxgpt.config_json import TRAIN_FILE, ConfigError

PROMPT_TASKS = ("builtin", "gsm8k", "jsonl")
ADVANTAGES = ("mean", "mean_std")


@dataclass(frozen=True, slots=True)
class PromptSet:
    """Where prompts and their checkable references come from (jaxgpt/tasks/)."""

    # "builtin": the built-in instruction tasks (jaxgpt/conversations/instructions.py); "gsm8k": GSM8K's JSONL
    # (question, answer ending in "#### N"); "jsonl": a user's JSONL of {"prompt", "reference"}.
    task: Literal["builtin", "gsm8k", "jsonl"]
    path: str | None = None  # gsm8k and jsonl: the file, relative to the run directory
    tasks: tuple[str, ...] | None = None  # builtin: which instruction tasks (null: every one)
    # builtin: how many questions are drawn over every task, as an instructions dataset draws them, before
    # `tasks` chooses (null: its 24,000 for training, its 600 held out for validation); a file: its first N
    examples: int | None = None
    # How an answer is scored: "exact", "exact_nocase", "last_number" or {"rule": "regex", "pattern": ...}
    # (jaxgpt/tasks/rewards.py). null: the task's own (builtin exact, gsm8k last_number); jsonl needs one.
    reward: str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        where = f"{TRAIN_FILE}: rl prompts"
        if self.task not in PROMPT_TASKS:
            raise ConfigError(f"{where}: task={self.task!r} must be one of {', '.join(PROMPT_TASKS)}")
        if (self.path is None) != (self.task == "builtin"):
            need = "takes no path (its questions are made here)" if self.task == "builtin" else "needs a path"
            raise ConfigError(f"{where}: task {self.task!r} {need}, got path={self.path!r}")
        if self.tasks is not None and self.task != "builtin":
            raise ConfigError(f"{where}: tasks={self.tasks!r} names built-in tasks, but task is {self.task!r}")
        if self.examples is not None and self.examples < 1:
            raise ConfigError(f"{where}: examples={self.examples} must be >= 1")
        if self.task == "jsonl" and self.reward is None:
            raise ConfigError(f'{where}: task \'jsonl\' needs a reward rule (e.g. "exact" or "last_number")')


@dataclass(frozen=True, slots=True)
class RLConfig:
    """Per step: prompts_per_step prompts, samples_per_prompt answers each from the current weights,
    each rewarded; advantage = reward minus its group's mean (option: over its standard deviation);
    loss = minus the mean over the sampled tokens of log-probability times advantage, plus kl_coef times
    the mean over them of the k3 KL estimate to init_from's weights, plus sft_coef times the mean
    cross-entropy of sft_rows rows of init_from's fine-tuning data."""

    prompts: PromptSet  # what is trained on
    validation: PromptSet | None = None  # held out, scored at each validation; null: builtin's held-out questions
    prompts_per_step: int = 16
    samples_per_prompt: int = 16  # G: a group, whose mean reward is each sample's baseline
    max_new_tokens: int = 64
    temperature: float = 1.0  # the samples' (nanochat's chat_rl draws at 1.0)
    top_k: int | None = None
    advantage: Literal["mean", "mean_std"] = "mean"  # "mean_std": also divided by the group's std (GRPO)
    # Optimiser steps on each batch of samples: 1 is on-policy; more use PPO's clipped ratio against
    # the weights that drew the samples, clipped to 1 +- clip_ratio.
    updates_per_batch: int = 1
    clip_ratio: float = 0.2
    validation_samples: int = 8  # k of pass@k at each validation (pass@1 is the mean over the k)
    # The leashes to the starting policy (docs/fine-tuning.md "Holding on to what the model knew"), each
    # off at 0. kl_coef: weight of the per-sampled-token k3 estimate of KL(policy || init_from's weights),
    # exp(ref - logp) - (ref - logp) - 1, the reference log-probs a forward of the frozen weights per batch.
    kl_coef: float = 0.0
    # sft_rows: rows of init_from's own fine-tuning data (its train.json's dataset, packed as it trained
    # on them) trained on beside each step's samples, their mean cross-entropy weighted by sft_coef.
    sft_rows: int = 0
    sft_coef: float = 1.0

    def __post_init__(self) -> None:
        where = f"{TRAIN_FILE}: rl"
        for key in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "updates_per_batch"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}.{key}={getattr(self, key)} must be >= 1")
        if self.samples_per_prompt < 2:
            raise ConfigError(
                f"{where}.samples_per_prompt={self.samples_per_prompt} must be >= 2: the group's mean is each "
                f"sample's baseline, so one sample alone always has advantage 0"
            )
        if not self.temperature > 0:
            raise ConfigError(f"{where}.temperature={self.temperature} must be > 0 (greedy samples are all alike)")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"{where}.top_k={self.top_k} must be >= 1 (or null)")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"{where}.advantage={self.advantage!r} must be one of {', '.join(ADVANTAGES)}")
        if not 0 < self.clip_ratio < 1:
            raise ConfigError(f"{where}.clip_ratio={self.clip_ratio} must be in (0, 1)")
        if self.validation_samples < 1:
            raise ConfigError(f"{where}.validation_samples={self.validation_samples} must be >= 1")
        if not (self.kl_coef >= 0 and math.isfinite(self.kl_coef)):
            raise ConfigError(f"{where}.kl_coef={self.kl_coef} must be a finite number >= 0 (0: no KL term)")
        if self.sft_rows < 0:
            raise ConfigError(f"{where}.sft_rows={self.sft_rows} must be >= 0 (0: no fine-tuning rows)")
        if not (self.sft_coef > 0 and math.isfinite(self.sft_coef)):
            raise ConfigError(f"{where}.sft_coef={self.sft_coef} must be a finite number > 0")
        if self.validation is None and self.prompts.task != "builtin":
            raise ConfigError(f"{where}.validation: give held-out prompts for task {self.prompts.task!r}")

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    def check_train(self, train: Any) -> None:
        """train.json's other keys as an RL run reads them (train: the TrainConfig holding this section)."""
        where = TRAIN_FILE
        if train.init_from is None:
            raise ConfigError(f"{where}: an rl run starts from a fine-tuned checkpoint: give init_from")
        meaningless = {
            "packing": train.packing != "windows",
            "targets": train.targets != "next",
            "train_tokens": train.train_tokens is not None,
            "train_epochs": train.train_epochs is not None,
            "hellaswag_interval": train.hellaswag_interval is not None,
            "core_interval": train.core_interval is not None,
            "target_val_loss": train.target_val_loss is not None,
        }
        given = [key for key, on in meaningless.items() if on]
        if train.dataset.source != "builtin" or train.dataset.options:
            given.insert(0, "dataset")
        if given:
            raise ConfigError(
                f"{where}: {', '.join(given)}: no meaning in an rl run (its prompts are rl.prompts, its "
                f"length train_steps); leave them out"
            )
        if self.sft_rows % train.gradient_accumulation_steps:
            raise ConfigError(
                f"{where}: rl.sft_rows={self.sft_rows} must divide by gradient_accumulation_steps="
                f"{train.gradient_accumulation_steps} (each microbatch takes as many fine-tuning rows)"
            )
        if train.sequences_per_step != self.samples_per_step:
            raise ConfigError(
                f"{where}: microbatch_size x gradient_accumulation_steps = {train.microbatch_size} x "
                f"{train.gradient_accumulation_steps} = {train.sequences_per_step} must equal rl.prompts_per_step x "
                f"rl.samples_per_prompt = {self.prompts_per_step} x {self.samples_per_prompt} = {self.samples_per_step}"
                f" (every sample is one row of the update)"
            )
