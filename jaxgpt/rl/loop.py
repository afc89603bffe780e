"""An RL run's loop: per step, sample answers to its prompts from the current weights through the engine,
reward them, and train on the group advantages; validate on held-out prompts; checkpoint as pre-training.

    code = train(prepare_rl_run(...), stop)      # 0 done, 130 stopped with a checkpoint

Step s draws rl.samples_per_prompt answers to each of pool.for_step(s) with engine seeds of (seed, s):
a resumed run draws exactly the uninterrupted one's samples. The update is the train step's on a Batch
whose advantages make its loss minus the mean over sampled tokens of logprob x advantage (PPO's clipped
ratio when rl.updates_per_batch > 1), plus rl.kl_coef's k3 KL to init_from's frozen weights and
rl.sft_rows' fine-tuning rows (a pure function of (seed, s)). Validation: greedy (the run's `best`) and
rl.validation_samples samples (pass@1, pass@k). The whole story: docs/fine-tuning.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import time
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from jaxgpt import ops
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, to_dict
from jaxgpt.conversations.assistant import Assistant
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.distributed import sharding
from jaxgpt.evaluation.chat_eval import score_task
from jaxgpt.generation.engine import Request
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model
from jaxgpt.model.loss import token_logprobs
from jaxgpt.rl.prompts import sample_seed
from jaxgpt.rl.samples import group_advantages, sample_rows
from jaxgpt.tasks.report import pass_at_k
from jaxgpt.tracking import charts
from jaxgpt.tracking.metrics import RunLog
from jaxgpt.training import memory
from jaxgpt.training.jobs import Job, run_jobs
from jaxgpt.training.optimizer import part_rates
from jaxgpt.training.state import build_state, memory_limit
from jaxgpt.training.train_step import PolicyLoss, step_key

if TYPE_CHECKING:
    from jaxgpt.rl.run import RLRun
    from jaxgpt.stopping import StopFlag


def train(run: RLRun, stop: StopFlag) -> int:
    """Train `run` from where it stands to its last step or a stop request; the exit code."""
    s = Session(run, stop)
    if s.start >= run.total_steps:
        print(f"Nothing to do: {run.run_dir} already trained {s.start}/{run.total_steps} steps.")
        return 0
    s.records.configs(s.start, {"model.json": to_dict(run.model_cfg), "train.json": to_dict(run.train_cfg)})
    bar = tqdm(total=run.total_steps, initial=s.start, unit="step", dynamic_ncols=True)
    code = 1
    try:
        for step in range(s.start, run.total_steps):
            s.scalars = s.step(step)
            done, stopping = step + 1, stop.requested
            bar.update(1)
            bar.set_postfix(
                reward=f"{s.scalars['rl/reward']:.3f}", loss=f"{s.scalars['train/loss']:.4f}", refresh=False
            )
            results = run_jobs(s.jobs, done, stopping or done == run.total_steps)
            if results.get("checkpoint"):
                bar.write(results["checkpoint"])
            if stopping:
                bar.write(f"Interrupted after step {done}/{run.total_steps}; checkpoint saved.")
                bar.write(f"Resume with: uv run train.py {run.run_dir}")
                code = 130
                return code
        code = 0
        return code
    finally:
        bar.close()
        s.records.close(code)


class Session:
    """One call of `train`: the state, the engine, the records, and a step's and a validation's work."""

    def __init__(self, run: RLRun, stop: StopFlag) -> None:
        self.run, self.cfg, self.rl, self.stop = run, run.train_cfg, run.train_cfg.rl, stop
        u, rl = self.rl.updates_per_batch, self.rl
        policy = PolicyLoss(clip=rl.clip_ratio, kl=rl.kl_coef, sft=rl.sft_coef)
        rows, row_bytes = self._engine_rows()
        self.state, meta = build_state(
            run,
            print,
            optimizer_steps=run.total_steps * u,
            policy=policy,
            max_split=1,
            reserve=rows * row_bytes,
            sample=self._planning_batch(),
        )
        data = self.state.mesh.shape[sharding.DATA]
        if run.mix is not None and run.mix.microbatch_size % data:
            raise ConfigError(
                f"{run.run_dir}/train.json: rl.sft_rows={rl.sft_rows} gives {run.mix.microbatch_size} fine-tuning rows "
                f"a microbatch, which do not divide by the mesh data axis ({data} devices)"
            )
        self.reference = _reference(run, self.state.mesh) if rl.kl_coef > 0 else None
        self.start = meta.get("step", 0)
        self.best = meta.get("best_score")
        self.started = time.perf_counter()
        self.elapsed = meta.get("elapsed_s", 0.0)
        mesh = self.state.mesh if self.state.mesh.size > 1 else None
        self.bot = Assistant(self.state.model, run.tok, run.template, str(run.run_dir), rows=rows, mesh=mesh)
        self.records = RunLog(run.run_dir, self.start, enabled=True, wandb=self.cfg.wandb)
        self.sampling = SamplingParams(self.rl.max_new_tokens, self.rl.temperature, self.rl.top_k)
        self.scalars: dict[str, float] = {}  # the last step's row of the record
        self.stats: dict[str, Any] = {}  # the last update's optimiser statistics
        checkpoints = (self.cfg.checkpoint_interval,)
        self.jobs = [  # the periodic work: the held-out prompts, then (every checkpoint has a validation) a checkpoint
            Job("val", lambda done, _: self.validate(done), every=(self.cfg.validation_interval, *checkpoints)),
            Job("checkpoint", lambda done, r: self.save(done, self.scalars, r["val"]), every=checkpoints),
        ]

    def _engine_rows(self) -> tuple[int, int]:
        """The sampling engine's rows and each one's KV-cache bytes: every sample of a step at once, or
        on a device whose memory is known as many prompts' samples as a share of it holds (memory.py)."""
        m = self.run.model_cfg
        row_bytes = 2 * m.n_layers * m.kv_heads * m.head_dim * m.context_length
        row_bytes *= np.dtype(ops.select(m).kv_dtype()).itemsize
        wanted = self.rl.samples_per_step
        rows = memory.engine_rows(wanted, self.rl.samples_per_prompt, row_bytes, memory_limit(self.run))
        if rows < wanted:
            cache = memory.size(rows * row_bytes)
            print(f"sampling engine: {rows} rows for the {wanted} samples a step (their KV cache: {cache})")
        return rows, row_bytes

    def _planning_batch(self) -> Batch:
        """A step's batch as _update gives the step, its fields and shapes (what the memory plan compiles)."""
        cfg, n, k = self.cfg, self.rl.samples_per_step, self.cfg.gradient_accumulation_steps
        batch = sample_rows([[0]] * n, [[0]] * n, np.zeros(n), cfg.seq_len(self.run.model_cfg), k)
        zeros = np.zeros(batch.inputs.shape, np.float32)
        return batch._replace(
            mix=None if self.run.mix is None else self.run.mix.batch(0, k),
            ref_logprobs=zeros if self.rl.kl_coef > 0 else None,
            old_logprobs=zeros if self.rl.updates_per_batch > 1 else None,
        )

    def _weights(self) -> None:
        """The engine draws from the weights the last step left."""
        self.state.step.sync()
        self.bot.engine.set_weights(self.state.model)

    def step(self, step: int) -> dict[str, float]:
        """Sample, reward, update: RL step `step`; its row of the record."""
        started = time.perf_counter()
        chosen, drawn = self._draw(step)
        sampled_s = time.perf_counter() - started
        rewards = self._rewards(chosen, drawn)
        stats = self._update(step, chosen, drawn, group_advantages(rewards, self.rl.advantage == "mean_std"))
        tokens = sum(len(r.sampled) for r in drawn)
        scalars = {
            "rl/reward": float(rewards.mean()),
            "rl/groups_with_signal": float((rewards.std(axis=1) > 0).mean()),  # groups not all alike
            "rl/answer_tokens": tokens / len(drawn),
            "rl/sampling_tokens_per_s": tokens / max(sampled_s, 1e-9),
            "train/loss": float(stats["loss"]),
            **({"rl/kl": float(stats["kl"])} if "kl" in stats else {}),
            **({"rl/sft_loss": float(stats["sft_loss"])} if "sft_loss" in stats else {}),
            "optim/lr": float(stats["learning_rate"]),
            "optim/grad_norm": float(stats["grad_norm"]),
            "optim/skipped": float(stats["skipped_step"]),
            "perf/step_time_s": time.perf_counter() - started,
        }
        self.stats = stats
        self.records.scalars(step + 1, scalars)
        return scalars

    def _draw(self, step: int) -> tuple[list[int], list[Request]]:
        """Step `step`'s prompts and their samples, prompt by prompt, from the current weights."""
        self._weights()
        chosen = self.run.prompts.for_step(step, self.rl.prompts_per_step, self.cfg.seed)
        params = [self.bot.params(self.sampling, seed=sample_seed(self.cfg.seed, step, j)) for j in range(len(chosen))]
        prompts = [self.run.prompts.ids[i] for i in chosen]
        return chosen, self.bot.engine.generate(prompts, params, n=self.rl.samples_per_prompt)

    def _rewards(self, chosen: list[int], drawn: list[Request]) -> np.ndarray:
        """(P, G): each sample's reward by its task's rule."""
        G, items = self.rl.samples_per_prompt, self.run.prompts.items
        flat = [
            items[i][0].reward(drawn[j * G + g].text.text, items[i][1]) for j, i in enumerate(chosen) for g in range(G)
        ]
        return np.array(flat, np.float64).reshape(-1, G)

    def _update(self, step: int, chosen: list[int], drawn: list[Request], adv: np.ndarray) -> dict[str, Any]:
        """The optimiser step(s) on the samples; the last one's statistics."""
        cfg, G = self.cfg, self.rl.samples_per_prompt
        prompts = [self.run.prompts.ids[i] for i in chosen for _ in range(G)]
        batch = sample_rows(
            prompts,
            [r.sampled for r in drawn],
            adv.reshape(-1),
            cfg.seq_len(self.run.model_cfg),
            cfg.gradient_accumulation_steps,
        )
        if self.run.mix is not None:
            batch = batch._replace(mix=self.run.mix.batch(step, cfg.gradient_accumulation_steps))
        batch = batch.map(lambda a: sharding.put_batch(a, self.state.mesh, cfg.microbatch_size))
        if self.reference is not None:  # once per batch, from the frozen starting weights
            batch = batch._replace(ref_logprobs=_logprobs(*self.reference, batch.inputs, batch.targets))
        u = self.rl.updates_per_batch
        if u > 1:  # the ratio's denominator: the weights that drew the samples
            batch = batch._replace(old_logprobs=_logprobs(*nnx.split(self.state.model), batch.inputs, batch.targets))
        for i in range(u):
            _losses, stats = self.state.step(batch, step_key(cfg.seed, step * u + i))
        return jax.device_get(stats)

    def validate(self, done: int) -> dict[str, float]:
        """The held-out prompts: greedy exact (the run's best is the highest), pass@1 and pass@k sampled."""
        self._weights()
        k, greedy = self.rl.validation_samples, dataclasses.replace(self.sampling, temperature=0.0, top_k=None)
        sums, out = np.zeros(3), {}
        for task in self.run.validation:
            first = pass_at_k(score_task(self.bot, task, greedy))
            many = pass_at_k(score_task(self.bot, task, self.sampling, k))
            out[f"val/{task.name}"] = first["pass@1"]
            sums += first["examples"] * np.array([first["pass@1"], many["pass@1"], many["pass@k"]])
        total = sum(len(t.examples) for t in self.run.validation)
        means = [float(x) for x in sums / total]
        out = {"val/greedy": means[0], "val/pass@1": means[1], f"val/pass@{k}": means[2]} | out
        self.records.scalars(done, out)
        tqdm.write(
            f"step {done}: held out greedy {out['val/greedy']:.4f} | pass@1 {out['val/pass@1']:.4f} | "
            f"pass@{k} {out[f'val/pass@{k}']:.4f} ({total:,} prompts)"
        )
        return out

    def save(self, done: int, scalars: dict[str, float], val: dict[str, float]) -> str:
        """Checkpoint step `done` (the run's best: the highest held-out greedy score); its line."""
        score = val["val/greedy"]
        is_best = bool(self.best is None or score > self.best)
        self.best = score if is_best else self.best
        self.records.flush()
        self.state.step.sync()
        path = ckpt.save_checkpoint(
            self.run.run_dir,
            self.state.model,
            self.state.optimizer,
            self._meta(done, scalars, val, is_best),
            {"model.json": to_dict(self.run.model_cfg), "train.json": to_dict(self.cfg)},
            keep_last=self.cfg.keep_last_checkpoints,
            files=self.run.checkpoint_files(),
        )
        self.records.checkpoint(done, path.name)
        charts.draw_charts(self.run.run_dir)
        return (
            f"step {done}/{self.run.total_steps} | reward {scalars['rl/reward']:.4f} | held out greedy {score:.4f} | "
            f"saved {path.name}"
        )

    def _meta(self, done: int, scalars: dict[str, float], val: dict[str, float], is_best: bool) -> dict[str, Any]:
        """meta.json of an RL checkpoint: what a resume and a reader of this one checkpoint need."""
        stats = self.stats
        return {
            "format": 2,
            "kind": "rl",
            "step": done,
            "total_steps": self.run.total_steps,
            "time_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "rl": {"reward": scalars["rl/reward"], **{k.split("/", 1)[1]: v for k, v in val.items()}},
            "val_error": 1.0 - val["val/greedy"],  # lower is better, as a validation loss
            "best_key": "val_error",
            "best_score": self.best,
            "is_best": is_best,
            "learning_rate": float(stats["learning_rate"]),
            "learning_rates": part_rates(stats),
            "optimizer": self.cfg.optimizer,
            "grad_norm": float(stats["grad_norm"]),
            "optimizer_steps_applied": int(stats["gradient_step"]),
            "elapsed_s": self.elapsed + time.perf_counter() - self.started,
            "mesh": dict(self.state.mesh.shape),
            "compute_dtype": self.state.compute_dtype,
            "memory_plan": dataclasses.asdict(self.state.plan),
            "data_position": {"next_step": done, "prompts": len(self.run.prompts.ids)},
            "reference": None if self.run.reference is None else str(self.run.reference),
            "rng": {"seed": self.cfg.seed, "next_step": done, "scheme": "samples: SeedSequence([seed, step, prompt])"},
        }


def _reference(run: RLRun, mesh: Any) -> tuple[nnx.GraphDef, nnx.State]:
    """init_from's weights, frozen, on the mesh as the model's are: no optimiser state, no gradients."""
    cfg = run.train_cfg
    model = sharding.create_sharded(
        lambda: build_model(run.model_cfg, seed=cfg.seed), mesh, cfg.mesh.fsdp, where=f"{run.run_dir}/model.json"
    )
    ckpt.load_weights(model, run.reference / ckpt.WEIGHTS)
    print(f"KL reference: {run.reference} (rl.kl_coef {cfg.rl.kl_coef})")
    return nnx.split(model)


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef: nnx.GraphDef, state: nnx.State, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    """(k, B, T) logprobs of the targets under these weights (the samplers', before the updates)."""
    model = nnx.merge(graphdef, state)
    return jax.lax.map(lambda xy: token_logprobs(model, *xy), (inputs, targets))
