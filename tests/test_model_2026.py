"""The 2026 recipe's model options (grouped-query attention, sliding windows, value embeddings,
embedding and U-net skips) against the independent numpy forward pass of test_model_options.py,
each alone, together, and with every modern option; every one with the speed options (scan_layers,
remat, loss_chunk, the XLA and per-head kernels, bfloat16); how the optimiser routes the new
parameters; their starting values; the one-line errors.

The reference is written from the descriptions (nanochat's gpt.py, modded-nanogpt's U-net), not
from connections.py: a query head h reads key/value head h // (H / K); a layer's queries see the
`window` tokens up to themselves; value tables sit on the last layer and every other one before it,
v += 3 sigmoid(x[:12] @ W) ve; before block i, x = resid[i] x + x0[i] x0; block L-1-j adds
skip[j] times block j's output to its input.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, cases
from flax import nnx
from test_model import flat_params, np_softmax, randomise, tokens
from test_model_options import MODERN, TOL, gpt_cfg, np_modern, np_windows
from test_options import loss_and_grads, model_with, random_weights

from jaxgpt.config import ConfigError, ModelConfig, from_json
from jaxgpt.model.gpt import build_model
from jaxgpt.ops import select
from jaxgpt.training import muon

V, T_CTX, C, H = 61, 16, 32, 4

NEW = {"gqa-2": dict(n_kv_heads=2), "gqa-1": dict(n_kv_heads=1), "windows": dict(window_pattern="SSL", short_window=5),
       "value-embeds": dict(value_embeds=True), "embed-skips": dict(embed_skips=True), "unet": dict(unet_skips=True)}
ALL_NEW = dict(n_kv_heads=2, window_pattern="SL", short_window=5, value_embeds=True, embed_skips=True, unet_skips=True)


def randomise_all(model: nnx.Module, seed: int) -> None:
    """randomise(), then the connections' parameters at sizes that matter: lambdas and skip weights
    around 1 and 0.5, value tables N(0, 1), gates large enough to move between 0 and 3."""
    randomise(model, seed)
    rng = np.random.default_rng(seed + 1)
    sizes = {"resid_lambdas": (1.0, 0.2), "x0_lambdas": (0.5, 0.3), "skip_weights": (0.6, 0.3),
             "value_tables": (0.0, 1.0), "value_gates": (0.0, 1.0)}
    new = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[0] == "connections":
            mean, std = sizes[path[-1]]
            var = var.replace(jnp.asarray(mean + std * rng.standard_normal(var.get_value().shape), jnp.float32))
        new.append((path, var))
    nnx.update(model, nnx.from_flat_state(new))


CASES = {**NEW, "all-new": ALL_NEW, "all-new-modern": {**MODERN, **ALL_NEW, "logit_softcap": 3.0},
         "all-new-odd-layers": {**ALL_NEW, "n_layers": 5, "window_pattern": "SSSL"},
         "all-new-gpt2-layout": {**ALL_NEW, "bias": True, "qkv_bias": True, "tie_embeddings": True}}


@pytest.mark.parametrize("kw", cases(CASES, fast={"all-new-modern", "all-new-odd-layers", "all-new-gpt2-layout"}))
def test_option_matches_numpy_reference(kw: dict) -> None:
    cfg = gpt_cfg(**kw)
    model = build_model(cfg, seed=3)
    randomise_all(model, seed=11)
    p = flat_params(model)
    idx = tokens(1)
    got = np.asarray(model(idx))
    want = np_modern(p, cfg, np.asarray(idx))
    assert got.shape == (2, T_CTX, V) and np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_the_reference_tells_each_option_apart() -> None:
    """Turning any one option off changes the reference's output: a model ignoring it could not match."""
    cfg = gpt_cfg(**{**MODERN, **ALL_NEW, "n_layers": 3})
    model = build_model(cfg, seed=3)
    randomise_all(model, seed=11)
    p, idx = flat_params(model), np.asarray(tokens(1))
    want = np_modern(p, cfg, idx)
    for key, off in (("window_pattern", None), ("value_embeds", False), ("embed_skips", False),
                     ("unet_skips", False)):
        other = dataclasses.replace(cfg, **{key: off, **({"short_window": None} if key == "window_pattern" else {})})
        assert np.abs(np_modern(p, other, idx) - want).max() > 1e-2, key


