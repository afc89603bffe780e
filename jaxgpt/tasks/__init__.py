"""Checkable prompt sets: the data side of generative chat evaluation and of RL's prompt sources.

    tasks = load_tasks(["gsm8k=test.jsonl", "arc-easy=ARC-Easy-Test.jsonl", "builtin"])
    for task in tasks:                     # Task: name, kind, examples, rule, baseline
        ex = task.examples[0]              # Example: messages (ending in a user message), reference, letters
        task.reward(answer, ex)            # 1.0 or 0.0
    report_lines({t.name: (outcomes[t.name], t.baseline) for t in tasks})   # pass@1, pass@k, ChatCORE

base.py      Example, Task, TaskError, the Reward protocol, nanochat's render_mc
rewards.py   ExactMatch, LastNumber, Regex; reward_rule(config value)
rows.py      JSONL / parquet / CSV records with file:line; nanochat's example order
public.py    GSM8K, ARC-Easy/Challenge, MMLU in their published formats
local.py     the built-in instruction tasks; a user's JSONL of prompts and references
load.py      tasks by name: parse_task_args, load_task, load_tasks
report.py    pass_at_k, chat_core, report_lines
download.py  the public files, fetched once (download_dataset.py tasks)

Modelled on nanochat's tasks/ and scripts/chat_eval.py. Pure Python and numpy: importing this
package never loads JAX (tests/tasks/test_tasks.py checks it in a fresh interpreter).
"""

from jaxgpt.tasks.base import Example, Reward, Task, TaskError, render_mc
from jaxgpt.tasks.load import TASK_NAMES, load_task, load_tasks, parse_task_args
from jaxgpt.tasks.local import builtin_tasks, read_jsonl
from jaxgpt.tasks.public import read_arc, read_gsm8k, read_mmlu
from jaxgpt.tasks.report import chat_core, pass_at_k, report_lines
from jaxgpt.tasks.rewards import ExactMatch, LastNumber, Regex, RewardError, reward_rule

__all__ = [
    "TASK_NAMES",
    "Example",
    "ExactMatch",
    "LastNumber",
    "Regex",
    "Reward",
    "RewardError",
    "Task",
    "TaskError",
    "builtin_tasks",
    "chat_core",
    "load_task",
    "load_tasks",
    "parse_task_args",
    "pass_at_k",
    "read_arc",
    "read_gsm8k",
    "read_jsonl",
    "read_mmlu",
    "render_mc",
    "report_lines",
    "reward_rule",
]
