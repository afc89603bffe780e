"""The model against an independent numpy forward pass (model_reference.py): GPT-2's layout and
A-to-A, every architecture option alone and all together; the reference telling each option apart;
init (a function of the seed, GPT-2's statistics, zero output projections); parameter counts; every
parameter's logical axis names."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW, cases
from flax import nnx
from model_reference import (
    ALL_NEW,
    MODERN,
    T_CTX,
    TOL,
    C,
    L,
    V,
    flat_params,
    gpt_cfg,
    np_atoa,
    np_gpt2,
    np_modern,
    np_norm,
    randomise,
    randomise_all,
    tokens,
)

from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import GPT, AToA, abstract_model, build_model, count_params

# ----------------------------------------------------------------------------- GPT-2 and A-to-A = reference


@pytest.mark.parametrize("tie", [pytest.param(False, id="untied", marks=SLOW), pytest.param(True, id="tied")])
@pytest.mark.parametrize("qkv_bias", [pytest.param(False, id="nobias", marks=SLOW), pytest.param(True, id="qkvbias")])
def test_gpt2_matches_numpy_reference(qkv_bias: bool, tie: bool) -> None:
    cfg = gpt_cfg(qkv_bias=qkv_bias, tie_embeddings=tie)
    model = build_model(cfg, seed=3)
    assert isinstance(model, GPT)
    randomise(model, seed=11)
    p = flat_params(model)
    assert ("blocks.0.attn.qkv.bias" in p) == qkv_bias
    assert ("head.kernel" in p) == (not tie)
    # Full context; one case also a shorter sequence (positions 0..T-1 only). Shapes are shared
    # across tests on purpose: eager ops compile once per shape.
    for T in (T_CTX, 5) if qkv_bias and not tie else (T_CTX,):
        idx = tokens(1, T=T)
        got = np.asarray(model(idx))
        assert got.shape == (2, T, V) and got.dtype == np.float32
        want = np_gpt2(p, cfg, np.asarray(idx))
        assert np.abs(want).max() > 1.0  # the comparison is not between two near-zero tensors
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_bias_false_has_no_bias_and_matches_numpy_with_zero_biases(scan: bool) -> None:
    cfg = gpt_cfg(bias=False, scan_layers=scan)
    model = build_model(cfg, seed=3)
    randomise(model, seed=11)
    p = flat_params(model)
    assert p and not [n for n in p if "bias" in n], sorted(p)
    if scan:  # stacked (L, ...) -> the reference's per-layer names
        p = {k: v for k, v in p.items() if not k.startswith("blocks.")} | {
            f"blocks.{i}.{k[7:]}": v[i] for k, v in p.items() if k.startswith("blocks.") for i in range(L)
        }
    with_bias = flat_params(build_model(gpt_cfg(qkv_bias=True), seed=3))
    # Every bias of GPT-2's layout (LayerNorms, qkv, proj, fc, out, ln_f) is gone, nothing else.
    assert sorted(p) == sorted(n for n in with_bias if not n.endswith(".bias"))
    zeros = {n: np.zeros_like(v) for n, v in with_bias.items() if n.endswith(".bias")}
    assert len(zeros) == 6 * L + 1
    idx = tokens(1)
    want = np_gpt2(p | zeros, gpt_cfg(qkv_bias=True), np.asarray(idx))
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(np.asarray(model(idx)), want, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="qkv_bias=true contradicts bias=false"):
        gpt_cfg(bias=False, qkv_bias=True)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_atoa_matches_numpy_reference(tie: bool) -> None:
    cfg = ModelConfig(architecture="a-to-a", vocab_size=V, context_length=T_CTX, emb_dim=C, tie_embeddings=tie)
    model = build_model(cfg, seed=4)
    assert isinstance(model, AToA)
    randomise(model, seed=12)
    p = flat_params(model)
    assert set(p) == ({"tok_emb.embedding"} if tie else {"tok_emb.embedding", "head.kernel"})
    idx = tokens(2)
    got = np.asarray(model(idx))
    assert got.shape == (2, T_CTX, V)
    np.testing.assert_allclose(got, np_atoa(p, cfg, np.asarray(idx)), atol=TOL, rtol=0)


# ----------------------------------------------------------------------------- every option = reference

OPTIONS = {
    # the modern recipe's (layers.py), each alone and together
    "rotary": {"positions": "rotary"},
    "rmsnorm": {"norm": "rmsnorm"},
    "rmsnorm-no-scale": {"norm": "rmsnorm", "norm_scale": False},
    "layernorm-no-scale": {"norm_scale": False},
    "embed-norm": {"embed_norm": True},
    "qk-norm": {"qk_norm": True},
    "relu2": {"mlp": "relu2"},
    "softcap": {"logit_softcap": 2.0},
    "all": {**MODERN, "logit_softcap": 3.0},
    "all-tied-biases-no-scale": {
        **MODERN,
        "tie_embeddings": True,
        "bias": True,
        "qkv_bias": True,
        "norm": "layernorm",
        "norm_scale": False,
        "logit_softcap": 3.0,
    },
    # the 2026 recipe's (grouped heads, windows, connections.py), each alone, together, with the modern ones
    "gqa-2": {"n_kv_heads": 2},
    "gqa-1": {"n_kv_heads": 1},
    "windows": {"window_pattern": "SSL", "short_window": 5},
    "value-embeds": {"value_embeds": True},
    "embed-skips": {"embed_skips": True},
    "unet": {"unet_skips": True},
    "all-new": ALL_NEW,
    "all-new-modern": {**MODERN, **ALL_NEW, "logit_softcap": 3.0},
    "all-new-odd-layers": {**ALL_NEW, "n_layers": 5, "window_pattern": "SSSL"},
    "all-new-gpt2-layout": {**ALL_NEW, "bias": True, "qkv_bias": True, "tie_embeddings": True},
}


@pytest.mark.parametrize(
    "kw",
    cases(
        OPTIONS,
        fast={
            "rotary",
            "all",
            "all-tied-biases-no-scale",
            "all-new-modern",
            "all-new-odd-layers",
            "all-new-gpt2-layout",
        },
    ),
)
def test_option_matches_numpy_reference(kw: dict) -> None:
    cfg = gpt_cfg(**kw)
    model = build_model(cfg, seed=3)
    randomise_all(model, seed=11)  # zero_init_proj's zeros too: the forward must use the real weights
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


# A layout, then each of its options turned off: (key, its value off, what changes with it).
APART = {
    "modern": (
        MODERN,
        [
            ("positions", "learned", {"rope_base": None}),
            ("embed_norm", False, {}),
            ("qk_norm", False, {}),
            ("mlp", "gelu", {}),
            ("logit_softcap", None, {}),
            ("norm", "layernorm", {}),
        ],
    ),
    "2026": (
        {**MODERN, **ALL_NEW, "n_layers": 3},
        [
            ("window_pattern", None, {"short_window": None}),
            ("value_embeds", False, {}),
            ("embed_skips", False, {}),
            ("unet_skips", False, {}),
        ],
    ),
}


@pytest.mark.parametrize("layout", APART)
def test_the_reference_tells_each_option_apart(layout: str) -> None:
    """Turning any one option off changes the reference's output: a model ignoring it could not match."""
    kw, offs = APART[layout]
    cfg = gpt_cfg(**kw)
    model = build_model(cfg, seed=3)
    randomise_all(model, seed=11)
    p, idx = flat_params(model), np.asarray(tokens(1))
    want = np_modern(p, cfg, idx)
    for key, off, with_it in offs:
        other = dataclasses.replace(cfg, **{key: off, **with_it})
        q = p | ({"pos_emb.embedding": np.zeros((T_CTX, C))} if key == "positions" else {})
        assert np.abs(np_modern(q, other, idx) - want).max() > 1e-2, key


