"""The modern recipe's model options (layers.py) against an independent numpy forward pass, each
alone and all together; rotary's relative-position property; every option with the speed options
(scan_layers, remat, loss_chunk, bfloat16); zero init; the one-line errors.

The reference is written from the papers, not from layers.py: RMSNorm as x / sqrt(mean(x^2) + eps),
rotary as a complex multiplication of each pair (x_i, x_{i + D/2}) by exp(i * pos * base^(-2i/D)),
QK-norm as a norm of each head's D-vector, ReLU^2, cap * tanh(logits / cap). Parameters are
randomised first (scales away from 1, peaky attention), so a forgotten scale or a wrong rotation
cannot match by accident.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, cases
from flax import nnx
from test_model import flat_params, np_gelu_tanh, np_layernorm, np_softmax, randomise, tokens
from test_options import loss_and_grads, model_with, random_weights

from jaxgpt.config import ConfigError, ModelConfig, from_json
from jaxgpt.model.gpt import build_model
from jaxgpt.model.layers import Rotary

V, T_CTX, C, H, L = 61, 16, 32, 4, 2
TOL = 1e-4

# Every option on: what runs/*-modern use (untied head, no biases, parameter-free norms aside).
MODERN = dict(positions="rotary", rope_base=100.0, norm="rmsnorm", embed_norm=True, qk_norm=True, mlp="relu2",
              zero_init_proj=True, logit_softcap=15.0, tie_embeddings=False, bias=False, qkv_bias=False)


def gpt_cfg(**kw) -> ModelConfig:
    base = dict(architecture="gpt2", vocab_size=V, context_length=T_CTX, emb_dim=C, n_heads=H, n_layers=L,
                qkv_bias=False, drop_rate=0.0, tie_embeddings=False)
    return ModelConfig(**{**base, **kw})


# ----------------------------------------------------------------------------- numpy reference


def np_norm(cfg: ModelConfig, p: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    scale = p.get(f"{name}.scale", 1.0)
    if cfg.norm == "rmsnorm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale
    return np_layernorm(x, scale, p.get(f"{name}.bias", 0.0))


def np_rotary(x: np.ndarray, base: float) -> np.ndarray:
    """(B, H, T, D) -> the same, pair (i, i + D/2) as a complex number times exp(i t theta_i)."""
    D = x.shape[-1]
    theta = base ** (-np.arange(D // 2) * 2.0 / D)  # (D/2,)
    t = np.arange(x.shape[2])[:, None]  # (T, 1)
    z = (x[..., :D // 2] + 1j * x[..., D // 2:]) * np.exp(1j * t * theta)  # (B, H, T, D/2)
    return np.concatenate([z.real, z.imag], axis=-1)


def np_linear(p: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    y = x @ p[f"{name}.kernel"]
    return y + p[f"{name}.bias"] if f"{name}.bias" in p else y


def np_windows(cfg: ModelConfig) -> list[int]:
    """Tokens each layer's queries see: window_pattern tiled ("S" short, "L" the context), the last "L"."""
    if cfg.window_pattern is None:
        return [cfg.context_length] * cfg.n_layers
    chars = [cfg.window_pattern[i % len(cfg.window_pattern)] for i in range(cfg.n_layers - 1)] + ["L"]
    short = cfg.short_window or cfg.context_length // 4  # null: a quarter of the context
    return [short if c == "S" else cfg.context_length for c in chars]


