"""Each model.json speed option (and compute dtype) computes what the default path computes: on
GPT-2's layout, and on the modern and 2026 recipes' layouts.

Default path: float32 matmuls, attention "auto" (per_head on CPU), no remat, unrolled layers,
whole-logits loss. Tolerances, stated once:
  float32 options (attention kernel, remat, scan_layers, loss_chunk): loss within 1e-5, every
    gradient within 1e-5 of the largest gradient entry (float32 summation-order noise);
  compute_dtype bfloat16: loss within 2% and every parameter's gradient with cosine similarity
    >= 0.99 to the float32 one (bfloat16 keeps 8 bits of mantissa).
The weights are randomised to useful sizes first (peaky attention, non-zero biases), so an option
that dropped a term could not match by accident.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import F32_SLACK, ON_ACCELERATOR, SLOW, cases
from flax import nnx
from model_reference import ALL_NEW, MODERN, equations, gpt_cfg

from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig
from jaxgpt.cpu import kernels as cpu_kernels
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.model.gpt import build_model, matrix_mask, unstack_layer_weights
from jaxgpt.model.loss import loss_fn
from jaxgpt.ops import attention_kernel, mixed_einsum, plain_product
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.train_step import step_key, train_step

V, CTX, C, H, L, B = 61, 16, 32, 4, 3, 2
F32_TOL = 1e-5 * F32_SLACK  # conftest: wider on an accelerator


def cfg(**kw) -> ModelConfig:
    base = {
        "architecture": "gpt2",
        "vocab_size": V,
        "context_length": CTX,
        "emb_dim": C,
        "n_heads": H,
        "n_layers": L,
        "qkv_bias": True,
        "drop_rate": 0.0,
        "tie_embeddings": True,
    }
    return ModelConfig(**{**base, **kw})


def random_weights(model_cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-layer weights (the file layout) of useful sizes for `model_cfg`'s shapes."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, value in ckpt.weights_to_numpy(build_model(dataclasses.replace(model_cfg, scan_layers=False))).items():
        name = key.rsplit(".", 1)[-1]
        if name == "scale":
            out[key] = 1 + 0.3 * rng.standard_normal(value.shape)
        elif name == "bias":
            out[key] = 0.3 * rng.standard_normal(value.shape)
        elif name == "embedding":
            out[key] = rng.standard_normal(value.shape)
        else:
            out[key] = 1.5 * rng.standard_normal(value.shape) / math.sqrt(value.shape[0])
    return {k: v.astype(np.float32) for k, v in out.items()}


def model_with(weights: dict[str, np.ndarray], **kw) -> nnx.Module:
    model = build_model(cfg(**kw))
    ckpt.assign_weights(model, weights, "test")  # stacks them for a scan_layers model
    return model


def batch(seed: int = 1) -> tuple[jax.Array, jax.Array]:
    ids = np.random.default_rng(seed).integers(0, V, (B, CTX + 1))
    return jnp.asarray(ids[:, :-1], jnp.int32), jnp.asarray(ids[:, 1:], jnp.int32)


def loss_and_grads(model: nnx.Module, rngs_seed: int | None = None) -> tuple[float, dict[str, np.ndarray]]:
    x, y = batch()
    rngs = None if rngs_seed is None else nnx.Rngs(dropout=rngs_seed)
    loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model, x, y, rngs)
    flat = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(grads)}
    return float(loss), unstack_layer_weights(flat) if model.cfg.scan_layers else flat


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return random_weights(cfg())


@pytest.fixture(scope="module")
def reference(weights: dict[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
    return loss_and_grads(model_with(weights))


OPTIONS = {
    "attention-xla": {"attention": "xla"},
    "attention-per-head": {"attention": "per_head"},
    "remat": {"remat": True},
    "scan-layers": {"scan_layers": True},
    "scan-layers-remat": {"scan_layers": True, "remat": True},
    "loss-chunk-7": {"loss_chunk": 7},  # 32 tokens: four full chunks and a padded one
    "loss-chunk-32": {"loss_chunk": 32},  # exactly one chunk
    "loss-chunk-big": {"loss_chunk": 4096},  # larger than the microbatch
    "all-float32": {"scan_layers": True, "remat": True, "loss_chunk": 5, "attention": "xla"},
}


@pytest.mark.parametrize("kw", cases(OPTIONS, fast={"attention-per-head", "all-float32"}))
def test_float32_option_matches_default(weights, reference, kw: dict) -> None:
    if kw.get("attention") == "per_head" and ON_ACCELERATOR:
        pytest.skip("per_head is the CPU's kernel, refused elsewhere (test_attention_auto_resolves_per_backend)")
    ref_loss, ref_grads = reference
    loss, grads = loss_and_grads(model_with(weights, **kw))
    assert abs(loss - ref_loss) <= F32_TOL, (loss, ref_loss)
    assert sorted(grads) == sorted(ref_grads)
    scale = max(np.abs(g).max() for g in ref_grads.values())
    worst = max(np.abs(grads[k] - ref_grads[k]).max() for k in ref_grads)
    assert worst <= F32_TOL * scale, (worst, scale)
    assert ref_loss > 1.0 and scale > 0.1  # a real loss and real gradients, not a degenerate case


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="bfloat16", marks=SLOW),
        pytest.param({"scan_layers": True, "remat": True, "loss_chunk": 7}, id="bfloat16-all-options"),
    ],
)
def test_bfloat16_matches_float32_within_its_precision(weights, reference, kw: dict) -> None:
    ref_loss, ref_grads = reference
    loss, grads = loss_and_grads(model_with(weights, compute_dtype="bfloat16", **kw))
    assert loss != ref_loss  # it really computed in bfloat16 ...
    assert abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)  # ... within its precision
    for key, ref in ref_grads.items():
        g = grads[key].ravel().astype(np.float64)
        cos = g @ ref.ravel() / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30)
        assert cos >= 0.99, (key, cos)
        assert grads[key].dtype == np.float32  # master weights and their gradients stay float32


def _dtypes_of(model: nnx.Module, primitive: str) -> set[str]:
    """The dtypes `primitive`'s results have in the model's forward program (a scan's body too)."""
    x, _ = batch()
    program = jax.make_jaxpr(lambda: model(x))().jaxpr
    return {str(v.aval.dtype) for eqn, _ in equations(program) if eqn.primitive.name == primitive for v in eqn.outvars}


def test_bfloat16_dense_outputs_hand_bfloat16_on_within_its_precision(weights, reference) -> None:
    """model.json dense_dtype "compute": the dense layers' outputs, their bias and GELU in bfloat16 (the
    MLP's tanh), the norms and logits float32, the weights' gradients float32; the loss and gradients
    within bfloat16's precision of float32's, and not plain bfloat16's (the option did something)."""
    ref_loss, ref_grads = reference
    options = {"compute_dtype": "bfloat16", "scan_layers": True, "remat": True, "loss_chunk": 7}
    plain, dense = model_with(weights, **options), model_with(weights, **options, dense_dtype="compute")
    assert _dtypes_of(plain, "tanh") == {"float32"} and _dtypes_of(dense, "tanh") == {"bfloat16"}
    assert _dtypes_of(dense, "rsqrt") == {"float32"}  # LayerNorm's statistics
    x, _ = batch()
    assert dense(x).dtype == jnp.float32
    plain_loss, _ = loss_and_grads(plain)
    loss, grads = loss_and_grads(dense)
    assert loss not in (ref_loss, plain_loss) and abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)
    for key, ref in ref_grads.items():
        g = grads[key].ravel().astype(np.float64)
        assert g @ ref.ravel() / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30) >= 0.99, key
        assert grads[key].dtype == np.float32
    # float32 compute has float32 dense outputs whatever dense_dtype says: the reference, bit for bit
    assert loss_and_grads(model_with(weights, dense_dtype="compute"))[0] == ref_loss