# ----------------------------------------------------------------------------- init


def test_init_is_a_pure_function_of_the_seed() -> None:
    cfg = gpt_cfg()
    a, b, c = (flat_params(build_model(cfg, seed=s)) for s in (5, 5, 6))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["head.kernel"], c["head.kernel"])


def test_gpt2_init_statistics() -> None:
    n_layers, emb = 3, 128
    cfg = ModelConfig(
        architecture="gpt2", vocab_size=100, context_length=16, emb_dim=emb, n_heads=4, n_layers=n_layers, qkv_bias=True
    )
    p = flat_params(build_model(cfg, seed=0))
    resid = 0.02 / math.sqrt(2 * n_layers)
    checked = 0
    for name, v in p.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias":
            assert np.all(v == 0), name
        elif leaf == "scale":
            assert np.all(v == 1), name
        else:  # kernel / embedding
            want = resid if name.endswith(("attn.proj.kernel", "mlp.out.kernel")) else 0.02
            assert abs(v.std() / want - 1) < 0.06, (name, v.std(), want)
            assert abs(v.mean()) < 0.1 * want, (name, v.mean())
            checked += 1
    assert checked == 2 + 4 * n_layers + 1  # tok, pos, (qkv, proj, fc, out) per block, head
    # Different blocks are not initialised with the same draw.
    assert not np.array_equal(p["blocks.0.mlp.fc.kernel"], p["blocks.1.mlp.fc.kernel"])


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
    np.testing.assert_allclose(
        np.asarray(model(jnp.asarray(x))), 15.0 * np.tanh(emb @ p["head.kernel"] / 15.0), atol=TOL
    )