def np_modern(p: dict[str, np.ndarray], cfg: ModelConfig, idx: np.ndarray) -> np.ndarray:
    B, T = idx.shape
    Hm, Kv, D, L = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads, cfg.emb_dim // cfg.n_heads, cfg.n_layers
    x = p["tok_emb.embedding"][idx]
    if cfg.embed_norm:
        x = np_norm(cfg, p, "emb_norm", x)
    if cfg.positions == "learned":
        x = x + p["pos_emb.embedding"][np.arange(T)][None]
    else:
        assert "pos_emb.embedding" not in p, "a rotary model has no position table"
    x0, skips, pairs = x, [], (L // 2 if cfg.unet_skips else 0)
    value_layers = [i for i in range(L) if (L - 1 - i) % 2 == 0] if cfg.value_embeds else []  # the last, back
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    for layer, window in enumerate(np_windows(cfg)):
        b = f"blocks.{layer}"
        if layer >= L - pairs:  # U-net: block L-1-j takes block j's output
            x = x + p["connections.skip_weights"][layer - (L - pairs)] * skips.pop()
        if cfg.embed_skips:
            x = p["connections.resid_lambdas"][layer] * x + p["connections.x0_lambdas"][layer] * x0
        h = np_norm(cfg, p, f"{b}.ln1", x)
        if Kv == Hm:
            qkv = np_linear(p, f"{b}.attn.qkv", h)
            q, k, v = (qkv[..., i * cfg.emb_dim:(i + 1) * cfg.emb_dim] for i in range(3))
        else:
            q, kv = np_linear(p, f"{b}.attn.q", h), np_linear(p, f"{b}.attn.kv", h)
            k, v = kv[..., :Kv * D], kv[..., Kv * D:]
        if layer in value_layers:  # ResFormer's value residual, gated per key/value head
            j = value_layers.index(layer)
            w = p["connections.value_gates"][j]  # (G, K)
            gate = 3.0 / (1.0 + np.exp(-(h[..., :w.shape[0]] @ w)))  # (B, T, K)
            v = v + (gate[..., None] * p["connections.value_tables"][j][idx].reshape(B, T, Kv, D)).reshape(B, T, -1)
        q = q.reshape(B, T, Hm, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
        k, v = (a.reshape(B, T, Kv, D).transpose(0, 2, 1, 3) for a in (k, v))  # (B, K, T, D)
        if cfg.qk_norm:
            q, k = np_norm(cfg, p, f"{b}.attn.q_norm", q), np_norm(cfg, p, f"{b}.attn.k_norm", k)
        if cfg.positions == "rotary":
            q, k = np_rotary(q, cfg.rope_base), np_rotary(k, cfg.rope_base)
        k, v = k[:, np.arange(Hm) // (Hm // Kv)], v[:, np.arange(Hm) // (Hm // Kv)]  # query head h: kv head h // G
        mask = (s <= t) & (t - s < window)
        att = np_softmax(np.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(D), -np.inf))
        x = x + np_linear(p, f"{b}.attn.proj", (att @ v).transpose(0, 2, 1, 3).reshape(B, T, cfg.emb_dim))
        h = np_linear(p, f"{b}.mlp.fc", np_norm(cfg, p, f"{b}.ln2", x))
        h = np.maximum(h, 0.0) ** 2 if cfg.mlp == "relu2" else np_gelu_tanh(h)
        x = x + np_linear(p, f"{b}.mlp.out", h)
        if layer < pairs:
            skips.append(x)
    x = np_norm(cfg, p, "ln_f", x)
    logits = x @ (p["tok_emb.embedding"].T if cfg.tie_embeddings else p["head.kernel"])
    if cfg.logit_softcap is not None:
        logits = cfg.logit_softcap * np.tanh(logits / cfg.logit_softcap)
    return logits


# ----------------------------------------------------------------------------- forward = reference

ALONE = {"rotary": dict(positions="rotary"), "rmsnorm": dict(norm="rmsnorm"),
         "rmsnorm-no-scale": dict(norm="rmsnorm", norm_scale=False), "layernorm-no-scale": dict(norm_scale=False),
         "embed-norm": dict(embed_norm=True), "qk-norm": dict(qk_norm=True), "relu2": dict(mlp="relu2"),
         "softcap": dict(logit_softcap=2.0), "all": {**MODERN, "logit_softcap": 3.0},
         "all-tied-biases-no-scale": {**MODERN, "tie_embeddings": True, "bias": True, "qkv_bias": True,
                                      "norm": "layernorm", "norm_scale": False, "logit_softcap": 3.0}}


@pytest.mark.parametrize("kw", cases(ALONE, fast={"rotary", "all", "all-tied-biases-no-scale"}))
def test_option_matches_numpy_reference(kw: dict) -> None:
    cfg = gpt_cfg(**kw)
    model = build_model(cfg, seed=3)
    randomise(model, seed=11)  # zero_init_proj's zeros too: the forward must use the real weights
    p = flat_params(model)
    has_scale = [k for k in p if k.endswith(".scale")]
    assert bool(has_scale) == cfg.norm_scale
    assert ("blocks.0.attn.q_norm.scale" in p) == (cfg.qk_norm and cfg.norm_scale)
    idx = tokens(1)
    got = np.asarray(model(idx))
    want = np_modern(p, cfg, np.asarray(idx))
    assert got.shape == (2, T_CTX, V) and got.dtype == np.float32
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    if cfg.logit_softcap is not None:
        assert np.abs(got).max() <= cfg.logit_softcap
        assert np.abs(want).max() > 0.5 * cfg.logit_softcap  # the cap was reached for, not idle


def test_the_reference_tells_each_option_apart() -> None:
    """Each option changes the reference's output: a model ignoring one could not match it."""
    cfg = gpt_cfg(**MODERN)
    model = build_model(cfg, seed=3)
    randomise(model, seed=11)
    p, idx = flat_params(model), np.asarray(tokens(1))
    want = np_modern(p, cfg, idx)
    for key, off in (("positions", "learned"), ("embed_norm", False), ("qk_norm", False), ("mlp", "gelu"),
                     ("logit_softcap", None), ("norm", "layernorm")):
        other = dataclasses.replace(cfg, **{key: off, **({"rope_base": None} if key == "positions" else {})})
        q = dict(p) | ({"pos_emb.embedding": np.zeros((T_CTX, C))} if key == "positions" else {})
        assert np.abs(np_modern(q, other, idx) - want).max() > 1e-2, key


def test_rotary_scores_depend_only_on_the_distance() -> None:
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32) for _ in range(2))
    rotary = jax.jit(Rotary(16, 10000.0).__call__)  # one program per shape, not an op at a time

    def score(m: int, n: int) -> float:
        return float((rotary(q, jnp.array([m])) * rotary(k, jnp.array([n]))).sum())

    for d in (0, 1, 5):
        scores = [score(m + d, m) for m in (0, 3, 11, 40)]
        assert max(scores) - min(scores) <= 1e-4, (d, scores)
    assert abs(score(5, 0) - score(6, 0)) > 1e-3  # and the distance does matter
    # A decode step's (B, 1) positions rotate each row by its own position, as a prefill's (T,) do.
    x = jnp.asarray(rng.standard_normal((3, 1, 2, 16)), jnp.float32)
    rows = rotary(x, jnp.array([[0], [4], [9]]))
    for b, pos in enumerate((0, 4, 9)):
        full = rotary(jnp.broadcast_to(x[b:b + 1], (1, 10, 2, 16)), jnp.arange(10))
        np.testing.assert_allclose(rows[b, 0], full[0, pos], atol=1e-6)


