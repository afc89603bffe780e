"""Run configuration: `model.json` -> ModelConfig, `train.json` -> TrainConfig.

Each config is a frozen, typed dataclass that maps one-to-one to its JSON file. Defaults live
here and nowhere else. Loading is strict: a malformed file, an unknown key, a wrong type or an
impossible value raises ConfigError with one line naming the file, the key and the value, long
before anything is compiled.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The loader lives in config_json.py; its names are imported from here by the rest of the package.
from jaxgpt.config_json import MODEL_FILE, TRAIN_FILE, ConfigError, from_dict, from_json, to_dict  # noqa: F401
from jaxgpt.config_rl import RLConfig

# train.json "tokenizer": "bytes", "gpt2" or a trained tokenizer's name, which becomes part of folder
# names (<data>/tokenizers/<name>, <source>-<name>); jaxgpt/data/tokenizer.py resolves it.
TOKENIZER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# train.json dataset sources of conversations (jaxgpt/conversations/prepare.py): fine-tuning on their answers.
CONVERSATION_SOURCES = ("conversations", "instructions")
FINEWEB_SOURCES = ("fineweb10B-gpt2", "fineweb-edu")  # fetched for the run's length; GPT-2 tokens by default


def default_tokenizer(source: str) -> str:
    """train.json's tokenizer when it names none, the same as download_dataset.py's for that source."""
    return "gpt2" if source in FINEWEB_SOURCES else "bytes"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # "gpt2": the full transformer; "a-to-a": token embedding straight into the output head
    # (the blog post's sanity check, which learns to map each token to itself).
    architecture: Literal["gpt2", "a-to-a"]
    vocab_size: int  # number of token ids; must exceed every id in the dataset
    context_length: int  # longest sequence the position embedding covers
    emb_dim: int  # residual stream width C
    n_heads: int = 1  # attention heads; emb_dim must divide by it
    n_layers: int = 0  # transformer blocks
    qkv_bias: bool = False  # bias on the fused query/key/value projection
    # false: no bias in any Linear or LayerNorm (nanoGPT's bias=False); true: GPT-2's layout
    # (every LayerNorm, the attention output and MLP projections; q/k/v as qkv_bias says).
    bias: bool = True
    drop_rate: float = 0.0  # dropout on embeddings, attention weights and residual branches
    tie_embeddings: bool = False  # output head shares the token embedding matrix (GPT-2's layout)
    # How it runs (the same function whatever is chosen here; see docs/performance.md "Performance"):
    # The matmuls' operands (float32 accumulation); params, optimiser, loss stay float32, activations too
    # but where dense_dtype says otherwise.
    # "auto": bfloat16 on GPU/TPU and on CPUs with native bf16 dot products, else float32 (jaxgpt/ops/select.py).
    compute_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    # What the dense layers hand on: "float32", or "compute": the compute dtype, their bias added and the
    # MLP's activation applied in it, as torch.autocast runs them; the residual stream, norms, attention
    # probabilities and logits stay float32 (half the bytes of the step's elementwise work on a TPU).
    dense_dtype: Literal["float32", "compute"] = "float32"
    # "auto": cuDNN flash attention on GPU with bfloat16, Pallas splash attention on one TPU chip,
    # XLA's on other accelerators, per_head on CPU.
    attention: Literal["auto", "xla", "cudnn", "splash", "per_head"] = "auto"
    # Recompute in the backward pass (jax.checkpoint) what the forward pass does not keep: false keeps
    # everything; "dots" keeps each block's dense-layer and attention outputs and recomputes the rest
    # (norms, activations); "attention" keeps only the attention's outputs (with splash attention its
    # kernel's residuals, so the backward pass never reruns the kernel); true (or "full") keeps only
    # each block's input.
    remat: bool | Literal["full", "dots", "attention"] = False
    scan_layers: bool = False  # blocks stacked (L, ...) and run by one lax.scan: compile time flat in n_layers
    loss_chunk: int | None = None  # tokens per chunk of the head + loss; None = the whole (B*T, V) at once
    # The modern recipe's options (layers.py; docs/recipes.md), each on its own; the defaults are
    # GPT-2's, and a model.json without these keys computes exactly what it always did:
    positions: Literal["learned", "rotary"] = "learned"  # a learned (context, C) table, or rotary q/k
    rope_base: float | None = None  # rotary's base; None = 10000 with positions "rotary" (refused with "learned")
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # every norm: blocks, final, embedding, QK
    norm_scale: bool = True  # false: parameter-free norms (no learned scale)
    embed_norm: bool = False  # a norm right after the token embedding
    qk_norm: bool = False  # normalise queries and keys per head before their dot product
    mlp: Literal["gelu", "relu2"] = "gelu"  # the MLP's activation: GPT-2's tanh GELU or ReLU squared
    zero_init_proj: bool = False  # the attention and MLP output projections start at zero
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap), in float32; None = off
    # The 2026 recipe's options (connections.py, layers.py; docs/recipes.md), each off by default:
    n_kv_heads: int | None = None  # key/value heads, grouped-query attention (it divides n_heads); None = n_heads
    value_embeds: bool = False  # token tables mixed into the values of alternate layers, the last included
    embed_skips: bool = False  # each block's input: a learned residual scale and a learned blend of the embedding
    unet_skips: bool = False  # the first half's block outputs added, learned weights, to the mirrored second half
    # Sliding-window attention: a pattern of "S" (short window) and "L" (full context) tiled over the
    # layers, the last layer always "L"; None = every layer full.
    window_pattern: str | None = None
    short_window: int | None = None  # tokens an "S" layer's query sees, itself included; null = context_length // 4

    def __post_init__(self) -> None:
        _positive(self, MODEL_FILE, "vocab_size", "context_length", "emb_dim", "n_heads")
        _positive(self, MODEL_FILE, "loss_chunk", optional=True)
        if self.attention == "cudnn" and self.compute_dtype == "float32":
            raise ConfigError(
                f"{MODEL_FILE}: attention='cudnn' needs compute_dtype='bfloat16' "
                f"(or 'auto'; got {self.compute_dtype!r}); cuDNN's flash attention has no float32 kernel"
            )
        if self.architecture == "gpt2":
            _positive(self, MODEL_FILE, "n_layers")
            if self.emb_dim % self.n_heads:
                raise ConfigError(f"{MODEL_FILE}: emb_dim={self.emb_dim} does not divide by n_heads={self.n_heads}")
        elif self.n_layers < 0:
            raise ConfigError(f"{MODEL_FILE}: n_layers={self.n_layers} must be >= 0")
        if self.qkv_bias and not self.bias:
            raise ConfigError(
                f"{MODEL_FILE}: qkv_bias=true contradicts bias=false (which removes every bias); set qkv_bias to false"
            )
        if not 0.0 <= self.drop_rate < 1.0:
            raise ConfigError(f"{MODEL_FILE}: drop_rate={self.drop_rate} must be in [0, 1)")
        self._check_modern_options()
        self._check_2026_options()

    def _check_modern_options(self) -> None:
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ConfigError(f"{MODEL_FILE}: logit_softcap={self.logit_softcap} must be > 0 (or null: no cap)")
        if self.positions == "learned" and self.rope_base is not None:
            raise ConfigError(
                f"{MODEL_FILE}: rope_base={self.rope_base} is the rotary base, but positions='learned' "
                f"asks for a learned position table; set positions to 'rotary' or drop rope_base"
            )
        if self.positions == "rotary":
            if self.rope_base is None:
                object.__setattr__(self, "rope_base", 10000.0)  # the resolved config records the base used
            if not self.rope_base > 0:
                raise ConfigError(f"{MODEL_FILE}: rope_base={self.rope_base} must be > 0")
            head = self.emb_dim // self.n_heads
            if self.architecture == "gpt2" and head % 2:
                raise ConfigError(
                    f"{MODEL_FILE}: positions='rotary' rotates pairs of dimensions: the head size "
                    f"emb_dim / n_heads = {self.emb_dim} / {self.n_heads} = {head} must be even"
                )

    def _check_2026_options(self) -> None:
        on = [key for key in ("value_embeds", "embed_skips", "unet_skips") if getattr(self, key)]
        on += [key for key in ("window_pattern", "short_window") if getattr(self, key) is not None]
        if self.architecture != "gpt2" and on:
            raise ConfigError(
                f"{MODEL_FILE}: {on[0]}={getattr(self, on[0])!r} needs architecture 'gpt2' "
                f"(got {self.architecture!r}, which has no transformer blocks)"
            )
        _positive(self, MODEL_FILE, "n_kv_heads", optional=True)
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"{MODEL_FILE}: n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                f"(each key/value head serves n_heads / n_kv_heads query heads)"
            )
        if self.unet_skips and self.n_layers < 2:
            raise ConfigError(
                f"{MODEL_FILE}: unet_skips=true joins the first half of the blocks to the second; "
                f"n_layers={self.n_layers} has no halves"
            )
        if self.window_pattern is None:
            if self.short_window is not None:
                raise ConfigError(
                    f"{MODEL_FILE}: short_window={self.short_window} is the window of the 'S' layers "
                    f"of window_pattern, which is null; set window_pattern (e.g. 'SSSL')"
                )
            return
        if not self.window_pattern or set(self.window_pattern) - {"S", "L"}:
            raise ConfigError(
                f"{MODEL_FILE}: window_pattern={self.window_pattern!r} must be a string of 'S' "
                f"(short window) and 'L' (full context), e.g. 'SSSL'"
            )
        if self.short_window is not None and not 0 < self.short_window <= self.context_length:
            raise ConfigError(
                f"{MODEL_FILE}: short_window={self.short_window} must be in 1..context_length={self.context_length}"
            )

    @property
    def head_dim(self) -> int:
        return self.emb_dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or every query head its own (n_kv_heads null)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def layer_windows(self) -> tuple[int, ...]:
        """Tokens each layer's queries see, themselves included (context_length: the whole context):
        window_pattern tiled over the layers, the last one always full."""
        if self.window_pattern is None:
            return (self.context_length,) * self.n_layers
        short = max(1, self.context_length // 4) if self.short_window is None else self.short_window
        windows = [
            short if self.window_pattern[i % len(self.window_pattern)] == "S" else self.context_length
            for i in range(self.n_layers)
        ]
        return (*windows[:-1], self.context_length) if windows else ()


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    source: str = "builtin"  # a source known to download_dataset.py
    options: dict[str, Any] = field(default_factory=dict)  # source-specific options


@dataclass(frozen=True, slots=True)
class MeshConfig:
    # Devices are arranged as a (data, model) mesh; see sharding.py. The mesh may change between
    # a save and a resume (say 8 devices -> 4): checkpoints restore onto any shape.
    data: int | None = None  # data-parallel ways; None = every device not used by `model`
    model: int = 1  # tensor-parallel ways (attention heads, MLP, vocabulary), within one host
    fsdp: bool = False  # also shard parameters and optimiser state over the data axis

    def __post_init__(self) -> None:
        _positive(self, TRAIN_FILE, "model")
        _positive(self, TRAIN_FILE, "data", optional=True)


@dataclass(frozen=True, slots=True)
class MuonConfig:
    """train.json "muon": Muon (optax.contrib.scale_by_muon) for the blocks' weight matrices, AdamW for
    the rest (jaxgpt/training/optimizer.py, muon.py). The matrices' peak rate is train.json learning_rate;
    each other part has its own peak here, on the same schedule (warm-up, cosine or WSD) as every part."""

    momentum: float = 0.95  # Muon's momentum after the warm-up
    momentum_init: float = 0.85  # ... and at step 0, rising linearly (modded-nanogpt, nanochat)
    momentum_warmup_steps: int = 300  # optimiser steps of that rise; 0 = momentum from the start
    nesterov: bool = True
    ns_steps: int = 5  # Newton-Schulz iterations of the orthogonalisation
    # Their coefficients: "standard", one quintic (3.4445, -4.7750, 2.0315) for every iteration
    # (modded-nanogpt's, optax's default); "polar_express", Polar Express's own for each of (at most
    # 5) iterations (Amsel et al. 2025; nanochat). Fixed for a run: the optimiser state holds them.
    coefficients: Literal["standard", "polar_express"] = "standard"
    # NorMuon (Li et al. 2025; nanochat): each orthogonalised update divided by a running RMS per
    # neuron (per row along the matrix's longer side), its overall norm kept. Fixed for a run.
    normuon: bool = False
    normuon_beta2: float = 0.9  # that running mean of squares' decay (nanochat's)
    weight_decay: float = 0.0  # Muon's own decoupled decay of the matrices (times its learning rate)
    # AdamW's peak rates (its b1/b2/eps/weight_decay: train.json adam_b1, adam_b2, adam_eps, weight_decay).
    # nanochat's 0.2-0.3 for embeddings assumes N(0, 1) ones; gpt.py's are N(0, 0.02), hence a lower
    # default. The shipped modern runs (untied, with embed_norm) take 0.1: docs/recipes.md has the sweep.
    embed_learning_rate: float = 0.01  # token embedding (and a tied head) and the position table
    head_learning_rate: float = 0.004  # the untied output head (nanochat's)
    scalar_learning_rate: float = 0.004  # every norm scale and bias (never decayed)

    def __post_init__(self) -> None:
        _positive(self, TRAIN_FILE, "ns_steps", "embed_learning_rate", "head_learning_rate", "scalar_learning_rate")
        if self.coefficients == "polar_express" and self.ns_steps > 5:
            raise ConfigError(
                f"{TRAIN_FILE}: ns_steps={self.ns_steps} with coefficients='polar_express', which "
                f"has coefficients for 5 iterations; use ns_steps <= 5"
            )
        for key in ("momentum", "momentum_init", "normuon_beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{TRAIN_FILE}: {key}={getattr(self, key)} must be in [0, 1)")
        for key in ("momentum_warmup_steps", "weight_decay"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{TRAIN_FILE}: {key}={getattr(self, key)} must be >= 0")


@dataclass(frozen=True, slots=True)
class WandbConfig:
    """train.json "wandb": log the run to Weights & Biases too (jaxgpt/tracking/wandb_log.py; docs/watching.md).
    The package is an optional extra (`uv sync --extra wandb`); without this section it is never imported."""

    project: str  # the W&B project the run goes into
    name: str | None = None  # the run's display name; None = the run directory's name
    # "offline": written under runs/<name>/wandb/ only, uploaded later by `wandb sync`; "disabled":
    # nothing. The environment's WANDB_MODE, when set, overrides this (W&B's own convention).
    mode: Literal["online", "offline", "disabled"] = "online"
    entity: str | None = None  # the team or user owning the project; None = the API key's default entity
    group: str | None = None  # runs shown together (a sweep, the seeds of one recipe)
    tags: tuple[str, ...] = ()  # labels to filter runs by

    def __post_init__(self) -> None:
        for key in ("project", "name", "entity", "group"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"{TRAIN_FILE}: {key}={value!r} must not be empty (or null for the default)")
        if set(self.project) & set(_WANDB_FORBIDDEN) or len(self.project) > 128:
            raise ConfigError(
                f"{TRAIN_FILE}: project={self.project!r} must be at most 128 characters, none of "
                f"{' '.join(_WANDB_FORBIDDEN)} (W&B's rule for project names)"
            )
        for tag in self.tags:
            if not 0 < len(tag) <= 64:
                raise ConfigError(f"{TRAIN_FILE}: tags entry {tag!r} must be 1 to 64 characters (W&B's limit)")


_WANDB_FORBIDDEN = ("/", "\\", "#", "?", "%", ":")  # wandb refuses them in a project name


# What `learning_rate` and `weight_decay` mean when train.json leaves them out, per optimizer: Muon's
# rate is that of orthogonalised (spectral-norm) updates, ~30x AdamW's; the embeddings' AdamW rate
# under Muon (muon.embed_learning_rate) is so much higher than 6e-4 that GPT-2's decay of 0.1 would
# shrink them by a few percent a step: nanochat and modded-nanogpt do not decay them.
DEFAULT_LEARNING_RATE = {"adamw": 6e-4, "muon": 0.02}
DEFAULT_WEIGHT_DECAY = {"adamw": 0.1, "muon": 0.0}
DEFAULT_COOLDOWN_PERCENT = 20.0  # nanochat's warmdown


@dataclass(frozen=True, slots=True)
class TrainConfig:
    microbatch_size: int  # sequences per forward/backward pass, all devices together (split over mesh.data)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # "bytes", "gpt2", or the name of a tokenizer trained on a corpus (download_dataset.py tokenizer):
    # <data root>/tokenizers/<name>/ (docs/tokenizers.md). None: "gpt2" for the FineWeb sources (as
    # download_dataset.py prepares them), else "bytes" (default_tokenizer)
    tokenizer: str | None = None
    targets: Literal["next", "same"] = "next"  # "same" trains A-to-A (the target is the input)
    sequence_length: int | None = None  # tokens per sequence; None = model context_length
    # Training rows: "windows", non-overlapping windows of the token stream in a shuffled order;
    # "documents", whole documents packed by best fit, every row starting at a document's start
    # (nanochat's BOS-aligned packing; jaxgpt/data/samplers/documents.py). Validation reads windows either way.
    # "conversations": whole conversations packed by best fit and padded, trained on their answers
    # only (jaxgpt/conversations/rows.py), validation likewise: what a conversation dataset takes (the
    # conversations and instructions sources). None: "conversations" for those sources, else "windows".
    packing: Literal["windows", "documents", "conversations"] | None = None
    gradient_accumulation_steps: int = 1  # microbatches per optimiser step
    batch_size: int | None = None  # optional check: sequences per optimiser step
    train_steps: int | None = None  # training length in optimiser steps ...
    train_tokens: int | None = None  # ... or in tokens ...
    # ... or in epochs of the train split (exactly one of the three): the steps that take
    # train_epochs x the first epoch's rows, rounded up (fine-tuning's usual measure; not FineWeb's)
    train_epochs: float | None = None
    # "adamw": AdamW for every parameter; "muon": Muon for the blocks' matrices, AdamW for the rest
    # (the "muon" section below). Fixed for a run: its optimiser state has that optimizer's layout.
    optimizer: Literal["adamw", "muon"] = "adamw"
    learning_rate: float | None = None  # peak learning rate (muon: the matrices'); None = 6e-4 adamw, 0.02 muon
    schedule: Literal["cosine", "wsd"] = "cosine"  # after the warm-up: cosine decay, or warmup-stable-decay
    warmup_percent: float = 5.0  # linear warm-up, percent of the total steps
    cooldown_percent: float | None = None  # wsd: linear decay over this last percent of the steps; None = 20
    lr_init_factor: float = 1e-5  # warm-up starts at learning_rate * this
    lr_end_factor: float = 0.1  # the decay (cosine or wsd) ends at learning_rate * this
    weight_decay: float | None = None  # AdamW decoupled weight decay, 2-D params only; None = 0.1 adamw, 0.0 muon
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    adam_eps: float = 1e-8
    clipping_max_norm: float = 1.0  # clip the accumulated gradient's global L2 norm to this
    checkpoint_interval: int = 100  # optimiser steps between checkpoints
    validation_interval: int | None = None  # steps between validations (and at checkpoints); None = checkpoint_interval
    # Microbatches of the validation split per validation (its first ones, fixed), or "all": the
    # whole split, every token but the first scored exactly once (batches.WholeSplit).
    validation_batches: int | Literal["all"] = 8
    keep_last_checkpoints: int = 3  # older checkpoints are pruned, the best one is always kept
    # Stop (error, exit 1) after this many optimiser steps in a row were dropped for non-finite
    # gradients: a diverged run must not spend its budget skipping every batch.
    max_dropped_steps: int = 20
    # HellaSwag during training (hellaswag.py): at the validations of steps that are a multiple of
    # hellaswag_interval, and at the last step, on the first hellaswag_examples validation examples
    # (null: all 10,042); null interval = off. Results go into meta.json and charts/hellaswag.png.
    hellaswag_interval: int | None = None
    hellaswag_examples: int | None = None
    # DCLM's CORE during training (core.py), the same way: at the validations of steps that are a
    # multiple of core_interval, and at the last step, on core_examples examples per task (null: all;
    # capped, it is a quick figure, not the CORE metric); null interval = off. Results go into meta.json.
    core_interval: int | None = None
    core_examples: int | None = None
    seed: int = 0  # parameters, dropout and batch order all derive from it
    charts_log_y: bool = False  # draw loss.png with a log-scale y axis
    mesh: MeshConfig = field(default_factory=MeshConfig)  # device mesh for data/tensor parallelism
    # The memory plan (jaxgpt/training/memory.py): "auto" fits the step to each device's memory (remat,
    # loss chunks, smaller microbatches: the same global batch); "off" runs it as configured.
    memory_plan: Literal["auto", "off"] = "auto"
    # The device memory a plan may use, in GiB; None = what the device reports (a CPU reports none: no plan).
    device_memory_gib: float | None = None
    muon: MuonConfig | None = None  # optimizer "muon" only; None there = every default of MuonConfig
    # Stop at the first validation whose loss is at or below this (saving a checkpoint there): tokens
    # to target. None: train every step.
    target_val_loss: float | None = None
    # Weights to start from when the run has no checkpoint yet (fine-tuning): a checkpoint folder,
    # a latest/best link or a run dir, relative to the run directory. Step 0, fresh optimiser.
    init_from: str | None = None
    wandb: WandbConfig | None = None  # also log to Weights & Biases; None = not at all
    # Reinforcement learning from checkable rewards (jaxgpt/config_rl.py; docs/fine-tuning.md): the run
    # samples answers to rl.prompts from init_from's weights and trains on their rewards. None: not RL.
    rl: RLConfig | None = None

    def __post_init__(self) -> None:
        self._resolve()
        self._check_numbers()
        self._check_length()
        self._check_schedule()
        self._check_rows()
        self._check_names()
        if self.rl is not None:
            self.rl.check_train(self)

    def _check_numbers(self) -> None:
        """Counts, sizes and rates that must be positive."""
        _positive(
            self,
            TRAIN_FILE,
            "microbatch_size",
            "gradient_accumulation_steps",
            "checkpoint_interval",
            "keep_last_checkpoints",
            "max_dropped_steps",
        )
        if self.validation_batches != "all":
            _positive(self, TRAIN_FILE, "validation_batches")
        _positive(
            self,
            TRAIN_FILE,
            "sequence_length",
            "train_steps",
            "train_tokens",
            "train_epochs",
            "batch_size",
            "validation_interval",
            "hellaswag_interval",
            "hellaswag_examples",
            "core_interval",
            "core_examples",
            optional=True,
        )
        _positive(self, TRAIN_FILE, "learning_rate", "clipping_max_norm", "adam_eps", "lr_init_factor")
        _positive(self, TRAIN_FILE, "target_val_loss", "device_memory_gib", optional=True)

    def _check_length(self) -> None:
        """Exactly one training length, and a batch_size that says what the microbatches make."""
        lengths = {k: getattr(self, k) for k in ("train_steps", "train_tokens", "train_epochs")}
        if sum(v is not None for v in lengths.values()) != 1:
            raise ConfigError(
                f"{TRAIN_FILE}: give exactly one of train_steps, train_tokens or train_epochs (got "
                f"{', '.join(f'{k}={v}' for k, v in lengths.items())})"
            )
        if self.train_epochs is not None and self.dataset.source in FINEWEB_SOURCES:
            raise ConfigError(
                f"{TRAIN_FILE}: train_epochs needs the whole train split, but {self.dataset.source!r} "
                f"is fetched for the run's length; give train_steps or train_tokens"
            )
        if self.batch_size is not None and self.batch_size != self.sequences_per_step:
            raise ConfigError(
                f"{TRAIN_FILE}: batch_size={self.batch_size} must equal microbatch_size x "
                f"gradient_accumulation_steps = {self.microbatch_size} x "
                f"{self.gradient_accumulation_steps} = {self.sequences_per_step}"
            )

    def _check_schedule(self) -> None:
        """Benchmarks at validations; the schedule's percentages and the optimiser's coefficients."""
        if self.hellaswag_interval is not None and self.hellaswag_interval % self.validation_interval:
            raise ConfigError(
                f"{TRAIN_FILE}: hellaswag_interval={self.hellaswag_interval} must be a multiple of "
                f"validation_interval={self.validation_interval} (HellaSwag runs at validations)"
            )
        if self.core_interval is not None and self.core_interval % self.validation_interval:
            raise ConfigError(
                f"{TRAIN_FILE}: core_interval={self.core_interval} must be a multiple of "
                f"validation_interval={self.validation_interval} (CORE runs at validations)"
            )
        for key in ("warmup_percent", "cooldown_percent"):
            if not 0.0 <= (getattr(self, key) or 0.0) <= 100.0:
                raise ConfigError(f"{TRAIN_FILE}: {key}={getattr(self, key)} must be in [0, 100]")
        if self.schedule == "wsd" and self.warmup_percent + self.cooldown_percent > 100.0:
            raise ConfigError(
                f"{TRAIN_FILE}: warmup_percent={self.warmup_percent} + cooldown_percent="
                f"{self.cooldown_percent} exceed 100 (percent of the steps)"
            )
        for key in ("lr_end_factor", "weight_decay", "seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{TRAIN_FILE}: {key}={getattr(self, key)} must be >= 0")
        for key in ("adam_b1", "adam_b2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{TRAIN_FILE}: {key}={getattr(self, key)} must be in [0, 1)")

    def _check_rows(self) -> None:
        """What the training rows are: packing, targets and the dataset's kind agree."""
        if self.packing in ("documents", "conversations") and self.targets != "next":
            raise ConfigError(
                f"{TRAIN_FILE}: packing={self.packing!r} packs {self.packing} for next-token targets "
                f"(targets={self.targets!r}); use packing 'windows'"
            )
        chat = self.dataset.source in CONVERSATION_SOURCES
        if chat != (self.packing == "conversations"):
            raise ConfigError(
                f"{TRAIN_FILE}: packing={self.packing!r} "
                + (
                    f"cannot read the conversation dataset {self.dataset.source!r}; leave packing out "
                    f"(or 'conversations')"
                    if chat
                    else f"needs a conversation dataset (source {' or '.join(CONVERSATION_SOURCES)}), got source "
                    f"{self.dataset.source!r}"
                )
            )

    def _check_names(self) -> None:
        """The tokenizer's name and init_from's checkpoint."""
        if not TOKENIZER_NAME.fullmatch(self.tokenizer):
            raise ConfigError(
                f"{TRAIN_FILE}: tokenizer={self.tokenizer!r} must be 'bytes', 'gpt2' or a trained "
                f"tokenizer's name (letters, digits, '.', '_' or '-'; download_dataset.py tokenizer)"
            )
        if self.init_from is not None and not self.init_from.strip():
            raise ConfigError(f"{TRAIN_FILE}: init_from={self.init_from!r} must name a checkpoint or be null")

    def _resolve(self) -> None:
        """Fill in the defaults that depend on other keys (once: to_dict writes the resolved values)."""
        if self.muon is not None and self.optimizer != "muon":
            raise ConfigError(
                f"{TRAIN_FILE}: muon settings given but optimizer={self.optimizer!r}; "
                f"set optimizer to 'muon' or remove the muon section"
            )
        if self.cooldown_percent is not None and self.schedule != "wsd":
            raise ConfigError(
                f"{TRAIN_FILE}: cooldown_percent={self.cooldown_percent} applies to schedule 'wsd' "
                f"only (schedule={self.schedule!r})"
            )
        resolved = {
            "tokenizer": default_tokenizer(self.dataset.source),
            "packing": "conversations" if self.dataset.source in CONVERSATION_SOURCES else "windows",
            "learning_rate": DEFAULT_LEARNING_RATE[self.optimizer],
            "weight_decay": DEFAULT_WEIGHT_DECAY[self.optimizer],
            "cooldown_percent": DEFAULT_COOLDOWN_PERCENT if self.schedule == "wsd" else None,
            "muon": MuonConfig() if self.optimizer == "muon" else None,
            "validation_interval": self.checkpoint_interval,
        }
        for key, value in resolved.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)  # frozen: set once, here

    @property
    def sequences_per_step(self) -> int:
        return self.microbatch_size * self.gradient_accumulation_steps

    def seq_len(self, model: ModelConfig) -> int:
        return self.sequence_length or model.context_length

    def tokens_per_step(self, model: ModelConfig) -> int:
        return self.sequences_per_step * self.seq_len(model)

    def total_steps(self, model: ModelConfig, rows_per_epoch: int | None = None) -> int:
        """Optimiser steps of the run; with train_epochs it takes the train split's rows per epoch
        (known once the dataset is open: jaxgpt/training/run.py)."""
        if self.train_steps is not None:
            return self.train_steps
        if self.train_epochs is not None:
            assert rows_per_epoch is not None, "train_epochs: the length depends on the dataset"
            return math.ceil(self.train_epochs * rows_per_epoch / self.sequences_per_step)
        assert self.train_tokens is not None
        return self.train_tokens // self.tokens_per_step(model)

    def planned_tokens(self, model: ModelConfig) -> int | None:
        """Tokens the run trains on, when known before its dataset is (None: train_epochs): how
        many FineWeb files a dataset needs."""
        return None if self.train_epochs is not None else self.total_steps(model) * self.tokens_per_step(model)


