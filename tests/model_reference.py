"""What the model's tests share: tiny configs, random tokens and parameters, and an independent numpy
forward pass of every layout and option (test_model.py checks the model against it).

The reference is written from the papers and descriptions, not from jaxgpt/model/: it only shares
the parameter *names* (read from `nnx.to_flat_state`). GPT-2 as nanoGPT lays it out; RMSNorm as
x / sqrt(mean(x^2) + eps); rotary as a complex multiplication of each pair (x_i, x_{i + D/2}) by
exp(i * pos * base^(-2i/D)); QK-norm as a norm of each head's D-vector; ReLU^2; cap * tanh(logits /
cap); a query head h reads key/value head h // (H / K); a layer's queries see the `window` tokens
up to themselves; value tables sit on the last layer and every other one before it, v += 3
sigmoid(x[:12] @ W) ve; before block i, x = resid[i] x + x0[i] x0; block L-1-j adds skip[j] times
block j's output to its input (nanochat's gpt.py, modded-nanogpt's U-net). Parameters are
randomised before a comparison (non-zero biases, scales away from 1, peaky attention), so a forward
pass that forgot a bias, a scale, the 1/sqrt(D) factor or a rotation cannot match by accident.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
from conftest import F32_SLACK
from flax import nnx

from jaxgpt.config import ModelConfig

V, T_CTX, C, H, L = 61, 16, 32, 4, 2  # tiny, V odd on purpose (no accidental power-of-two layouts)
TOL = 1e-4 * F32_SLACK  # conftest: wider on an accelerator

# Every option of the modern recipe on: what runs/*-modern use (untied head, no biases).
MODERN = {
    "positions": "rotary",
    "rope_base": 100.0,
    "norm": "rmsnorm",
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "zero_init_proj": True,
    "logit_softcap": 15.0,
    "tie_embeddings": False,
    "bias": False,
    "qkv_bias": False,
}
# The 2026 recipe's options on top: grouped-query attention, windows, value embeddings, skips.
ALL_NEW = {
    "n_kv_heads": 2,
    "window_pattern": "SL",
    "short_window": 5,
    "value_embeds": True,
    "embed_skips": True,
    "unet_skips": True,
}


def gpt_cfg(**kw) -> ModelConfig:
    base = {
        "architecture": "gpt2",
        "vocab_size": V,
        "context_length": T_CTX,
        "emb_dim": C,
        "n_heads": H,
        "n_layers": L,
        "qkv_bias": False,
        "drop_rate": 0.0,
        "tie_embeddings": False,
    }
    return ModelConfig(**{**base, **kw})


def tokens(seed: int, B: int = 2, T: int = T_CTX) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, size=(B, T)), dtype=jnp.int32)


def flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """Dotted name -> float64 numpy copy of every nnx.Param."""
    return {
        ".".join(map(str, path)): np.asarray(var.get_value(), dtype=np.float64)
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }


def randomise(model: nnx.Module, seed: int) -> None:
    """Replace every parameter with random values of a useful size (in place)."""
    rng = np.random.default_rng(seed)
    new = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = var.get_value().shape
        name = path[-1]
        if name == "scale":
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name == "bias":
            value = 0.3 * rng.standard_normal(shape)
        elif name == "embedding":
            value = rng.standard_normal(shape)
        else:  # kernels (fan_in, fan_out): ~1.5/sqrt(fan_in) makes attention clearly non-uniform
            value = 1.5 * rng.standard_normal(shape) / math.sqrt(shape[0])
        new.append((path, var.replace(jnp.asarray(value, dtype=jnp.float32))))
    nnx.update(model, nnx.from_flat_state(new))


def randomise_all(model: nnx.Module, seed: int) -> None:
    """randomise(), then the connections' parameters at sizes that matter: lambdas and skip weights
    around 1 and 0.5, value tables N(0, 1), gates large enough to move between 0 and 3. (A model
    without connections ends as randomise() leaves it.)"""
    randomise(model, seed)
    rng = np.random.default_rng(seed + 1)
    sizes = {
        "resid_lambdas": (1.0, 0.2),
        "x0_lambdas": (0.5, 0.3),
        "skip_weights": (0.6, 0.3),
        "value_tables": (0.0, 1.0),
        "value_gates": (0.0, 1.0),
    }
    new = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[0] == "connections":
            mean, std = sizes[path[-1]]
            var = var.replace(jnp.asarray(mean + std * rng.standard_normal(var.get_value().shape), jnp.float32))
        new.append((path, var))
    nnx.update(model, nnx.from_flat_state(new))


@nnx.jit
def forward(model: nnx.Module, idx: jax.Array) -> jax.Array:
    """model(idx) as one compiled program (eager, a model dispatches op by op: minutes of a test on a TPU)."""
    return model(idx)


@nnx.jit
def square_loss_grads(model: nnx.Module, idx: jax.Array) -> nnx.State:
    """The parameters' gradient of mean(model(idx)^2), one compiled program."""
    return nnx.grad(lambda m: jnp.mean(jnp.square(m(idx))))(model)