def test_grouped_heads_are_full_heads_with_each_key_value_head_repeated() -> None:
    """The same function as a model whose H key/value heads are the K ones each repeated H / K times."""
    cfg = gpt_cfg(**MODERN, n_kv_heads=2, n_layers=2)
    model = build_model(cfg, seed=3)
    randomise(model, seed=11)
    p, idx = flat_params(model), tokens(1)
    full = {k: v for k, v in p.items() if ".attn.q." not in k and ".attn.kv." not in k}
    for i in range(2):
        kv = p[f"blocks.{i}.attn.kv.kernel"].reshape(C, 2, 2, 8)  # (C, k|v, K, D)
        k, v = (np.repeat(kv[:, j], 2, axis=1).reshape(C, C) for j in range(2))  # head h <- K-head h // 2
        full[f"blocks.{i}.attn.qkv.kernel"] = np.concatenate([p[f"blocks.{i}.attn.q.kernel"], k, v], axis=1)
    dense = build_model(dataclasses.replace(cfg, n_kv_heads=H), seed=0)
    nnx.update(dense, nnx.from_flat_state([(path, var.replace(jnp.asarray(full[".".join(map(str, path))], jnp.float32)))
                                           for path, var in nnx.to_flat_state(nnx.state(dense, nnx.Param))]))
    np.testing.assert_allclose(np.asarray(model(idx)), np.asarray(dense(idx)), atol=1e-5)
    assert np.abs(np.asarray(model(idx))).max() > 1.0


def test_windows_are_tiled_and_the_last_layer_is_always_full() -> None:
    for pattern, layers, short, want in (("SSSL", 6, 4, [4, 4, 4, 16, 4, 16]), ("S", 3, 2, [2, 2, 16]),
                                         ("L", 2, None, [16, 16]), ("SL", 5, 7, [7, 16, 7, 16, 7, 16][:4] + [16])):
        cfg = gpt_cfg(window_pattern=pattern, n_layers=layers, short_window=short)
        assert list(cfg.layer_windows()) == want == np_windows(cfg), (pattern, cfg.layer_windows())
    assert gpt_cfg(window_pattern="SL").layer_windows() == (T_CTX // 4, T_CTX)  # short_window null: a quarter
    assert gpt_cfg().layer_windows() == (T_CTX,) * 2


@pytest.mark.parametrize("kernel", ["xla", "per_head"])
@pytest.mark.parametrize("traced", [pytest.param(False, id="static", marks=SLOW), pytest.param(True, id="traced")])
def test_a_window_hides_exactly_the_tokens_before_it(kernel: str, traced: bool) -> None:
    """ops.attention with grouped heads and a window of 3, static (an unrolled layer's) or traced (a
    scanned one's), against numpy; and a value changed outside a query's window leaves that
    query's output as it was, inside the window it does not."""
    ops = select(gpt_cfg(attention=kernel), "cpu")
    rng = np.random.default_rng(0)
    T, Hq, Kv, D, w = 8, 4, 2, 8, 3
    q = rng.standard_normal((1, T, Hq, D)).astype(np.float32)
    k, v = (rng.standard_normal((1, T, Kv, D)).astype(np.float32) for _ in range(2))
    attend = jax.jit(lambda q, k, v, w: ops.attention(q, k, v, window=w)) if traced else \
        (lambda q, k, v, w: ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), window=w))
    got = np.asarray(attend(q, k, v, jnp.int32(w) if traced else w))  # (1, T, H*D)
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    kk, vv = k[0][:, np.arange(Hq) // 2].transpose(1, 0, 2), v[0][:, np.arange(Hq) // 2].transpose(1, 0, 2)
    scores = np.where((s <= t) & (t - s < w), q[0].transpose(1, 0, 2) @ kk.transpose(0, 2, 1) / np.sqrt(D), -np.inf)
    want = (np_softmax(scores) @ vv).transpose(1, 0, 2).reshape(T, Hq * D)
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    for pos in range(T):
        v2 = v.copy()
        v2[0, pos] += 5.0
        changed = np.abs(np.asarray(attend(q, k, v2, jnp.int32(w) if traced else w))[0] - got[0]).max(-1) > 1e-4
        np.testing.assert_array_equal(changed, (np.arange(T) >= pos) & (np.arange(T) - pos < w), err_msg=str(pos))


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
    assert set(more) - set(plain) == {f"connections.{n}" for n in
                                      ("value_tables", "value_gates", "resid_lambdas", "x0_lambdas", "skip_weights")}
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
    new = [(path, var.replace(weights[path].get_value() if path in weights else
                              jnp.full_like(var.get_value(), neutral.get(path[-1], 0.5))))
           for path, var in nnx.to_flat_state(nnx.state(more, nnx.Param))]
    nnx.update(more, nnx.from_flat_state(new))
    idx = tokens(3)
    np.testing.assert_allclose(np.asarray(more(idx)), np.asarray(plain(idx)), atol=1e-6)


# ----------------------------------------------------------------------------- with the speed options

SPEED = {"scan-layers": {"scan_layers": True}, "remat": {"remat": True}, "attention-xla": {"attention": "xla"},
         "scan-remat-chunk-xla": {"scan_layers": True, "remat": True, "loss_chunk": 7, "attention": "xla"}}
NEW_MODEL = {**MODERN, **ALL_NEW, "n_layers": 5, "window_pattern": "SSL"}


@pytest.fixture(scope="module")
def new_weights() -> dict[str, np.ndarray]:
    return random_weights(gpt_cfg(**NEW_MODEL))


@pytest.fixture(scope="module")
def new_reference(new_weights) -> tuple[float, dict[str, np.ndarray]]:
    return loss_and_grads(model_with(new_weights, **NEW_MODEL))


@pytest.mark.parametrize("kw", cases(SPEED, fast={"scan-remat-chunk-xla"}))
def test_new_options_with_speed_options_match_the_default_path(new_weights, new_reference, kw) -> None:
    ref_loss, ref_grads = new_reference
    loss, grads = loss_and_grads(model_with(new_weights, **{**NEW_MODEL, **kw}))
    assert abs(loss - ref_loss) <= 1e-5, (loss, ref_loss)
    assert sorted(grads) == sorted(ref_grads) and "connections.value_tables" in grads
    scale = max(np.abs(g).max() for g in ref_grads.values())
    assert max(np.abs(grads[k] - ref_grads[k]).max() for k in ref_grads) <= 1e-5 * scale
    for name in ("value_tables", "value_gates", "resid_lambdas", "x0_lambdas", "skip_weights"):
        assert np.abs(ref_grads[f"connections.{name}"]).max() > 1e-6, name  # every connection is trained


@SLOW  # a bfloat16 scanned model compiled for loss and gradients
def test_new_options_in_bfloat16_are_float32_within_its_precision(new_weights, new_reference) -> None:
    ref_loss, ref_grads = new_reference
    loss, grads = loss_and_grads(model_with(new_weights, **NEW_MODEL, compute_dtype="bfloat16", scan_layers=True,
                                            loss_chunk=7))
    assert loss != ref_loss and abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)
    for key, ref in ref_grads.items():
        g = grads[key].ravel().astype(np.float64)
        assert g @ ref.ravel() / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30) >= 0.99, key


