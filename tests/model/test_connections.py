"""The connections (connections.py): value embeddings, embedding skips and U-net skips start where
nanochat and modded-nanogpt start them, are built after every other weight, and with zero tables and
neutral lambdas compute the model without them. (Against the numpy reference: test_model.py.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
from flax import nnx
from model_reference import (
    ALL_NEW,
    MODERN,
    C,
    V,
    equations,
    flat_params,
    forward,
    gpt_cfg,
    randomise,
    square_loss_grads,
    tokens,
)

from jaxgpt.model.gpt import build_model
from jaxgpt.ops.select import select


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


def _scatters(jaxpr: jax_core.Jaxpr, shape: tuple[int, ...]) -> dict[bool, int]:
    """Scatter-adds into a `shape` array, counted by whether a loop (scan, while) holds them."""
    found = {False: 0, True: 0}
    for eqn, in_loop in equations(jaxpr):
        if eqn.primitive.name.startswith("scatter") and tuple(eqn.outvars[0].aval.shape) == shape:
            found[in_loop] += 1
    return found


def test_value_rows_gathered_once_scatter_into_the_tables_once_outside_the_loops_and_compute_the_same() -> None:
    """Ops.value_rows_once: the layers' value rows are gathered once before the layer loop; its backward
    pass hands their gradients back and one scatter takes them into the tables, rather than each layer
    (a table or not) scattering into all of them inside the loop. The same forward and gradients."""
    for kw in ({"unet_skips": False}, {}):  # one scan, or two (U-net skips at 4 layers)
        cfg = gpt_cfg(**{**MODERN, **ALL_NEW, **kw, "n_layers": 4, "scan_layers": True, "remat": True})
        model = build_model(cfg, seed=3, ops=dataclasses.replace(select(cfg), value_rows_once=False))  # a TPU's is on
        randomise(model, seed=5)
        once = build_model(cfg, ops=dataclasses.replace(select(cfg), value_rows_once=True))
        nnx.update(once, nnx.state(model, nnx.Param))
        idx, tables = tokens(1), model.connections.value_tables.get_value().shape
        program = lambda m: jax.make_jaxpr(square_loss_grads)(m, idx).jaxpr  # noqa: E731 - the gradient's program
        scatters = {m.ops.value_rows_once: _scatters(program(m), tables) for m in (model, once)}
        assert scatters == {False: {False: 0, True: 1 if kw else 2}, True: {False: 1, True: 0}}, scatters
        np.testing.assert_allclose(np.asarray(forward(once, idx)), np.asarray(forward(model, idx)), rtol=0, atol=1e-6)
        got, want = (nnx.to_flat_state(square_loss_grads(m, idx)) for m in (once, model))
        for (path, g), (_, w) in zip(got, want):
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(w), rtol=0, atol=1e-6 * np.abs(w).max() + 1e-12, err_msg=str(path)
            )
        assert np.abs(np.asarray(dict(want)[("connections", "value_tables")])).max() > 0  # the tables do learn


def test_a_tpu_gathers_the_value_rows_once_and_no_other_backend_does() -> None:
    """The chip's timing (docs/log.md, eighth session): the 2026 step 339.5 ms a microbatch with the rows
    gathered once against 354.3; on this CPU it was slower."""
    cfg = gpt_cfg(**{**MODERN, **ALL_NEW, "context_length": 256})
    assert select(cfg, "tpu").value_rows_once
    assert not select(cfg, "cpu").value_rows_once and not select(cfg, "gpu").value_rows_once