def assert_causal(run: Callable[[jnp.ndarray], jnp.ndarray], t: int) -> None:
    """Changing token t leaves every earlier position's logits exactly as they were, and changes t's."""
    idx = tokens(3, B=2)
    changed = idx.at[:, t].set((idx[:, t] + 1) % V)
    a, b = np.asarray(run(idx)), np.asarray(run(changed))
    np.testing.assert_array_equal(a[:, :t], b[:, :t])  # the past does not see the future at all
    assert np.abs(a[:, t:] - b[:, t:]).max() > 1e-3  # ... but position t itself does change


# ----------------------------------------------------------------------------- the numpy forward passes


def np_layernorm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_linear(p: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    y = x @ p[f"{name}.kernel"]
    return y + p[f"{name}.bias"] if f"{name}.bias" in p else y


def np_gpt2(p: dict[str, np.ndarray], cfg: ModelConfig, idx: np.ndarray) -> np.ndarray:
    """GPT-2 as nanoGPT lays it out (learned positions, LayerNorm, tanh GELU, one fused qkv)."""
    B, T = idx.shape
    Cm, Hm = cfg.emb_dim, cfg.n_heads
    D = Cm // Hm
    x = p["tok_emb.embedding"][idx] + p["pos_emb.embedding"][np.arange(T)][None]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}"
        h = np_layernorm(x, p[f"{b}.ln1.scale"], p[f"{b}.ln1.bias"])
        qkv = np_linear(p, f"{b}.attn.qkv", h)  # (B, T, 3C): q | k | v
        q, k, v = (
            qkv[..., i * Cm : (i + 1) * Cm].reshape(B, T, Hm, D).transpose(0, 2, 1, 3) for i in range(3)
        )  # (B, H, T, D)
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)  # (B, H, T, T)
        att = np_softmax(np.where(mask, att, -np.inf))
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, Cm)
        x = x + np_linear(p, f"{b}.attn.proj", y)
        h = np_layernorm(x, p[f"{b}.ln2.scale"], p[f"{b}.ln2.bias"])
        x = x + np_linear(p, f"{b}.mlp.out", np_gelu_tanh(np_linear(p, f"{b}.mlp.fc", h)))
    x = np_layernorm(x, p["ln_f.scale"], p["ln_f.bias"])
    if cfg.tie_embeddings:
        assert "head.kernel" not in p, "a tied model must not carry a separate head"
        return x @ p["tok_emb.embedding"].T
    return x @ p["head.kernel"]


def np_atoa(p: dict[str, np.ndarray], cfg: ModelConfig, idx: np.ndarray) -> np.ndarray:
    x = p["tok_emb.embedding"][idx]
    if cfg.tie_embeddings:
        assert "head.kernel" not in p
        return x @ p["tok_emb.embedding"].T
    return x @ p["head.kernel"]


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
    z = (x[..., : D // 2] + 1j * x[..., D // 2 :]) * np.exp(1j * t * theta)  # (B, H, T, D/2)
    return np.concatenate([z.real, z.imag], axis=-1)


def np_windows(cfg: ModelConfig) -> list[int]:
    """Tokens each layer's queries see: window_pattern tiled ("S" short, "L" the context), the last "L"."""
    if cfg.window_pattern is None:
        return [cfg.context_length] * cfg.n_layers
    chars = [cfg.window_pattern[i % len(cfg.window_pattern)] for i in range(cfg.n_layers - 1)] + ["L"]
    short = cfg.short_window or cfg.context_length // 4  # null: a quarter of the context
    return [short if c == "S" else cfg.context_length for c in chars]


def np_modern(p: dict[str, np.ndarray], cfg: ModelConfig, idx: np.ndarray) -> np.ndarray:
    """Any layout: every option of model.json, each as the module docstring describes it."""
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
            q, k, v = (qkv[..., i * cfg.emb_dim : (i + 1) * cfg.emb_dim] for i in range(3))
        else:
            q, kv = np_linear(p, f"{b}.attn.q", h), np_linear(p, f"{b}.attn.kv", h)
            k, v = kv[..., : Kv * D], kv[..., Kv * D :]
        if layer in value_layers:  # ResFormer's value residual, gated per key/value head
            j = value_layers.index(layer)
            w = p["connections.value_gates"][j]  # (G, K)
            gate = 3.0 / (1.0 + np.exp(-(h[..., : w.shape[0]] @ w)))  # (B, T, K)
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


def equations(jaxpr: jax_core.Jaxpr, in_loop: bool = False) -> Iterator[tuple[jax_core.JaxprEqn, bool]]:
    """Every equation of a program and of its sub-programs (a scan's body too), with whether a loop
    (scan, while) holds it."""
    for eqn in jaxpr.eqns:
        yield eqn, in_loop
        for sub in jax_core.jaxprs_in_params(eqn.params):
            yield from equations(sub, in_loop or eqn.primitive.name in ("scan", "while"))
