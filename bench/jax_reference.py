"""`python3 -m bench reference`: our train step against a plain JAX + optax step of the same GPT-2, in one process.

    python3 -m bench reference runs/gpt2-small --batch 4     # on a TPU: 4 x 1024, both sides, tokens/s and the ratio
    uv run -m bench reference --cpu-smoke                    # tiny shapes on any CPU (a test runs it)

The reference is what a user writes first, for the accelerator as bench/torch_step.py is PyTorch's on a
CPU: parameters in a dict, GPT-2's forward written out (learned positions, LayerNorm, one fused q|k|v
product, jax.nn.dot_product_attention with its causal mask, tanh GELU, the head tied to the token
table), bfloat16 matmul operands into float32, optax's clip_by_global_norm then adamw (run's betas
and decay, matrices only), one jax.jit step donating parameters and optimiser state; no remat, no
loss chunks, one microbatch a step. Ours is `bench train` at the same shape (k = 1, remat and
loss_chunk as model.json or --model say), timed first; then the reference. GPT-2's architecture only.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from jaxgpt.config import ModelConfig, TrainConfig

SMOKE_MODEL = ["n_layers=2", "emb_dim=32", "n_heads=2", "context_length=64", "vocab_size=257"]  # --cpu-smoke


def init_params(cfg: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """GPT-2's parameters, layers stacked (L, ...), N(0, 0.02) matrices (projections / sqrt(2L))."""
    import jax
    import jax.numpy as jnp

    C, L, V = cfg.emb_dim, cfg.n_layers, cfg.vocab_size
    keys = iter(jax.random.split(jax.random.key(seed), 8))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape, jnp.float32)  # noqa: E731
    proj = 0.02 / math.sqrt(2 * L)
    return {
        "wte": normal((V, C)),
        "wpe": normal((cfg.context_length, C)),
        "ln1": (jnp.ones((L, C)), jnp.zeros((L, C))),
        "qkv": (normal((L, C, 3 * C)), jnp.zeros((L, 3 * C))),
        "proj": (normal((L, C, C), proj), jnp.zeros((L, C))),
        "ln2": (jnp.ones((L, C)), jnp.zeros((L, C))),
        "fc": (normal((L, C, 4 * C)), jnp.zeros((L, 4 * C))),
        "out": (normal((L, 4 * C, C), proj), jnp.zeros((L, C))),
        "ln_f": (jnp.ones(C), jnp.zeros(C)),
    }


def loss(params: dict[str, Any], x: Any, y: Any, n_heads: int, dtype: Any) -> Any:
    """Mean next-token cross-entropy of (B, T) ids x against targets y."""
    import jax
    import jax.numpy as jnp

    def norm(h: Any, scale_bias: tuple[Any, Any]) -> Any:
        mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(var + 1e-5) * scale_bias[0] + scale_bias[1]

    def dense(h: Any, w_b: tuple[Any, Any]) -> Any:
        return (
            jnp.einsum("btc,cd->btd", h.astype(dtype), w_b[0].astype(dtype), preferred_element_type=jnp.float32)
            + w_b[1]
        )

    B, T = x.shape
    h = params["wte"][x] + params["wpe"][:T]  # (B, T, C)

    def block(h: Any, p: dict[str, Any]) -> tuple[Any, None]:
        q, k, v = jnp.split(dense(norm(h, p["ln1"]), p["qkv"]), 3, axis=-1)
        heads = lambda t: t.reshape(B, T, n_heads, -1).astype(dtype)  # noqa: E731
        a = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True).reshape(B, T, -1)
        h = h + dense(a.astype(jnp.float32), p["proj"])
        return h + dense(jax.nn.gelu(dense(norm(h, p["ln2"]), p["fc"])), p["out"]), None

    layers = {k: params[k] for k in ("ln1", "qkv", "proj", "ln2", "fc", "out")}
    h, _ = jax.lax.scan(block, h, layers)
    logits = jnp.einsum(
        "btc,vc->btv",
        norm(h, params["ln_f"]).astype(dtype),
        params["wte"].astype(dtype),
        preferred_element_type=jnp.float32,
    )
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, y[..., None], -1)[..., 0])


def reference_step(cfg: ModelConfig, train: TrainConfig) -> tuple[Any, Any, Any]:
    """(params, optimiser state, the jitted step (params, state, x, y) -> (params, state, loss))."""
    import jax
    import jax.numpy as jnp
    import optax

    params = init_params(cfg, train.seed)
    matrices = {k: True if k in ("wte", "wpe") else (k in ("qkv", "proj", "fc", "out"), False) for k in params}
    tx = optax.chain(
        optax.clip_by_global_norm(train.clipping_max_norm),
        optax.adamw(train.learning_rate, train.adam_b1, train.adam_b2, weight_decay=train.weight_decay, mask=matrices),
    )
    dtype = jnp.dtype("bfloat16" if cfg.compute_dtype != "float32" else "float32")

    def step(params: Any, state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        value, grads = jax.value_and_grad(loss)(params, x, y, cfg.n_heads, dtype)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return params, tx.init(params), jax.jit(step, donate_argnums=(0, 1))


def time_reference(cfg: ModelConfig, train: TrainConfig, B: int, steps: int, windows: int) -> dict[str, Any]:
    """The reference's tokens/s at (B, T): a compiling step, two warm-up steps, then timed windows."""
    import jax

    T = train.seq_len(cfg)
    params, state, step = reference_step(cfg, train)
    rng = np.random.default_rng(0)
    batches = [jax.device_put(rng.integers(0, cfg.vocab_size, (2, B, T), dtype=np.int32)) for _ in range(2)]
    started = time.perf_counter()
    params, state, value = step(params, state, batches[0][0], batches[0][1])
    jax.block_until_ready(value)
    first = time.perf_counter() - started
    for i in range(2):
        params, state, value = step(params, state, *batches[i % 2])
    jax.block_until_ready(value)
    rates = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for i in range(steps):
            params, state, value = step(params, state, *batches[i % 2])
        jax.block_until_ready(value)
        rates.append(steps * B * T / (time.perf_counter() - t0))
    return {"tokens_per_s_median": float(np.median(rates)), "first_step_s": first, "loss_last": float(value)}


def bench_reference(
    model_cfg: ModelConfig, train_cfg: TrainConfig, *, batch: int, steps: int = 10, windows: int = 3, log: Any = print
) -> dict[str, Any]:
    """Ours (bench train at microbatch `batch`, k = 1), then the reference, in this process; their ratio."""
    import dataclasses

    from bench.train_step import bench_train

    if model_cfg.architecture != "gpt2" or model_cfg.positions != "learned" or model_cfg.norm != "layernorm":
        raise ValueError("bench reference: the reference is GPT-2's architecture (learned positions, LayerNorm)")
    train_cfg = dataclasses.replace(train_cfg, microbatch_size=batch, gradient_accumulation_steps=1, batch_size=None)
    ours = bench_train(
        model_cfg, train_cfg, steps=steps, warmup=2, windows=windows, matmul_size=None, log=lambda _: None
    )
    ref = time_reference(model_cfg, train_cfg, batch, steps, windows)
    ratio = ours["tokens_per_s_median"] / ref["tokens_per_s_median"]
    T = train_cfg.seq_len(model_cfg)
    log(
        f"{batch} x {T}: ours {ours['tokens_per_s_median']:,.0f} tokens/s, the plain JAX + optax step "
        f"{ref['tokens_per_s_median']:,.0f}: ours {ratio:.2f}x"
    )
    return {"batch": batch, "seq_len": T, "ours": ours, "reference": ref, "ratio": ratio}