# ----------------------------------------------------------------------------- the recipes' layouts

# The recipes' layouts; cfg()'s base keys ride along, the recipe's override them.
RECIPES = {"modern": {**MODERN, "n_layers": 3}, "2026": {**MODERN, **ALL_NEW, "n_layers": 5, "window_pattern": "SSL"}}
SCAN_REMAT_CHUNK_XLA = {"scan_layers": True, "remat": True, "loss_chunk": 7, "attention": "xla"}
RECIPE_OPTIONS = {
    "modern-scan-layers": ("modern", {"scan_layers": True}),
    "modern-remat": ("modern", {"remat": True}),
    "modern-scan-remat-chunk-xla": ("modern", SCAN_REMAT_CHUNK_XLA),
    "2026-scan-layers": ("2026", {"scan_layers": True}),
    "2026-remat": ("2026", {"remat": True}),
    "2026-attention-xla": ("2026", {"attention": "xla"}),
    "2026-scan-remat-chunk-xla": ("2026", SCAN_REMAT_CHUNK_XLA),
}


@pytest.fixture(scope="module")
def recipe_reference() -> Callable[[str], tuple[dict[str, np.ndarray], float, dict[str, np.ndarray]]]:
    """recipe -> (its random weights, the default path's loss and gradients), each computed once."""
    done: dict[str, tuple[dict[str, np.ndarray], float, dict[str, np.ndarray]]] = {}

    def reference(recipe: str) -> tuple[dict[str, np.ndarray], float, dict[str, np.ndarray]]:
        if recipe not in done:
            weights = random_weights(gpt_cfg(**RECIPES[recipe]))
            done[recipe] = (weights, *loss_and_grads(model_with(weights, **RECIPES[recipe])))
        return done[recipe]

    return reference