def test_zero_init_proj_starts_every_block_as_the_identity() -> None:
    cfg = gpt_cfg(**MODERN)
    p = flat_params(build_model(cfg, seed=0))
    for name in ("attn.proj.kernel", "mlp.out.kernel"):
        assert all(not p[f"blocks.{i}.{name}"].any() for i in range(L)), name
    assert np.abs(p["blocks.0.mlp.fc.kernel"]).std() > 0.01  # only the output projections
    model = build_model(cfg, seed=0)
    x = np.asarray(tokens(2))
    # The residual stream is the (normed) embedding all the way up.
    emb = np_norm(cfg, p, "ln_f", np_norm(cfg, p, "emb_norm", p["tok_emb.embedding"][x]))
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(x))),
                               15.0 * np.tanh(emb @ p["head.kernel"] / 15.0), atol=TOL)


# ----------------------------------------------------------------------------- with the speed options

SPEED = {"scan-layers": {"scan_layers": True}, "remat": {"remat": True},
         "scan-remat-chunk-xla": {"scan_layers": True, "remat": True, "loss_chunk": 7, "attention": "xla"}}


@pytest.fixture(scope="module")
def modern_weights() -> dict[str, np.ndarray]:
    return random_weights(gpt_cfg(**MODERN, n_layers=3))


