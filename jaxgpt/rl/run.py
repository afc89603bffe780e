"""An RL run's set-up: train.json's rl section, the fine-tuned checkpoint it starts from (and holds on to:
the KL's reference weights, the fine-tuning rows mixed in), its chat template and tokenizer, the prompts
and the resume point, all checked before JAX starts (one line per problem).

    run = prepare_rl_run(Path("runs/tiny-rl"), data_root=Path("data"), restart=False)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jaxgpt.checkpoints import layout as ckpt
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig, from_dict, load_run_configs, to_dict
from jaxgpt.conversations.rows import ConversationRows
from jaxgpt.conversations.template import TEMPLATE_FILE, ChatTemplate, TemplateError, read_template
from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import TOKENIZER_FILE, Tokenizer, TrainedTokenizer
from jaxgpt.preparation.prepare import prepare_dataset
from jaxgpt.rl.prompts import PromptPool, read_prompt_set
from jaxgpt.tasks.base import Task
from jaxgpt.training.run import RUNTIME_KEYS, check_writable, init_checkpoint, lock_run, resume_point

# Keys whose change would make a resumed run draw other samples or train another objective.
_SAMPLES_KEYS = ("rl", "tokenizer", "microbatch_size", "gradient_accumulation_steps", "seed", "optimizer")


@dataclass
class RLRun:
    """Everything an RL run needs, checked before any compile."""

    run_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    total_steps: int  # RL steps: each draws one batch of samples
    resume_from: Path | None
    init_from: Path | None  # the fine-tuned weights a new run starts from
    template: ChatTemplate
    tok: Tokenizer
    prompts: PromptPool
    validation: list[Task]  # held out: scored at each validation
    tokenizer: TrainedTokenizer | None = None  # a trained tokenizer: each checkpoint keeps its file
    # init_from's checkpoint, resumed or not, where rl.kl_coef or rl.sft_rows hold on to it: the KL's
    # reference weights and the fine-tuning data's source
    reference: Path | None = None
    mix: ConversationRows | None = None  # rl.sft_rows: init_from's fine-tuning rows, rl.sft_rows per step

    def checkpoint_files(self) -> dict[str, bytes]:
        """What every checkpoint holds besides weights: the chat template (and a trained tokenizer's file)."""
        files = {TEMPLATE_FILE: (json.dumps(self.template.to_dict(), indent=2) + "\n").encode()}
        if self.tokenizer is not None:
            files[TOKENIZER_FILE] = self.tokenizer.data
        return files


def prepare_rl_run(run_dir: Path, *, data_root: Path, restart: bool, processes: int = 1) -> RLRun:
    """Load and cross-check an RL run (ConfigError, CheckpointError, TemplateError, TaskError: one line)."""
    model_cfg, train_cfg = load_run_configs(run_dir)
    assert train_cfg.rl is not None, "not an rl run"
    if processes > 1:
        raise ConfigError(
            f"{run_dir}/train.json: an rl run draws its samples on one process's devices; run it as one "
            f"process (a mesh over that process's devices is used)"
        )
    lock_run(run_dir)
    check_writable(run_dir, model_cfg)
    if restart:
        moved = ckpt.archive_checkpoints(run_dir)
        if moved:
            print(f"Moved old checkpoints aside to {moved}")
    resume_from = resume_point(run_dir)
    init_from = init_checkpoint(run_dir, model_cfg, train_cfg) if resume_from is None else None
    if resume_from is not None:
        _check_resume(run_dir, resume_from, model_cfg, train_cfg)
    rl = train_cfg.rl
    reference = None
    if rl.kl_coef > 0 or rl.sft_rows > 0:
        reference = init_from or init_checkpoint(run_dir, model_cfg, train_cfg)
        if resume_from is not None:
            _check_reference(run_dir, resume_from, reference)
    source = resume_from or init_from
    template = read_template(source)
    if template is None:
        raise TemplateError(
            f"{run_dir}/train.json: init_from={train_cfg.init_from!r} ({source}) has no chat template: an rl "
            f"run starts from a model fine-tuned on conversations (its {TEMPLATE_FILE})"
        )
    tok = ckpt.checkpoint_tokenizer(source, train_cfg.tokenizer, data_root)
    template.check(tok)
    return RLRun(
        run_dir,
        model_cfg,
        train_cfg,
        train_cfg.train_steps,
        resume_from,
        init_from,
        template,
        tok,
        _pool(run_dir, model_cfg, train_cfg, template, tok),
        read_prompt_set(train_cfg.rl.validation or train_cfg.rl.prompts, run_dir, "validation"),
        tok if isinstance(tok, TrainedTokenizer) else None,
        reference,
        _mix(run_dir, model_cfg, train_cfg, reference, data_root) if rl.sft_rows else None,
    )


def _check_reference(run_dir: Path, resumed: Path, reference: Path) -> None:
    """A resumed run holds on to the weights it started from: init_from must still name them."""
    was = ckpt.read_meta(resumed).get("reference")
    if was is not None and Path(was) != reference:
        raise ConfigError(
            f"{run_dir}/train.json: init_from={reference} is not the checkpoint {resumed.name} started from "
            f"({was}), whose weights its KL term and fine-tuning rows hold on to; restore it or use --restart"
        )


def _mix(run_dir: Path, model: ModelConfig, train: TrainConfig, reference: Path, data_root: Path) -> ConversationRows:
    """rl.sft_rows: the rows init_from was fine-tuned on (its train.json's dataset, packed as it packed
    them), rl.sft_rows / gradient_accumulation_steps a microbatch, shuffled by the run's seed."""
    where = f"{run_dir}/train.json: rl.sft_rows={train.rl.sft_rows}"
    saved = ckpt.read_configs(reference).get("train.json")
    if saved is None:
        raise ConfigError(f"{where}: init_from {reference} holds no train.json to take its fine-tuning data from")
    tuned = from_dict(TrainConfig, saved, f"{reference}/train.json")
    if tuned.packing != "conversations":
        raise ConfigError(
            f"{where}: init_from {reference} was not fine-tuned on conversations (dataset "
            f"{tuned.dataset.source!r}, packing {tuned.packing!r}): there are no fine-tuning rows to mix in"
        )
    if tuned.tokenizer != train.tokenizer:
        raise ConfigError(f"{where}: init_from's data is {tuned.tokenizer!r} tokens, this run's {train.tokenizer!r}")
    try:
        dataset = open_dataset(
            prepare_dataset(tuned.dataset.source, tuned.tokenizer, data_root, options=tuned.dataset.options)
        )
        options = dataset.manifest["options"]
        return ConversationRows(
            dataset.train,
            microbatch_size=train.rl.sft_rows // train.gradient_accumulation_steps,
            seq_len=tuned.seq_len(model),
            seed=train.seed,
            too_long=options["too_long"],
            pack=options["pack"],
        )
    except DataError as e:
        raise DataError(f"{where}: {e}") from None


def _pool(run_dir: Path, model: ModelConfig, train: TrainConfig, template: ChatTemplate, tok: Tokenizer) -> PromptPool:
    """The training prompts that leave room for max_new_tokens in a row of sequence_length + 1 tokens."""
    rl = train.rl
    longest = min(train.seq_len(model) + 1, model.context_length) - rl.max_new_tokens
    pool = PromptPool.build(read_prompt_set(rl.prompts, run_dir, "train"), template, tok, longest)
    room = f"sequence_length={train.seq_len(model)} (context_length {model.context_length})"
    room += f" less max_new_tokens={rl.max_new_tokens}"
    lost = [name for name, (n, of) in pool.dropped.items() if n == of]
    if lost:  # a task asked for and never trained on: a setting to fix, not a note to miss
        raise ConfigError(
            f"{run_dir}/train.json: every rl.prompts prompt of {', '.join(lost)} is longer than {longest} tokens "
            f"({room}); raise sequence_length or lower max_new_tokens"
        )
    for name, (n, of) in pool.dropped.items():
        print(
            f"Note: {n:,} of {of:,} rl.prompts prompts of {name} are longer than {longest} tokens ({room}) "
            "and are left out"
        )
    return pool


def _check_resume(run_dir: Path, found: Path, model: ModelConfig, train: TrainConfig) -> None:
    """The checkpoint resumed from was trained as train.json says now: the same samples, the same model."""
    saved = ckpt.read_configs(found)
    if saved.get("model.json") is not None:
        old = to_dict(from_dict(ModelConfig, saved["model.json"], f"{found}/model.json"))
        for key, value in to_dict(model).items():
            if key not in RUNTIME_KEYS and old[key] != value:
                raise ConfigError(
                    f"{run_dir}/model.json: {key}={value!r} differs from checkpoint {found.name} ({key}={old[key]!r}); "
                    f"use --restart to train a new model"
                )
    old_train, now = saved.get("train.json") or {}, to_dict(train)
    try:  # through today's loader: keys added since (rl.kl_coef, ...) take their defaults
        old_train = to_dict(from_dict(TrainConfig, old_train, f"{found}/train.json"))
    except ConfigError:
        pass  # a key since removed: compare what is there
    for key in _SAMPLES_KEYS:
        if key in old_train and old_train[key] != now[key]:
            raise ConfigError(
                f"{run_dir}/train.json: {key} differs from checkpoint {found.name} (it would draw other samples or "
                f"train another objective on resume); use --restart"
            )