# ----------------------------------------------------------------------------- the optimiser's routing


def test_muon_routes_the_new_parameters() -> None:
    for scan in (False, True):
        model = build_model(gpt_cfg(**ALL_NEW, n_layers=3, scan_layers=scan))
        table = muon.routing_table(model, muon.routes(model))
        assert "blocks.*.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"] or \
               "blocks.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"], table["muon"]["names"]
        assert "connections.value_tables" in table["embed"]["names"]
        assert {"connections.value_gates", "connections.resid_lambdas", "connections.x0_lambdas",
                "connections.skip_weights"} <= set(table["scalar"]["names"])
        assert not any("qkv" in n for n in table["muon"]["names"])


# ----------------------------------------------------------------------------- errors and layout


@pytest.mark.parametrize("kw, match", [
    ({"n_kv_heads": 3}, r"^model.json: n_kv_heads=3 must divide n_heads=4"),
    ({"n_kv_heads": 0}, r"^model.json: n_kv_heads=0 must be > 0"),
    ({"window_pattern": "SXL"}, r"^model.json: window_pattern='SXL' must be a string of 'S'"),
    ({"window_pattern": ""}, r"^model.json: window_pattern='' must be a string of 'S'"),
    ({"short_window": 4},
     r"^model.json: short_window=4 is the window of the 'S' layers of window_pattern, which is null; set window_pattern"),
    ({"window_pattern": "SL", "short_window": 17}, r"^model.json: short_window=17 must be in 1..context_length=16"),
    ({"unet_skips": True, "n_layers": 1}, r"^model.json: unet_skips=true joins the first half .* n_layers=1"),
    ({"architecture": "a-to-a", "value_embeds": True}, r"^model.json: value_embeds=True needs architecture 'gpt2'"),
])
def test_bad_combinations_are_one_line_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        gpt_cfg(**kw)
    assert "\n" not in str(e.value)


def test_bad_combination_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"architecture": "gpt2", "vocab_size": 61, "context_length": 16, "emb_dim": 32,
                                "n_heads": 4, "n_layers": 2, "n_kv_heads": 3}))
    with pytest.raises(ConfigError, match=rf"^{path}: n_kv_heads=3 must divide n_heads=4"):
        from_json(ModelConfig, path)


def test_new_parameters_carry_logical_axis_names() -> None:
    for kw in (ALL_NEW, {**ALL_NEW, "scan_layers": True, "qkv_bias": True}):
        model = build_model(gpt_cfg(**kw))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            assert names is not None and len(names) == var.get_value().ndim, (path, names)