def _modern(weights: dict[str, np.ndarray], **kw) -> nnx.Module:
    # test_options.model_with builds its own base config; the modern keys ride along as overrides.
    return model_with(weights, **{**MODERN, "n_layers": 3, **kw})


@pytest.fixture(scope="module")
def modern_reference(modern_weights) -> tuple[float, dict[str, np.ndarray]]:
    return loss_and_grads(_modern(modern_weights))


@pytest.mark.parametrize("kw", cases(SPEED, fast={"scan-remat-chunk-xla"}))
def test_modern_model_with_speed_options_matches_its_default_path(modern_weights, modern_reference, kw) -> None:
    ref_loss, ref_grads = modern_reference
    loss, grads = loss_and_grads(_modern(modern_weights, **kw))
    assert abs(loss - ref_loss) <= 1e-5, (loss, ref_loss)
    assert sorted(grads) == sorted(ref_grads) and "blocks.0.attn.q_norm.scale" in grads
    scale = max(np.abs(g).max() for g in ref_grads.values())
    assert max(np.abs(grads[k] - ref_grads[k]).max() for k in ref_grads) <= 1e-5 * scale
    assert ref_loss > 1.0 and scale > 0.01


@SLOW  # a bfloat16 scanned model compiled for loss and gradients
def test_modern_model_in_bfloat16_is_float32_within_its_precision(modern_weights, modern_reference) -> None:
    ref_loss, ref_grads = modern_reference
    loss, grads = loss_and_grads(_modern(modern_weights, compute_dtype="bfloat16", scan_layers=True, loss_chunk=7))
    assert loss != ref_loss and abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)
    for key, ref in ref_grads.items():
        g = grads[key].ravel().astype(np.float64)
        assert g @ ref.ravel() / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30) >= 0.99, key


# ----------------------------------------------------------------------------- errors and layout


@pytest.mark.parametrize("kw, match", [
    ({"logit_softcap": 0.0}, r"^model.json: logit_softcap=0.0 must be > 0"),
    ({"logit_softcap": -3.0}, r"^model.json: logit_softcap=-3.0 must be > 0"),
    ({"rope_base": 500.0}, r"^model.json: rope_base=500.0 is the rotary base, but positions='learned' asks for a "
                           r"learned position table"),
    ({"positions": "rotary", "rope_base": 0.0}, r"rope_base=0.0 must be > 0"),
    ({"positions": "rotary", "emb_dim": 36, "n_heads": 4}, r"head size emb_dim / n_heads = 36 / 4 = 9 must be even"),
])
def test_bad_combinations_are_one_line_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        gpt_cfg(**kw)
    assert "\n" not in str(e.value)


def test_bad_combination_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"architecture": "gpt2", "vocab_size": 61, "context_length": 16, "emb_dim": 32,
                                "n_heads": 4, "n_layers": 1, "logit_softcap": 0}))
    with pytest.raises(ConfigError, match=rf"^{path}: logit_softcap=0.0 must be > 0"):
        from_json(ModelConfig, path)


def test_rotary_config_records_its_base_and_has_no_position_table() -> None:
    cfg = gpt_cfg(positions="rotary")
    assert cfg.rope_base == 10000.0  # resolved: the config written beside checkpoints says which base
    assert dataclasses.replace(cfg).rope_base == 10000.0
    assert "pos_emb.embedding" not in flat_params(build_model(cfg))


def test_new_parameters_carry_logical_axis_names() -> None:
    """sharding.py places parameters by these names: an unnamed one would be silently replicated."""
    for kw in ({**MODERN, "norm_scale": True}, {**MODERN, "norm": "layernorm", "bias": True},
               {**MODERN, "scan_layers": True}):
        model = build_model(gpt_cfg(**kw))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            assert names is not None and len(names) == var.get_value().ndim, (path, names)
