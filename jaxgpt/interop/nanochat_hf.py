"""The modern recipe as transformers' `nanochat` model type (NanoChatForCausalLM), and back (convert_hf.py).

    uv run convert_hf.py export runs/<name> out/   # out/: config.json, model.safetensors, tokenizer files
    uv run convert_hf.py import out/ runs/<new>    # runs/<new>: model.json, train.json, pretrained/ (init_from)

No JAX. The config keys: docs/serving.md "What maps". Weights:

    our weights, nnx kernels (in, out)    model.safetensors, torch Linear weights (out, in), float32
    tok_emb.embedding (V, C)              model.embed_tokens.weight (V, C)
    blocks.i.attn.qkv.kernel (C, 3C)      model.layers.i.self_attn.{q,k,v}_proj.weight, (C, C) each
    blocks.i.attn.q / .kv.kernel          q_proj (C, C); k_proj, v_proj (K*D, C) each (grouped query)
    blocks.i.attn.proj.kernel (C, C)      model.layers.i.self_attn.o_proj.weight (C, C)
    blocks.i.mlp.fc / .out.kernel         model.layers.i.mlp.fc1.weight (4C, C) / fc2.weight (C, 4C)
    head.kernel (C, V)                    lm_head.weight (V, C); absent when tied

The second half of every q_proj and k_proj head's rows is negated both ways (NanoChat's rotary
turns the other way; q.k unchanged, the round trip exact). A model.json option NanoChat cannot
compute is refused in one line (_REFUSED).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from jaxgpt.checkpoints.layout import (
    WEIGHTS,
    checkpoint_configs,
    write_json,
)
from jaxgpt.config import (
    MODEL_FILE,
    ConfigError,
    ModelConfig,
    default_tokenizer,
    from_dict,
    to_dict,
)
from jaxgpt.conversations.template import ChatTemplate, read_template
from jaxgpt.data.tokenizer import TOKENIZER_FILE, TokenizerError, check_name
from jaxgpt.files import write_tensors
from jaxgpt.interop import hf_tokenizer as tk
from jaxgpt.interop import imported
from jaxgpt.interop.hf_tokenizer import ConversionError

__all__ = ["ConversionError", "export_problem", "export_run", "import_run"]

HF_CONFIG, HF_WEIGHTS, HF_INDEX, GENERATION_CONFIG = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
)
RMS_EPS = 1e-6  # layers.py's RMSNorm epsilon (nnx.RMSNorm's default) = NanoChatConfig's rms_norm_eps default
_ACT = {"relu2": "relu2", "gelu": "gelu_pytorch_tanh"}  # both tanh GELUs, torch's F.gelu(approximate="tanh")
_ACT_BACK = {"relu2": "relu2", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu"}  # gelu_new: the same function
# NanoChatConfig's defaults (configuration_nanochat.py): what transformers takes for a key a config.json lacks.
_HF_DEFAULTS = {
    "vocab_size": 50304,
    "hidden_size": 768,
    "intermediate_size": 8192,
    "num_hidden_layers": 12,
    "num_attention_heads": 6,
    "num_key_value_heads": None,
    "max_position_embeddings": 2048,
    "hidden_act": "relu2",
    "rms_norm_eps": 1e-6,
    "final_logit_softcapping": 15.0,
    "attention_bias": False,
    "tie_word_embeddings": False,
}

# model.json options NanoChat cannot compute, in model.json's key order: (key, refused?, why). What is
# not here exports: drop_rate (inference has no dropout), tie_embeddings, logit_softcap null, mlp gelu,
# n_kv_heads, and what only changes the init or how a model runs (zero_init_proj, compute_dtype,
# dense_dtype, attention, remat, scan_layers, loss_chunk).
_REFUSED = (
    ("architecture", lambda c: c.architecture != "gpt2", "it has no transformer blocks"),
    ("qkv_bias", lambda c: c.qkv_bias, "NanoChat's MLP has no biases (fc1, fc2: bias=False), and qkv_bias needs bias"),
    ("bias", lambda c: c.bias, "NanoChat's MLP has no biases (fc1, fc2: bias=False)"),
    ("positions", lambda c: c.positions != "rotary", "NanoChat has rotary positions and no position table"),
    ("norm", lambda c: c.norm != "rmsnorm", "every NanoChat norm is an RMSNorm"),
    ("norm_scale", lambda c: c.norm_scale, "NanoChatRMSNorm has no weight"),
    ("embed_norm", lambda c: not c.embed_norm, "NanoChatModel always normalises the embedding"),
    ("qk_norm", lambda c: not c.qk_norm, "NanoChatAttention always normalises q and k"),
    ("value_embeds", lambda c: c.value_embeds, "NanoChat's values are the v_proj output alone"),
    ("embed_skips", lambda c: c.embed_skips, "a NanoChat block's input is the residual stream alone"),
    ("unet_skips", lambda c: c.unet_skips, "a NanoChat block's input is the residual stream alone"),
    (
        "window_pattern",
        lambda c: min(c.layer_windows(), default=c.context_length) < c.context_length,
        "NanoChat's every layer attends to the whole context",
    ),
)


def export_problem(cfg: ModelConfig) -> str | None:
    """Why a model has no NanoChat form (every refused model.json key and value, in one line), or None."""
    found = [(key, why) for key, refused, why in _REFUSED if refused(cfg)]
    if found and found[0][0] == "architecture":
        found = found[:1]  # the other keys describe blocks it has not
    if not found:
        return None
    named = ", ".join(f"{key}={getattr(cfg, key)!r} ({why})" for key, why in found)
    return f"model.json {named} {'has' if len(found) == 1 else 'have'} no NanoChat counterpart"


# ----------------------------------------------------------------------------- weights


def our_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our per-layer parameter names and shapes for an exportable model (gpt.py's, without JAX)."""
    C, V, K, D = cfg.emb_dim, cfg.vocab_size, cfg.kv_heads, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.embedding": (V, C)}
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        if K == cfg.n_heads:
            shapes[p + "attn.qkv.kernel"] = (C, 3 * C)
        else:
            shapes.update({p + "attn.q.kernel": (C, C), p + "attn.kv.kernel": (C, 2 * K * D)})
        shapes.update(
            {p + "attn.proj.kernel": (C, C), p + "mlp.fc.kernel": (C, 4 * C), p + "mlp.out.kernel": (4 * C, C)}
        )
    if not cfg.tie_embeddings:
        shapes["head.kernel"] = (C, V)
    return shapes


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """NanoChatForCausalLM's state dict names and shapes (lm_head absent when tied, as saved)."""
    C, V, KD = cfg.emb_dim, cfg.vocab_size, cfg.kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (C, C),
                p + "self_attn.k_proj.weight": (KD, C),
                p + "self_attn.v_proj.weight": (KD, C),
                p + "self_attn.o_proj.weight": (C, C),
                p + "mlp.fc1.weight": (4 * C, C),
                p + "mlp.fc2.weight": (C, 4 * C),
            }
        )
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def _flip_rotary(w: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """(heads*D, C) q or k rows with the second half of every head negated (module docstring)."""
    w = np.array(w, copy=True).reshape(heads, head_dim, -1)
    np.negative(w[:, head_dim // 2 :], out=w[:, head_dim // 2 :])
    return w.reshape(heads * head_dim, -1)


def ours_to_hf(weights: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our (checked) parameters -> NanoChatForCausalLM's state dict."""
    H, K, D = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    out = {"model.embed_tokens.weight": weights["tok_emb.embedding"]}
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        if K == H:
            q, k, v = np.split(weights[ours + "attn.qkv.kernel"], 3, axis=1)  # (C, C) each
        else:
            q, (k, v) = weights[ours + "attn.q.kernel"], np.split(weights[ours + "attn.kv.kernel"], 2, axis=1)
        out.update(
            {
                theirs + "self_attn.q_proj.weight": _flip_rotary(q.T, H, D),
                theirs + "self_attn.k_proj.weight": _flip_rotary(k.T, K, D),
                theirs + "self_attn.v_proj.weight": v.T,
                theirs + "self_attn.o_proj.weight": weights[ours + "attn.proj.kernel"].T,
                theirs + "mlp.fc1.weight": weights[ours + "mlp.fc.kernel"].T,
                theirs + "mlp.fc2.weight": weights[ours + "mlp.out.kernel"].T,
            }
        )
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = weights["head.kernel"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_to_ours(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """NanoChatForCausalLM's (checked, float32) state dict -> our parameters: ours_to_hf undone."""
    H, K, D = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    out = {"tok_emb.embedding": tensors["model.embed_tokens.weight"]}
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        q = _flip_rotary(tensors[theirs + "self_attn.q_proj.weight"], H, D).T
        k = _flip_rotary(tensors[theirs + "self_attn.k_proj.weight"], K, D).T
        v = tensors[theirs + "self_attn.v_proj.weight"].T
        if K == H:
            out[ours + "attn.qkv.kernel"] = np.concatenate([q, k, v], axis=1)
        else:
            out.update({ours + "attn.q.kernel": q, ours + "attn.kv.kernel": np.concatenate([k, v], axis=1)})
        out.update(
            {
                ours + "attn.proj.kernel": tensors[theirs + "self_attn.o_proj.weight"].T,
                ours + "mlp.fc.kernel": tensors[theirs + "mlp.fc1.weight"].T,
                ours + "mlp.out.kernel": tensors[theirs + "mlp.fc2.weight"].T,
            }
        )
    if not cfg.tie_embeddings:
        out["head.kernel"] = tensors["lm_head.weight"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _check_tensors(tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    missing, unexpected = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or unexpected:
        raise ConversionError(
            f"{where}: tensors do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for key, shape in shapes.items():
        if tuple(tensors[key].shape) != shape:
            raise ConversionError(f"{where}: {key} has shape {tuple(tensors[key].shape)}, the config needs {shape}")


# ----------------------------------------------------------------------------- config.json


def hf_config(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """config.json for NanoChatForCausalLM; the tokenizer's end-of-text is bos, eos and pad."""
    return {
        "architectures": ["NanoChatForCausalLM"],
        "model_type": "nanochat",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.emb_dim,
        "intermediate_size": 4 * cfg.emb_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.context_length,
        "hidden_act": _ACT[cfg.mlp],
        "rms_norm_eps": RMS_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "final_logit_softcapping": cfg.logit_softcap,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": cfg.tie_embeddings,
        "use_cache": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "pad_token_id": eot_id,
        # transformers 5 writes "dtype"; "torch_dtype" is what 4.x-era readers look for (5 still accepts it).
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def model_config(hf: dict[str, Any], where: str) -> ModelConfig:
    """model.json for a NanoChat config.json; the first key (and value) we cannot compute is refused."""
    if hf.get("model_type") != "nanochat":
        raise ConversionError(f"{where}: model_type={hf.get('model_type')!r}; this import reads model_type 'nanochat'")
    get = {**_HF_DEFAULTS, **hf}.get  # a key the file lacks means NanoChatConfig's default, as in transformers
    _check_hf_config(get, where)
    H = get("num_attention_heads")
    K = get("num_key_value_heads") or H
    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = rope.get("rope_theta", get("rope_theta") or 10000.0)  # transformers' default_theta
    try:
        return from_dict(
            ModelConfig,
            {
                "architecture": "gpt2",
                "vocab_size": get("vocab_size"),
                "context_length": get("max_position_embeddings"),
                "emb_dim": get("hidden_size"),
                "n_heads": H,
                "n_layers": get("num_hidden_layers"),
                "qkv_bias": False,
                "bias": False,
                "drop_rate": 0.0,
                "tie_embeddings": get("tie_word_embeddings"),
                "positions": "rotary",
                "rope_base": theta,
                "norm": "rmsnorm",
                "norm_scale": False,
                "embed_norm": True,
                "qk_norm": True,
                "mlp": _ACT_BACK[get("hidden_act")],
                "logit_softcap": get("final_logit_softcapping"),
                "n_kv_heads": None if K == H else K,
            },
            where,
        )
    except ConfigError as e:  # ModelConfig's own checks, in our names: say theirs
        msg = str(e).removeprefix(f"{where}: ").removeprefix(f"{MODEL_FILE}: ")
        msg = re.sub(r"\b(" + "|".join(_THEIR_NAMES) + r")\b", lambda m: _THEIR_NAMES[m.group(1)], msg)
        raise ConversionError(f"{where}: {msg}") from None


def _check_hf_config(get: Any, where: str) -> None:
    """The config.json keys whose values our model has no form for (NanoChat's sizes aside)."""
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
        "num_key_value_heads",
    ):
        value = get(key)
        if (value is not None or key != "num_key_value_heads") and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConversionError(f"{where}: {key}={value!r} must be a positive integer")
    C, H = get("hidden_size"), get("num_attention_heads")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    checks = (
        ("hidden_act", get("hidden_act") in _ACT_BACK, f"one of {sorted(_ACT_BACK)}"),
        ("rms_norm_eps", get("rms_norm_eps") == RMS_EPS, f"{RMS_EPS} (our RMSNorm's epsilon)"),
        ("attention_bias", get("attention_bias") is False, "false (our q/k/v/o projections have no bias)"),
        ("intermediate_size", get("intermediate_size") == 4 * C, "4 * hidden_size (our MLP's width)"),
        ("head_dim", get("head_dim") in (None, C // H), "hidden_size / num_attention_heads"),
        (
            "rope_parameters",
            isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) == "default",
            "rope_type 'default' (plain rotary)",
        ),
        ("tie_word_embeddings", isinstance(get("tie_word_embeddings"), bool), "true or false"),
    )
    for key, ok, want in checks:
        if not ok:
            raise ConversionError(f"{where}: {key}={get(key)!r} has no jaxgpt counterpart; it must be {want}")


_THEIR_NAMES = {
    "emb_dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "n_layers": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "logit_softcap": "final_logit_softcapping",
    "rope_base": "rope_theta",
}


# ----------------------------------------------------------------------------- export


def export_run(path: Path, out_dir: Path, force: bool = False, *, chat_template: str | None = None) -> Path:
    """Write a checkpoint (or a run's latest, or an import's pretrained/) as a transformers folder that
    AutoModelForCausalLM and AutoTokenizer load; returns out_dir. `chat_template`: a Jinja template
    for tokenizer_config.json's "chat_template" (apply_chat_template, vLLM's chat API); None = the
    checkpoint's own chat template (a fine-tuned model's chat_template.json) in Jinja, or none.
    Everything is checked before the first file is written."""
    ckpt_dir, cfg, train = checkpoint_configs(Path(path))  # the resolution test_generation.py uses
    saved = read_template(ckpt_dir)
    if chat_template is None and saved is not None:
        chat_template = saved.jinja()
    problem = export_problem(cfg)
    if problem is not None:
        raise ConversionError(f"{ckpt_dir}: {problem}")
    out_dir = Path(out_dir)
    names = (HF_CONFIG, HF_WEIGHTS, GENERATION_CONFIG, tk.TOKENIZER_FILE, tk.TOKENIZER_CONFIG, tk.SPECIAL_TOKENS_MAP)
    clash = next((out_dir / n for n in names if (out_dir / n).exists()), None)
    if clash is not None and not force:
        raise ConversionError(f"{clash}: already exists; pass --force to overwrite")
    name = train.get("tokenizer", default_tokenizer(train.get("dataset", {}).get("source", "builtin")))
    tokenizer_json = tk.run_tokenizer_json(ckpt_dir, name)
    eot_id, n_vocab = tk.eot_of(tokenizer_json, f"{ckpt_dir}: tokenizer {name!r}")
    if n_vocab > cfg.vocab_size:
        raise ConversionError(
            f"{ckpt_dir}: tokenizer {name!r} has {n_vocab} ids, more than model.json vocab_size={cfg.vocab_size}"
        )
    weights = _read_safetensors(ckpt_dir / WEIGHTS)
    _check_tensors(weights, our_shapes(cfg), str(ckpt_dir / WEIGHTS))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{HF_WEIGHTS}.tmp"
    write_tensors(ours_to_hf(weights, cfg), tmp, metadata={"format": "pt"})  # transformers refuses files without it
    os.replace(tmp, out_dir / HF_WEIGHTS)
    tk.write_tokenizer(out_dir, tokenizer_json, context_length=cfg.context_length, chat_template=chat_template)
    # A fine-tuned model's answers end at its template's end token too (nanochat's <|assistant_end|>).
    stops = [eot_id] if saved is None else _stop_ids(saved, tokenizer_json, eot_id)
    write_json(
        out_dir / GENERATION_CONFIG,
        {"bos_token_id": eot_id, "eos_token_id": stops[0] if len(stops) == 1 else stops, "pad_token_id": eot_id},
    )
    write_json(out_dir / HF_CONFIG, hf_config(cfg, eot_id))  # last: a folder with config.json is complete
    return out_dir


def _stop_ids(template: ChatTemplate, tokenizer_json: str, eot_id: int) -> list[int]:
    """End-of-text, then the template's end where it is one special token of this tokenizer."""
    added = {t["content"]: t["id"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
    end = added.get(template.end)
    return [eot_id] + ([end] if end is not None and end != eot_id else [])


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise ConversionError(f"{path}: file not found") from None
    except (SafetensorError, OSError) as e:
        raise ConversionError(f"{path}: not a readable safetensors file ({e})") from None


# ----------------------------------------------------------------------------- import


def read_hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    """A transformers folder's state dict (one model.safetensors, or the shards its index names), as
    float32: bfloat16 and float16 widen exactly (nanochat's own checkpoints are bfloat16)."""
    folder = Path(folder)
    index = folder / HF_INDEX
    if index.is_file() and not (folder / HF_WEIGHTS).is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        tensors = {k: v for shard in shards for k, v in _read_safetensors(folder / shard).items()}
    else:
        tensors = _read_safetensors(folder / HF_WEIGHTS)
    for key, value in tensors.items():
        if value.dtype.name not in ("float32", "bfloat16", "float16"):
            raise ConversionError(f"{folder}: tensor {key} is {value.dtype.name}; the import reads float weights")
    return {k: v.astype(np.float32, copy=False) for k, v in tensors.items()}


def _untie_if_different(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> ModelConfig:
    """tie_word_embeddings with an lm_head.weight unlike the embedding: transformers then leaves them
    untied ("both are present in the checkpoints with different values, so we will NOT tie them",
    modeling_utils.tie_weights), and so do we. An equal copy is dropped."""
    head = tensors.get("lm_head.weight")
    if not cfg.tie_embeddings or head is None:
        return cfg
    if np.array_equal(head, tensors["model.embed_tokens.weight"]):
        del tensors["lm_head.weight"]
        return cfg
    return from_dict(ModelConfig, {**to_dict(cfg), "tie_embeddings": False}, MODEL_FILE)


def import_run(hf_folder: Path, run_dir: Path, force: bool = False, *, tokenizer_name: str | None = None) -> Path:
    """Turn a NanoChat transformers folder into a run directory; returns its pretrained/ checkpoint.
    `tokenizer_name`: train.json's name for a trained tokenizer (default: the folder's name)."""
    hf_folder, run_dir = Path(hf_folder), Path(run_dir)
    imported.check_target(run_dir, force, ConversionError)
    config_path = hf_folder / HF_CONFIG
    try:
        hf = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ConversionError(f"{config_path}: not found (not a transformers model folder)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{config_path}: malformed JSON ({e})") from None
    cfg = model_config(hf, str(config_path))
    name, tokenizer_json = tk.identify(hf_folder, hf)
    if name is None:
        tk.check_trained(tokenizer_json, str(hf_folder / tk.TOKENIZER_FILE))
        name = _trained_name(hf_folder, tokenizer_name)
    _, n_vocab = tk.eot_of(tokenizer_json, str(hf_folder / tk.TOKENIZER_FILE))
    if n_vocab > cfg.vocab_size:
        raise ConversionError(
            f"{hf_folder / tk.TOKENIZER_FILE}: {n_vocab} ids, more than config.json vocab_size={cfg.vocab_size}"
        )
    tensors = read_hf_tensors(hf_folder)
    cfg = _untie_if_different(tensors, cfg)
    _check_tensors(tensors, hf_shapes(cfg), str(hf_folder))
    weights = hf_to_ours(tensors, cfg)
    del tensors
    files = {} if name in ("gpt2", "bytes") else {TOKENIZER_FILE: tokenizer_json}
    return imported.write_run(run_dir, weights, cfg, name, files, str(hf_folder))


def _trained_name(hf_folder: Path, asked: str | None) -> str:
    """train.json's name for an imported trained tokenizer: the one asked for, or the folder's name
    made a valid tokenizer name (letters, digits, '.', '_', '-')."""
    name = asked or re.sub(r"[^A-Za-z0-9._-]+", "-", hf_folder.resolve().name).lstrip("._-") or "imported"
    try:
        return check_name(name)
    except TokenizerError as e:
        raise ConversionError(f"--tokenizer-name: {e}") from None
