"""GPT-2 and A-to-A against an independent numpy forward pass; causality, dropout, init, size.

The reference below is written from the GPT-2 paper/`nanoGPT` layout, not from jaxgpt/model/gpt.py: it only
shares the parameter *names* (read from `nnx.to_flat_state`). Parameters are randomised before the
comparison (non-zero biases, LayerNorm scales away from 1, peaky attention), so a forward pass that
forgot a bias, a scale or the 1/sqrt(D) factor cannot match by accident.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SLOW
from flax import nnx

from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import GPT, AToA, abstract_model, build_model, count_params

V, T_CTX, C, H, L = 61, 16, 32, 4, 2  # tiny, V odd on purpose (no accidental power-of-two layouts)
TOL = 1e-4


def gpt_cfg(**kw) -> ModelConfig:
    base = dict(architecture="gpt2", vocab_size=V, context_length=T_CTX, emb_dim=C, n_heads=H,
                n_layers=L, qkv_bias=False, drop_rate=0.0, tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


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


# ----------------------------------------------------------------------------- numpy reference


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
    B, T = idx.shape
    Cm, Hm = cfg.emb_dim, cfg.n_heads
    D = Cm // Hm
    x = p["tok_emb.embedding"][idx] + p["pos_emb.embedding"][np.arange(T)][None]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}"
        h = np_layernorm(x, p[f"{b}.ln1.scale"], p[f"{b}.ln1.bias"])
        qkv = np_linear(p, f"{b}.attn.qkv", h)  # (B, T, 3C): q | k | v
        q, k, v = (qkv[..., i * Cm:(i + 1) * Cm].reshape(B, T, Hm, D).transpose(0, 2, 1, 3)
                   for i in range(3))  # (B, H, T, D)
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


# ----------------------------------------------------------------------------- forward = reference


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
            f"blocks.{i}.{k[7:]}": v[i] for k, v in p.items() if k.startswith("blocks.") for i in range(L)}
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
    cfg = ModelConfig(architecture="a-to-a", vocab_size=V, context_length=T_CTX, emb_dim=C,
                      tie_embeddings=tie)
    model = build_model(cfg, seed=4)
    assert isinstance(model, AToA)
    randomise(model, seed=12)
    p = flat_params(model)
    assert set(p) == ({"tok_emb.embedding"} if tie else {"tok_emb.embedding", "head.kernel"})
    idx = tokens(2)
    got = np.asarray(model(idx))
    assert got.shape == (2, T_CTX, V)
    np.testing.assert_allclose(got, np_atoa(p, cfg, np.asarray(idx)), atol=TOL, rtol=0)


def test_init_is_a_pure_function_of_the_seed() -> None:
    cfg = gpt_cfg()
    a, b, c = (flat_params(build_model(cfg, seed=s)) for s in (5, 5, 6))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["head.kernel"], c["head.kernel"])


# ----------------------------------------------------------------------------- causality and dropout


@pytest.fixture(scope="module")
def dropout_model() -> GPT:
    model = build_model(gpt_cfg(drop_rate=0.5, qkv_bias=True), seed=7)
    randomise(model, seed=13)
    return model


def _assert_causal(run, t: int) -> None:
    idx = tokens(3, B=2)
    changed = idx.at[:, t].set((idx[:, t] + 1) % V)
    a, b = np.asarray(run(idx)), np.asarray(run(changed))
    np.testing.assert_array_equal(a[:, :t], b[:, :t])  # the past does not see the future at all
    assert np.abs(a[:, t:] - b[:, t:]).max() > 1e-3  # ... but position t itself does change


@pytest.mark.parametrize("t", [0, 5, T_CTX - 1])
def test_causal_without_dropout(t: int) -> None:
    model = build_model(gpt_cfg(), seed=8)
    randomise(model, seed=14)
    _assert_causal(lambda x: model(x), t)


def test_causal_with_dropout_path(dropout_model: GPT) -> None:
    # Same dropout key for both inputs: the masks are identical, only the token differs. This
    # covers the hand-written attention path used while dropout is active.
    _assert_causal(lambda x: dropout_model(x, nnx.Rngs(dropout=0)), 6)


def test_dropout_is_off_without_rngs(dropout_model: GPT) -> None:
    idx = tokens(4)
    a, b = np.asarray(dropout_model(idx)), np.asarray(dropout_model(idx))
    np.testing.assert_array_equal(a, b)
    # ... and equals the numpy reference, i.e. no hidden scaling or masking at evaluation.
    np.testing.assert_allclose(a, np_gpt2(flat_params(dropout_model), dropout_model.cfg,
                                          np.asarray(idx)), atol=TOL, rtol=0)


def test_dropout_keys(dropout_model: GPT) -> None:
    idx = tokens(5)
    det = np.asarray(dropout_model(idx))
    k0a = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    k0b = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    k1 = np.asarray(dropout_model(idx, nnx.Rngs(dropout=1)))
    np.testing.assert_array_equal(k0a, k0b)  # same key, same masks
    assert np.abs(k0a - k1).max() > 1e-2  # different key, different masks
    assert np.abs(k0a - det).max() > 1e-2  # dropout really is on with rngs
    assert np.all(np.isfinite(k0a))


def test_manual_attention_path_matches_fused(dropout_model: GPT) -> None:
    """With rngs and drop_rate > 0 attention is spelled out by hand. Zero every Dropout's rate
    (the attention module still takes the manual branch) and it must equal the fused path."""
    idx = tokens(6)
    want = np.asarray(dropout_model(idx))
    dropouts = [m for _, m in nnx.iter_graph(dropout_model) if isinstance(m, nnx.Dropout)]
    assert len(dropouts) == 1 + 3 * L  # embedding + (attn, resid, mlp) per block
    try:
        for d in dropouts:
            d.rate = 0.0
        assert all(b.attn.drop_rate > 0 for b in dropout_model.blocks)
        got = np.asarray(dropout_model(idx, nnx.Rngs(dropout=0)))
    finally:
        for d in dropouts:
            d.rate = 0.5
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_zero_drop_rate_ignores_rngs() -> None:
    model = build_model(gpt_cfg(drop_rate=0.0), seed=9)
    idx = tokens(7)
    np.testing.assert_array_equal(np.asarray(model(idx, nnx.Rngs(dropout=0))), np.asarray(model(idx)))
    np.testing.assert_array_equal(np.asarray(model(idx, nnx.Rngs(dropout=1))), np.asarray(model(idx)))


def test_drop_rate_does_not_change_params() -> None:
    a = flat_params(build_model(gpt_cfg(drop_rate=0.0), seed=10))
    b = flat_params(build_model(gpt_cfg(drop_rate=0.3), seed=10))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- init and size


def test_gpt2_init_statistics() -> None:
    n_layers, emb = 3, 128
    cfg = ModelConfig(architecture="gpt2", vocab_size=100, context_length=16, emb_dim=emb,
                      n_heads=4, n_layers=n_layers, qkv_bias=True)
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


def gpt2_param_formula(v: int, t: int, c: int, n: int, qkv_bias: bool, tie: bool) -> int:
    block = (2 * 2 * c            # ln1, ln2 (scale + bias)
             + c * 3 * c + (3 * c if qkv_bias else 0)  # fused qkv
             + c * c + c           # attention output projection
             + c * 4 * c + 4 * c   # mlp fc
             + 4 * c * c + c)      # mlp out
    return v * c + t * c + n * block + 2 * c + (0 if tie else c * v)


@pytest.mark.parametrize("qkv_bias,tie", [(False, False), (True, True), (True, False)])
def test_param_count_formula(qkv_bias: bool, tie: bool) -> None:
    # Shape-only model (no init compute); all five sizes differ so a swapped term is caught.
    cfg = ModelConfig(architecture="gpt2", vocab_size=97, context_length=12, emb_dim=24,
                      n_heads=3, n_layers=3, qkv_bias=qkv_bias, tie_embeddings=tie)
    assert count_params(abstract_model(cfg)) == gpt2_param_formula(97, 12, 24, 3, qkv_bias, tie)


def test_param_count_real_model() -> None:
    model = build_model(gpt_cfg(qkv_bias=True, tie_embeddings=False), seed=0)
    assert count_params(model) == gpt2_param_formula(V, T_CTX, C, L, True, False)
    assert count_params(model) == sum(v.size for v in flat_params(model).values())


def test_param_count_gpt2_small_shape() -> None:
    """GPT-2 small (124M with the tied head): counted on an abstract model, nothing allocated."""
    cfg = ModelConfig(architecture="gpt2", vocab_size=50257, context_length=1024, emb_dim=768,
                      n_heads=12, n_layers=12, qkv_bias=True, tie_embeddings=True)
    assert count_params(abstract_model(cfg)) == 124_439_808


@pytest.mark.parametrize("tie", [False, True])
def test_param_count_atoa(tie: bool) -> None:
    cfg = ModelConfig(architecture="a-to-a", vocab_size=257, context_length=8, emb_dim=16,
                      tie_embeddings=tie)
    assert count_params(abstract_model(cfg)) == 257 * 16 * (1 if tie else 2)