@pytest.mark.parametrize("recipe_kw", cases(RECIPE_OPTIONS, fast={"2026-scan-remat-chunk-xla"}))
def test_recipe_with_speed_options_matches_its_default_path(recipe_reference, recipe_kw: tuple[str, dict]) -> None:
    recipe, kw = recipe_kw
    weights, ref_loss, ref_grads = recipe_reference(recipe)
    loss, grads = loss_and_grads(model_with(weights, **{**RECIPES[recipe], **kw}))
    assert abs(loss - ref_loss) <= 1e-5, (loss, ref_loss)
    assert sorted(grads) == sorted(ref_grads) and "blocks.0.attn.q_norm.scale" in grads
    scale = max(np.abs(g).max() for g in ref_grads.values())
    assert max(np.abs(grads[k] - ref_grads[k]).max() for k in ref_grads) <= 1e-5 * scale
    assert ref_loss > 1.0 and scale > 0.01
    if recipe == "2026":
        assert "connections.value_tables" in grads
        for name in ("value_tables", "value_gates", "resid_lambdas", "x0_lambdas", "skip_weights"):
            assert np.abs(ref_grads[f"connections.{name}"]).max() > 1e-6, name  # every connection is trained


@pytest.mark.parametrize(
    "recipe,dense",
    [
        pytest.param("modern", "float32", marks=SLOW),  # a bfloat16 scanned model compiled for loss and gradients
        pytest.param("2026", "float32", marks=SLOW),
        pytest.param("modern", "compute", marks=SLOW),
        pytest.param("2026", "compute", id="2026-dense-outputs"),  # grouped heads, value embeddings, ReLU squared
    ],
)
def test_recipe_in_bfloat16_is_float32_within_its_precision(recipe_reference, recipe: str, dense: str) -> None:
    weights, ref_loss, ref_grads = recipe_reference(recipe)
    loss, grads = loss_and_grads(
        model_with(
            weights, **RECIPES[recipe], compute_dtype="bfloat16", dense_dtype=dense, scan_layers=True, loss_chunk=7
        )
    )
    assert loss != ref_loss and abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)
    for key, ref in ref_grads.items():
        g = grads[key].ravel().astype(np.float64)
        assert g @ ref.ravel() / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30) >= 0.99, key


# ----------------------------------------------------------------------------- layouts, kernels, memory


