"""The connections (connections.py): value embeddings, embedding skips and U-net skips start where
nanochat and modded-nanogpt start them, are built after every other weight, and with zero tables and
neutral lambdas compute the model without them. (Against the numpy reference: test_model.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx
from model_reference import ALL_NEW, MODERN, C, V, flat_params, gpt_cfg, randomise, tokens

from jaxgpt.model.gpt import build_model


def test_connections_start_where_nanochat_and_modded_nanogpt_start() -> None:
    cfg = gpt_cfg(**ALL_NEW, n_layers=5)
    p = flat_params(build_model(cfg, seed=0))
    np.testing.assert_allclose(p["connections.resid_lambdas"], 1.15 - 0.10 * np.arange(5) / 4, atol=1e-7)
    np.testing.assert_allclose(p["connections.x0_lambdas"], 0.20 - 0.15 * np.arange(5) / 4, atol=1e-7)
    np.testing.assert_array_equal(p["connections.skip_weights"], np.ones(2))  # 5 // 2 pairs
    assert p["connections.value_tables"].shape == (3, V, 2 * 8)  # layers 4, 2, 0; K * D = 2 * 8
    assert 0.015 < p["connections.value_tables"].std() < 0.025
    gates = p["connections.value_gates"]
    assert gates.shape == (3, 12, 2) and gates.min() >= 0 and gates.max() < 0.02
    assert p["blocks.0.attn.q.kernel"].shape == (C, C) and p["blocks.0.attn.kv.kernel"].shape == (C, 2 * 2 * 8)
    assert "blocks.0.attn.qkv.kernel" not in p


def test_a_model_with_connections_starts_from_the_same_shared_weights() -> None:
    """Connections are built last: the ablations compare models that share every other initial weight."""
    plain = flat_params(build_model(gpt_cfg(**MODERN), seed=4))
    more = flat_params(build_model(gpt_cfg(**MODERN, value_embeds=True, embed_skips=True, unet_skips=True), seed=4))
    assert set(more) - set(plain) == {
        f"connections.{n}" for n in ("value_tables", "value_gates", "resid_lambdas", "x0_lambdas", "skip_weights")
    }
    for key, value in plain.items():
        np.testing.assert_array_equal(more[key], value, err_msg=key)


def test_zero_value_tables_and_neutral_lambdas_compute_the_plain_model() -> None:
    """The connections only add: zero tables, resid 1, x0 0 and zero skips give the model without them."""
    kw = dict(**MODERN, n_layers=4)
    plain = build_model(gpt_cfg(**kw), seed=2)
    randomise(plain, 7)
    more = build_model(gpt_cfg(**kw, value_embeds=True, embed_skips=True, unet_skips=True), seed=2)
    neutral = {"value_tables": 0.0, "resid_lambdas": 1.0, "x0_lambdas": 0.0, "skip_weights": 0.0}
    weights = dict(nnx.to_flat_state(nnx.state(plain, nnx.Param)))
    new = [
        (
            path,
            var.replace(
                weights[path].get_value()
                if path in weights
                else jnp.full_like(var.get_value(), neutral.get(path[-1], 0.5))
            ),
        )
        for path, var in nnx.to_flat_state(nnx.state(more, nnx.Param))
    ]
    nnx.update(more, nnx.from_flat_state(new))
    idx = tokens(3)
    np.testing.assert_allclose(np.asarray(more(idx)), np.asarray(plain(idx)), atol=1e-6)