def check_combination(model: ModelConfig, train: TrainConfig) -> None:
    """Cross-file checks that neither file can make alone."""
    seq_len = train.seq_len(model)
    if seq_len > model.context_length:
        raise ConfigError(
            f"{TRAIN_FILE}: sequence_length={seq_len} exceeds {MODEL_FILE} context_length={model.context_length}"
        )
    if train.optimizer == "muon" and (model.architecture != "gpt2" or model.n_layers < 1):
        raise ConfigError(
            f"{TRAIN_FILE}: optimizer='muon' has no matrix to train in {MODEL_FILE} "
            f"architecture={model.architecture!r} (n_layers={model.n_layers}): Muon trains the "
            f"blocks' weight matrices; use optimizer 'adamw'"
        )
    if train.train_tokens is not None and train.total_steps(model) < 1:
        raise ConfigError(
            f"{TRAIN_FILE}: train_tokens={train.train_tokens} is less than one optimiser step of "
            f"{train.tokens_per_step(model)} tokens (microbatch_size x gradient_accumulation_steps "
            f"x sequence_length)"
        )


# ----------------------------------------------------------------------------- loading


def load_run_configs(run_dir: Path) -> tuple[ModelConfig, TrainConfig]:
    """Read and validate `<run_dir>/model.json` and `<run_dir>/train.json`."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: run directory not found")
    model = from_json(ModelConfig, run_dir / MODEL_FILE)
    train = from_json(TrainConfig, run_dir / TRAIN_FILE)
    try:
        check_combination(model, train)
    except ConfigError as e:
        raise ConfigError(f"{run_dir}/{e}") from None
    return model, train


def _positive(obj: Any, file: str, *keys: str, optional: bool = False) -> None:
    for key in keys:
        value = getattr(obj, key)
        if value is None and optional:
            continue
        if not value > 0:
            raise ConfigError(f"{file}: {key}={value} must be > 0")