@SLOW  # several trainings or a memory profile: the whole suite only
def test_dropout_masks_do_not_depend_on_the_layout(weights) -> None:
    # The same dropout key gives the same masks unrolled, scanned and rematerialised.
    losses = [
        loss_and_grads(model_with(weights, drop_rate=0.2, **kw), rngs_seed=5)[0]
        for kw in ({}, {"scan_layers": True}, {"remat": True})
    ]
    no_dropout = loss_and_grads(model_with(weights, drop_rate=0.2))[0]
    assert max(losses) - min(losses) <= F32_TOL, losses
    assert abs(losses[0] - no_dropout) > 1e-3  # dropout was on


def test_scan_layers_init_and_files_are_the_unrolled_ones(tmp_path: Path) -> None:
    unrolled, scanned = build_model(cfg()), build_model(cfg(scan_layers=True))
    a, b = ckpt.weights_to_numpy(unrolled), ckpt.weights_to_numpy(scanned)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert nnx.state(scanned, nnx.Param)["blocks"]["attn"]["qkv"]["kernel"].get_value().shape == (L, C, 3 * C)
    # A file written by a scanned model loads into an unrolled one and back (safetensors on disk).
    weights = random_weights(cfg())
    ckpt.assign_weights(scanned, weights, "test")
    ckpt.save_weights(scanned, tmp_path / "model.safetensors")
    fresh = build_model(cfg())
    ckpt.load_weights(fresh, tmp_path / "model.safetensors")
    back = ckpt.weights_to_numpy(fresh)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)


