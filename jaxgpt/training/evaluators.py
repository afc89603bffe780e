"""What a run measures at its validations, each given what it needs (loop.py makes them jobs).

    val = Validation(run.val_batches, cfg.validation_batches, mesh, rows, cfg.microbatch_size)
    scalars = val(model)                      # {"val/loss", "val/tokens"}
    bench = HellaSwag(examples, tok)          # or Core(tasks)
    scalars = bench(model, done)              # the record's figures; bench.since_checkpoint(): meta.json's

- Validation: the mean loss over the validation batches (every token scored, or for a conversation
  dataset every answer token), at every validation.
- HellaSwag and CORE (train.json hellaswag_interval / core_interval): at the validations of steps that
  are a multiple of their interval, and at the last step; their results also go to meta.json.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import numpy as np
from tqdm import tqdm

from jaxgpt.data.samplers.batch import Sampler
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.distributed import sharding
from jaxgpt.evaluation.scoring import eval_sums


class Validation:
    """The mean training loss over the validation batches; `tokens`: how many targets it averaged."""

    def __init__(
        self, batches: Sampler, asked: int | Literal["all"], mesh: Any, rows: slice, microbatch_size: int
    ) -> None:
        self.batches, self.mesh, self.rows, self.microbatch_size = batches, mesh, rows, microbatch_size
        self.count = batches.validation_count(asked)
        self.tokens = 0

    def __call__(self, model: Any) -> dict[str, float]:
        sums = []  # device scalars, read once at the end: no host round trip per batch
        for i in range(self.count):
            b = self.batches.microbatch(i, rows=self.rows)
            weights = b.weights if b.weights is not None else np.ones(b.inputs.shape, np.float32)
            arrays = (b.inputs, b.targets, weights) + ((b.segments,) if b.segments is not None else ())
            sums.append(eval_sums(model, *(sharding.put_batch(a, self.mesh, self.microbatch_size) for a in arrays))[0])
        # Counted on the host, not the device: exact at any size (the rows of every process together).
        self.tokens = self.tokens or self.batches.targets_in(self.count)  # the same rows every time
        loss = float(np.sum(np.asarray(jax.device_get(sums), np.float64))) / self.tokens
        return {"val/loss": loss, "val/tokens": self.tokens}


class _Benchmark:
    """Results kept for meta.json until the next checkpoint takes them."""

    name = ""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def since_checkpoint(self) -> dict[str, Any]:
        results, self.results = self.results, []
        return {self.name: results}


class HellaSwag(_Benchmark):
    name = "hellaswag"

    def __init__(self, examples: list[Any], tok: Tokenizer) -> None:
        super().__init__()
        self.examples, self.tok = examples, tok

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        from jaxgpt.evaluation.scoring import hellaswag_score

        r = hellaswag_score(model, self.examples, self.tok, progress=False)
        self.results.append({"step": done} | {k: r[k] for k in ("acc", "acc_norm", "examples", "tokenizer")})
        if jax.process_index() == 0:
            tqdm.write(
                f"step {done}: hellaswag acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f} ({r['examples']:,} examples)"
            )
        return {"hellaswag/acc": r["acc"], "hellaswag/acc_norm": r["acc_norm"]}


class Core(_Benchmark):
    name = "core"

    def __init__(self, tasks: list[Any]) -> None:
        super().__init__()
        self.tasks = tasks

    def __call__(self, model: Any, done: int) -> dict[str, float]:
        from jaxgpt.evaluation.scoring import core_score

        r = core_score(model, self.tasks, progress=False)
        tasks = {label: {k: t[k] for k in ("accuracy", "centered", "examples")} for label, t in r["tasks"].items()}
        self.results.append({"step": done, "CORE": r["core"], "capped": r["capped"], "tasks": tasks})
        if jax.process_index() == 0:
            tqdm.write(
                f"step {done}: CORE {r['core']:.4f} ({len(r['tasks'])} tasks"
                f"{', examples capped per task' if r['capped'] else ''})"
            )
        return {"core/CORE": r["core"]} | {f"core/{label}": t["centered"] for label, t in r["tasks"].items()}
