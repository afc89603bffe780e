"""bench reference (bench/jax_reference.py): the plain JAX + optax GPT-2 step computes our model's loss from our
model's weights, and `bench reference --cpu-smoke` times both steps in one process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_reference import randomise

from bench import cli, jax_reference
from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import build_model
from jaxgpt.model.loss import loss_fn

CFG = ModelConfig(
    architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=2, qkv_bias=True,
    tie_embeddings=True, scan_layers=True,
)  # fmt: skip


def test_the_reference_is_our_gpt2() -> None:
    model = build_model(CFG, seed=1)
    randomise(model, seed=2)  # biases, LayerNorm scales: nothing matches by accident
    w = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    pair = lambda name, a="kernel", b="bias": (w[f"blocks.{name}.{a}"], w[f"blocks.{name}.{b}"])  # noqa: E731
    params = {
        "wte": w["tok_emb.embedding"],
        "wpe": w["pos_emb.embedding"],
        "ln1": pair("ln1", "scale"),
        "qkv": pair("attn.qkv"),
        "proj": pair("attn.proj"),
        "ln2": pair("ln2", "scale"),
        "fc": pair("mlp.fc"),
        "out": pair("mlp.out"),
        "ln_f": (w["ln_f.scale"], w["ln_f.bias"]),
    }
    assert jax.tree.structure(params) == jax.tree.structure(jax_reference.init_params(CFG))
    x = jnp.asarray(np.random.default_rng(3).integers(0, CFG.vocab_size, (2, 16)), jnp.int32)
    y = jnp.roll(x, -1, axis=1)
    ours = float(loss_fn(model, x, y))
    theirs = float(jax_reference.loss(params, x, y, CFG.n_heads, jnp.float32))
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)


@pytest.mark.slow  # two compiles and timed windows; the parity above is the fast tier's
def test_bench_reference_times_both_steps_in_one_process(capsys) -> None:
    r = cli.main(["reference", "--cpu-smoke", "--steps", "1", "--windows", "1"])
    assert r == 0
    out = capsys.readouterr().out
    assert "2 x 64: ours " in out and "the plain JAX + optax step" in out