def test_weight_decay_mask_counts_per_layer_rank() -> None:
    def decayed(model: nnx.Module) -> set[str]:
        mask = matrix_mask(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        flat = {".".join(map(str, k)): v for k, v in nnx.traversals.flatten_mapping(mask).items()}
        if model.cfg.scan_layers:
            flat = {
                k: bool(v)
                for k, v in unstack_layer_weights(
                    {k: np.full(L, v) for k, v in flat.items() if k.startswith("blocks.")}
                ).items()
            } | {k: v for k, v in flat.items() if not k.startswith("blocks.")}
        return {k for k, v in flat.items() if v}

    unrolled = decayed(build_model(cfg()))
    assert unrolled == decayed(build_model(cfg(scan_layers=True)))
    assert "blocks.0.attn.qkv.kernel" in unrolled and "blocks.2.mlp.out.bias" not in unrolled
    assert not any(k.endswith(("bias", "scale")) for k in unrolled)


@SLOW  # several trainings or a memory profile: the whole suite only
def test_training_steps_match_with_every_float32_option(weights) -> None:
    """Three optimiser steps (k=2 accumulation, weight decay, clipping) through the real train_step."""
    train = TrainConfig(
        microbatch_size=B,
        gradient_accumulation_steps=2,
        train_steps=3,
        learning_rate=1e-2,
        warmup_percent=0.0,
        weight_decay=0.5,
    )
    rng = np.random.default_rng(3)
    ids = rng.integers(0, V, (3, 2, B, CTX + 1))

    def run(**kw) -> tuple[list[float], dict[str, np.ndarray]]:
        model = model_with(weights, **kw)
        opt = make_optimizer(model, train, 3)
        losses = []
        for step in range(3):
            batch = Batch(jnp.asarray(ids[step, :, :, :-1], jnp.int32), jnp.asarray(ids[step, :, :, 1:], jnp.int32))
            out, _stats = train_step(model, opt, batch, step_key(0, step))
            losses += np.asarray(out).tolist()
        return losses, ckpt.weights_to_numpy(model)

    def without_key_bias(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # The key part of qkv.bias has a zero gradient by construction (a softmax is blind to a
        # constant added to a row of scores), so Adam's g/sqrt(v) turns float noise there into
        # full +-lr steps on either path. Every other weight must agree.
        return {k: np.delete(v, np.s_[C : 2 * C]) if k.endswith("qkv.bias") else v for k, v in w.items()}

    ref_losses, ref_w = run()
    losses, w = run(scan_layers=True, remat=True, loss_chunk=7, attention="xla")
    assert np.allclose(losses, ref_losses, atol=1e-5, rtol=0), (losses, ref_losses)
    w, ref_w = without_key_bias(w), without_key_bias(ref_w)
    assert max(np.abs(w[k] - ref_w[k]).max() for k in ref_w) <= 1e-5
    assert max(np.abs(ref_w[k] - without_key_bias(weights)[k]).max() for k in ref_w) > 1e-3  # training moved them
    bf_losses, _ = run(compute_dtype="bfloat16")
    assert np.allclose(bf_losses, ref_losses, rtol=0.02), (bf_losses, ref_losses)


@pytest.mark.parametrize(
    "product", [pytest.param(plain_product, id="plain", marks=SLOW), pytest.param(cpu_kernels.bf16_product, id="cpu")]
)
@pytest.mark.parametrize(
    "spec, a_shape, b_shape",
    [
        ("nk,km->nm", (24, 16), (16, 8)),  # a dense layer
        ("btk,km->btm", (2, 12, 16), (16, 8)),  # a dense layer on (B, T, K) activations
        ("nc,vc->nv", (24, 16), (40, 16)),  # the tied head
        ("btd,bsd->bts", (2, 12, 8), (2, 12, 8)),  # attention scores, one head
        ("bts,bsd->btd", (2, 12, 12), (2, 12, 8)),  # attention values, one head
        ("bthd,bshd->bhts", (2, 12, 3, 8), (2, 12, 3, 8)),  # attention scores, all heads
        ("bhts,bshd->bthd", (2, 3, 12, 12), (2, 12, 3, 8)),  # attention values, all heads
    ],
)
def test_mixed_einsum_is_the_bfloat16_product_in_both_passes(spec: str, a_shape, b_shape, product) -> None:
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (a_shape, b_shape))
    out_shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), a, b).shape
    g = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)

    def r16(t: jax.Array) -> jax.Array:
        return t.astype(jnp.bfloat16).astype(jnp.float32)

    (sa, sb), so = spec.split("->")[0].split(","), spec.split("->")[1]
    # Expected: float32 arithmetic on bfloat16-rounded operands and cotangent, in numpy (float64).
    A, Bm, G = (np.asarray(r16(t), np.float64) for t in (a, b, g))

    @jax.jit  # as in training: one program, the saved operands are runtime values
    def forward_backward(a, b, g):
        out, vjp = jax.vjp(lambda a, b: mixed_einsum(spec, a, b, jnp.bfloat16, product), a, b)
        return out, *vjp(g)

    try:
        out, da, db = jax.block_until_ready(forward_backward(a, b, g))
    except jax.errors.JaxRuntimeError as e:
        # The GPU/TPU product on XLA:CPU: some bfloat16 dot layouts it cannot run at all (why
        # cpu_kernels.bf16_product exists); the CUDA export test audits those programs instead.
        if product is plain_product and jax.default_backend() == "cpu" and "DotThunk" in str(e):
            pytest.skip(f"XLA:CPU cannot run this bfloat16 dot layout: {str(e).splitlines()[0]}")
        raise
    assert out.dtype == da.dtype == db.dtype == jnp.float32
    np.testing.assert_allclose(out, np.einsum(spec, A, Bm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(da, np.einsum(f"{so},{sb}->{sa}", G, Bm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, np.einsum(f"{sa},{so}->{sb}", A, G), rtol=1e-5, atol=1e-5)
    # and not the float32 product: the rounding is real
    assert np.abs(np.asarray(out) - np.einsum(spec, np.asarray(a, np.float64), np.asarray(b, np.float64))).max() > 1e-3


def dot_operand_dtypes(hlo: str) -> list[tuple[str, str, str]]:
    """(lhs, rhs, output) element types of every dot in an optimised HLO module's text."""
    found = []
    for body in re.findall(r"\{\n(.*?)\n\}", hlo, re.DOTALL):  # each computation: operands are defined in it
        types = dict(re.findall(r"^\s*(?:ROOT )?(%[\w.\-]+) = (\w+)\[", body, re.MULTILINE))
        for out, lhs, rhs in re.findall(r"= (\w+)\[[^ ]* dot\((%[\w.\-]+), (%[\w.\-]+)\)", body):
            found.append((types[lhs], types[rhs], out))
    return found


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="default", marks=SLOW),
        pytest.param({"scan_layers": True, "loss_chunk": 7}, id="scan-chunked"),
    ],
)
def test_bfloat16_forward_and_backward_keep_every_dot_in_bfloat16(weights, kw: dict) -> None:
    """Every product of the bfloat16 path, weight gradients included, reaches XLA as a bfloat16 dot.

    XLA:CPU silently upcasts a dot it cannot run natively (a transposed left operand: the weight
    gradients x^T g), which costs speed, not accuracy: only the compiled program shows it.
    """
    probe = jax.jit(lambda a, b: jnp.einsum("nk,km->nm", a, b, preferred_element_type=jnp.float32))
    a16 = jnp.ones((64, 64), jnp.bfloat16)
    if dot_operand_dtypes(probe.lower(a16, a16).compile().as_text()) != [("bf16", "bf16", "f32")]:
        pytest.skip(f"this backend ({jax.default_backend()}) upcasts even a plain bfloat16 dot")
    graphdef, state = nnx.split(model_with(weights, compute_dtype="bfloat16", **kw))
    x, y = batch()
    step = jax.jit(jax.value_and_grad(lambda s, x, y: loss_fn(nnx.merge(graphdef, s), x, y)))
    dots = dot_operand_dtypes(step.lower(state, x, y).compile().as_text())
    assert len(dots) >= 6 * L, dots  # forward and both backward products of each block's matmuls
    assert set(dots) == {("bf16", "bf16", "f32")}, sorted(set(dots))