# ----------------------------------------------------------------------------- size and names


def gpt2_param_formula(v: int, t: int, c: int, n: int, qkv_bias: bool, tie: bool) -> int:
    block = (
        2 * 2 * c  # ln1, ln2 (scale + bias)
        + c * 3 * c
        + (3 * c if qkv_bias else 0)  # fused qkv
        + c * c
        + c  # attention output projection
        + c * 4 * c
        + 4 * c  # mlp fc
        + 4 * c * c
        + c
    )  # mlp out
    return v * c + t * c + n * block + 2 * c + (0 if tie else c * v)


@pytest.mark.parametrize("qkv_bias,tie", [(False, False), (True, True), (True, False)])
def test_param_count_formula(qkv_bias: bool, tie: bool) -> None:
    # Shape-only model (no init compute); all five sizes differ so a swapped term is caught.
    cfg = ModelConfig(
        architecture="gpt2",
        vocab_size=97,
        context_length=12,
        emb_dim=24,
        n_heads=3,
        n_layers=3,
        qkv_bias=qkv_bias,
        tie_embeddings=tie,
    )
    assert count_params(abstract_model(cfg)) == gpt2_param_formula(97, 12, 24, 3, qkv_bias, tie)


def test_param_count_real_model() -> None:
    model = build_model(gpt_cfg(qkv_bias=True, tie_embeddings=False), seed=0)
    assert count_params(model) == gpt2_param_formula(V, T_CTX, C, L, True, False)
    assert count_params(model) == sum(v.size for v in flat_params(model).values())


def test_param_count_gpt2_small_shape() -> None:
    """GPT-2 small (124M with the tied head): counted on an abstract model, nothing allocated."""
    cfg = ModelConfig(
        architecture="gpt2",
        vocab_size=50257,
        context_length=1024,
        emb_dim=768,
        n_heads=12,
        n_layers=12,
        qkv_bias=True,
        tie_embeddings=True,
    )
    assert count_params(abstract_model(cfg)) == 124_439_808


@pytest.mark.parametrize("tie", [False, True])
def test_param_count_atoa(tie: bool) -> None:
    cfg = ModelConfig(architecture="a-to-a", vocab_size=257, context_length=8, emb_dim=16, tie_embeddings=tie)
    assert count_params(abstract_model(cfg)) == 257 * 16 * (1 if tie else 2)


def test_parameters_carry_logical_axis_names() -> None:
    """sharding.py places parameters by these names: an unnamed one would be silently replicated."""
    for kw in (
        {**MODERN, "norm_scale": True},
        {**MODERN, "norm": "layernorm", "bias": True},
        {**MODERN, "scan_layers": True},
        ALL_NEW,
        {**ALL_NEW, "scan_layers": True, "qkv_bias": True},
    ):
        model = build_model(gpt_cfg(**kw))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            assert names is not None and len(names) == var.get_value().ndim, (path, names)
