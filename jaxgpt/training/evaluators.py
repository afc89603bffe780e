"""What a run measures at its validations, behind one small interface (loop.py calls them in turn).

    for e in evaluators(run, mesh, rows):
        if e.due(done):
            scalars = e(model, done)          # the record's figures ("val/loss", "hellaswag/acc", ...)
    e.since_checkpoint()                      # what meta.json keeps of it (then cleared)

- Validation: the mean loss over the validation batches (every token scored, or for a conversation
  dataset every answer token), at every validation.
- HellaSwag and CORE (train.json hellaswag_interval / core_interval): at the validations of steps
  that are a multiple of their interval, and at the last step; their results also go to meta.json.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np
from tqdm import tqdm

from jaxgpt.conversations.rows import ConversationRows
from jaxgpt.data.samplers.windows import WholeSplit
from jaxgpt.distributed import sharding
from jaxgpt.evaluation.scoring import eval_sums

if TYPE_CHECKING:
    from jaxgpt.training.run import Run


class Evaluator(Protocol):
    name: str

    def due(self, done: int) -> bool:
        """Whether it runs at the validation of step `done`."""
        ...

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        """Measure the model at step `done`; the record's figures."""
        ...

    def since_checkpoint(self) -> dict[str, Any]:
        """meta.json's entries for what was measured since the last checkpoint (then forgotten)."""
        ...


class Validation:
    """The mean training loss over the validation batches; `tokens`: how many targets it averaged."""

    name = "val"

    def __init__(self, run: Run, mesh: Any, rows: slice) -> None:
        self.batches, self.cfg, self.mesh, self.rows = run.val_batches, run.train_cfg, mesh, rows
        self.tokens = 0

    def due(self, done: int) -> bool:
        return True

    def _count(self) -> int:
        """Microbatches validated: the whole split for "all", else the first N (capped for conversations)."""
        val, n = self.batches, self.cfg.validation_batches
        if isinstance(val, WholeSplit) or (isinstance(val, ConversationRows) and n == "all"):
            return val.n_batches
        return min(n, val.n_batches) if isinstance(val, ConversationRows) else n

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        val, B, n = self.batches, self.cfg.microbatch_size, self._count()
        weighted = isinstance(val, (WholeSplit, ConversationRows))  # they give weights (and segments)
        sums = []  # device scalars, read once at the end: no host round trip per batch
        for i in range(n):
            x, y, *rest = val.microbatch(i, rows=self.rows)
            rest = rest if weighted else [np.ones(x.shape, np.float32)]
            sums.append(eval_sums(model, *(sharding.put_batch(a, self.mesh, B) for a in (x, y, *rest)))[0])
        # Counted on the host, not the device: exact at any size (the rows of every process together).
        if isinstance(val, ConversationRows):
            self.tokens = self.tokens or val.targets_in(n)  # the same rows every time
        else:
            self.tokens = val.n_targets if isinstance(val, WholeSplit) else n * B * val.seq_len
        loss = float(np.sum(np.asarray(jax.device_get(sums), np.float64))) / self.tokens
        return {"val/loss": loss, "val/tokens": self.tokens}

    def since_checkpoint(self) -> dict[str, Any]:
        return {}


class _Benchmark:
    """HellaSwag or CORE at the validations of every `every`-th step and at the last one."""

    def __init__(self, run: Run, every: int | None) -> None:
        self.run, self.every, self.results = run, every, []

    def due(self, done: int) -> bool:
        return self.every is not None and (done % self.every == 0 or done == self.run.total_steps)

    def since_checkpoint(self) -> dict[str, Any]:
        results, self.results = self.results, []
        return {self.name: results}


class HellaSwag(_Benchmark):
    name = "hellaswag"

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        from jaxgpt.data.tokenizer import get_tokenizer
        from jaxgpt.evaluation.scoring import hellaswag_score

        tok = self.run.tokenizer or get_tokenizer(self.run.train_cfg.tokenizer)
        r = hellaswag_score(model, self.run.hellaswag, tok, progress=False)
        self.results.append(
            {
                "step": done,
                "acc": r["acc"],
                "acc_norm": r["acc_norm"],
                "examples": r["examples"],
                "tokenizer": r["tokenizer"],
            }
        )
        if jax.process_index() == 0:
            tqdm.write(
                f"step {done}: hellaswag acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f} ({r['examples']:,} examples)"
            )
        return {"hellaswag/acc": r["acc"], "hellaswag/acc_norm": r["acc_norm"]}


class Core(_Benchmark):
    name = "core"

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        from jaxgpt.evaluation.scoring import core_score

        r = core_score(model, self.run.core, progress=False)
        self.results.append(
            {
                "step": done,
                "CORE": r["core"],
                "capped": r["capped"],
                "tasks": {
                    label: {k: t[k] for k in ("accuracy", "centered", "examples")} for label, t in r["tasks"].items()
                },
            }
        )
        if jax.process_index() == 0:
            tqdm.write(
                f"step {done}: CORE {r['core']:.4f} ({len(r['tasks'])} tasks"
                f"{', examples capped per task' if r['capped'] else ''})"
            )
        return {"core/CORE": r["core"]} | {f"core/{label}": t["centered"] for label, t in r["tasks"].items()}


def evaluators(run: Run, mesh: Any, rows: slice) -> list[Evaluator]:
    """What this run measures at its validations, in the order they run (validation last: its loss
    decides the checkpoint and the target)."""
    found: list[Evaluator] = []
    if run.hellaswag is not None:
        found.append(HellaSwag(run, run.train_cfg.hellaswag_interval))
    if run.core is not None:
        found.append(Core(run, run.train_cfg.core_interval))
    return [*found, Validation(run, mesh, rows)]