def test_attention_auto_resolves_per_backend() -> None:
    assert attention_kernel(cfg(), "cpu") == "per_head"
    assert attention_kernel(cfg(compute_dtype="bfloat16"), "cpu") == "per_head"
    assert attention_kernel(cfg(), "gpu") == "xla"  # cuDNN has no float32 kernel
    assert attention_kernel(cfg(compute_dtype="bfloat16"), "tpu") == "xla"
    assert attention_kernel(cfg(attention="xla"), "cpu") == "xla"
    with pytest.raises(ConfigError, match=r"model.json: attention='per_head' is the CPU kernel .*gpu"):
        attention_kernel(cfg(attention="per_head"), "gpu")


@pytest.mark.skipif(bool(jax.devices()[0].platform == "gpu"), reason="checks the no-cuDNN path")
def test_cudnn_attention_falls_back_or_fails_in_one_line_without_cudnn(capsys) -> None:
    """Resolved for CUDA on a machine with no cuDNN: JAX's own check (lowering a cuDNN attention
    for CUDA) fails, so "auto" says so and takes XLA's attention, and "cudnn" is a config error."""
    bf16 = cfg(compute_dtype="bfloat16")
    assert attention_kernel(bf16, "gpu") == "xla"
    note = capsys.readouterr().err.strip()
    assert note.startswith("note: model.json attention='auto': cuDNN flash attention unavailable (")
    assert "cuDNN" in note and note.endswith("using XLA's attention") and "\n" not in note
    with pytest.raises(ConfigError, match=r"^model.json: attention='cudnn' cannot run here \(.*cuDNN.*\); use"):
        attention_kernel(cfg(compute_dtype="bfloat16", attention="cudnn"), "gpu")


def test_bad_option_values_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"attention='cudnn' needs compute_dtype='bfloat16'"):
        cfg(attention="cudnn")
    with pytest.raises(ConfigError, match=r"loss_chunk=0 must be > 0"):
        cfg(loss_chunk=0)


@SLOW  # several trainings or a memory profile: the whole suite only
def test_scan_layers_with_remat_cuts_the_step_memory() -> None:
    """XLA's own buffer accounting of one forward + backward (deterministic for a given XLA)."""

    def temp_bytes(**kw) -> int:
        model = build_model(cfg(n_layers=6, emb_dim=64, context_length=64, **kw))
        x = jnp.zeros((8, 64), jnp.int32)
        compiled = nnx.jit(nnx.value_and_grad(loss_fn)).lower(model, x, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    default, scanned_remat = temp_bytes(), temp_bytes(scan_layers=True, remat=True)
    assert scanned_remat < 0.5 * default, (scanned_remat, default)
