"""generate.py: the KV cache against the model's full forward pass at every position, sliding,
batching, stopping, compile counts, and top-k / top-p / seeds on hand-made distributions."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CPU_ONLY, ON_ACCELERATOR, ROOT, SLOW, cases
from flax import nnx

import test_generation
from bench import decode
from jaxgpt.config import ModelConfig, to_dict
from jaxgpt.cpu import matvec as cpu_matvec
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.generation import decoder as g
from jaxgpt.generation.engine import Engine, GenerationStats
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.model.gpt import build_model, stack_layer_weights
from jaxgpt.ops import neutral, select

V, CTX, C, H, L = 61, 16, 32, 4, 2
# Cached and full-forward logits are the same float32 function summed in other orders (one
# query row against the cache vs the whole causal matrix). With logits up to ~20 (tiny's peaky
# weights), 1e-4 is ~40 ulps; float32 summation alone keeps them within ~1e-5.
TOL = 1e-4


def tolerance(ref: np.ndarray, compute_dtype: str = "float32", dense_dtype: str = "float32") -> float:
    """How far a cached path's logits may be from `ref`'s (the model's full forward).

    float32: TOL. bfloat16: the two paths round their matmul operands to bfloat16 after sums
    taken in other orders (other kernels; and XLA:CPU's bfloat16 dot is a native one on CPUs with
    AVX512_BF16 or AMX, an upcast float32 one elsewhere), so now and then a value that lies within
    float32 error of a bfloat16 rounding boundary rounds the other way: one bfloat16 ulp (2^-7 of
    that operand) moved in one term of a later sum. A few such flips move the logits by a small
    part of 2^-7 of their size; 2^-8 of the largest logit bounds them on every CPU, and stays far
    below what a wrong cache, position or weight does (the size of the logits themselves).

    With bfloat16 dense outputs (dense_dtype "compute") a layer's product, its bias add and each
    step of its activation are rounded to bfloat16 in the program as written, and XLA may skip any of
    those roundings inside a fusion (excess precision), differently in two programs: the same model
    op by op against jitted differs by 2^-7.4 of its largest logit on an Intel AMX CPU, its decoder
    against its full forward by 2^-6.8 on a TPU v5e (docs/log.md, ninth session). 2^-6 for those.
    """
    if compute_dtype != "bfloat16":
        return TOL
    return (2.0**-6 if dense_dtype == "compute" else 2.0**-8) * float(np.abs(ref).max())


def tiny(seed: int = 0, **kw) -> nnx.Module:
    """A tiny GPT-2 with every parameter replaced by values of a useful size (non-zero biases,
    LayerNorm scales away from 1, peaky attention): nothing can match by accident.

    The values are drawn per layer, so a scan_layers model gets exactly the weights of the
    unrolled one (stacked): both layouts decode the same, equally well-conditioned, model.
    """
    cfg = ModelConfig(
        **{
            **dict(
                architecture="gpt2",
                vocab_size=V,
                context_length=CTX,
                emb_dim=C,
                n_heads=H,
                n_layers=L,
                qkv_bias=True,
                tie_embeddings=True,
            ),
            **kw,
        }
    )
    unrolled = build_model(ModelConfig(**{**to_dict(cfg), "scan_layers": False}))
    rng = np.random.default_rng(seed)
    weights = {}
    for path, var in nnx.to_flat_state(nnx.state(unrolled, nnx.Param)):
        shape = var.get_value().shape
        if path[-1] == "scale":
            value = 1 + 0.3 * rng.standard_normal(shape)
        elif path[-1] == "bias":
            value = 0.3 * rng.standard_normal(shape)
        elif path[-1] == "embedding":
            value = rng.standard_normal(shape)
        else:  # a (fan_in, fan_out) kernel
            value = 1.5 * rng.standard_normal(shape) / math.sqrt(shape[0])
        weights[".".join(map(str, path))] = value.astype(np.float32)
    model = build_model(cfg)
    if cfg.scan_layers:
        weights = stack_layer_weights(weights, cfg.n_layers)
    nnx.update(
        model,
        nnx.from_flat_state(
            [
                (path, var.replace(jnp.asarray(weights[".".join(map(str, path))])))
                for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
            ]
        ),
    )
    return model


@nnx.jit
def _forward(model: nnx.Module, idx: jnp.ndarray) -> jnp.ndarray:
    return model(idx)


def generate(
    model: nnx.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eot_id: int | None = None,
    stats: GenerationStats | None = None,
    tok: object = None,
    **kw,
) -> list[list[int]]:
    """Each prompt's new tokens drawn by the engine (one row each; a stop token not included), slide by default."""
    engine = Engine(model, tok, rows=len(prompts))
    params = SamplingParams(
        max_tokens=max_new_tokens,
        stop_ids=frozenset() if eot_id is None else frozenset({eot_id}),
        **{"temperature": 0.0, "on_full": "slide", **kw},
    )
    done = engine.generate(prompts, params)
    if stats is not None:
        stats.__dict__.update(engine.stats.__dict__)
    return [[t for t in r.sampled if t != eot_id] for r in done]


def full_logits(model: nnx.Module, ids: list[int]) -> np.ndarray:
    """(len(ids), V) logits of the model's own forward pass (padded to the context length, so
    one program serves every length: the model is causal, the padding cannot leak back)."""
    window = np.zeros((1, model.cfg.context_length), np.int32)
    window[0, : len(ids)] = ids
    return np.asarray(_forward(model, jnp.asarray(window))[0, : len(ids)])


# ----------------------------------------------------------------------------- cache = full forward


# Every modern option on (model.json, layers.py): rotary positions of cached and new tokens included.
MODERN = dict(
    positions="rotary",
    rope_base=100.0,
    norm="rmsnorm",
    embed_norm=True,
    qk_norm=True,
    mlp="relu2",
    logit_softcap=5.0,
    tie_embeddings=False,
    bias=False,
    qkv_bias=False,
)
# The 2026 options (grouped-query attention, a short window on the first layer, value embeddings on the
# last, embedding and U-net skips): a decode step attends within its window to K heads of cache.
NEW_2026 = dict(n_kv_heads=2, window_pattern="SL", short_window=5, value_embeds=True, embed_skips=True, unet_skips=True)
LAYOUTS = {
    "tied": {},
    "untied-nobias": {"tie_embeddings": False, "qkv_bias": False},
    "scan-layers": {"scan_layers": True},
    "scan-remat": {"scan_layers": True, "remat": True},
    "bfloat16": {"compute_dtype": "bfloat16"},
    "bfloat16-scan": {"compute_dtype": "bfloat16", "scan_layers": True},
    "bfloat16-untied": {"compute_dtype": "bfloat16", "tie_embeddings": False},
    "modern": MODERN,
    "modern-scan-remat": {**MODERN, "scan_layers": True, "remat": True},
    "modern-bfloat16-no-scale": {**MODERN, "compute_dtype": "bfloat16", "norm_scale": False},
    "2026": {**MODERN, **NEW_2026},
    "2026-scan-remat": {**MODERN, **NEW_2026, "scan_layers": True, "remat": True},
    "2026-bfloat16": {**MODERN, **NEW_2026, "compute_dtype": "bfloat16"},
    "bfloat16-dense": {"compute_dtype": "bfloat16", "dense_dtype": "compute"},
    "2026-bfloat16-dense": {**MODERN, **NEW_2026, "compute_dtype": "bfloat16", "dense_dtype": "compute"},
    "2026-gqa-1-windows": {**MODERN, "n_kv_heads": 1, "window_pattern": "S", "short_window": 3},
}


# Batch 1 and 3: on the CPU the decoder keeps its weights in another form for one row (ops.for_decoding).
@pytest.mark.parametrize("rows", [1, pytest.param(3, marks=SLOW)])
@pytest.mark.parametrize("kw", cases(LAYOUTS, fast={"bfloat16", "2026", "bfloat16-dense"}))
def test_cached_logits_match_full_forward_at_every_position(kw: dict, rows: int) -> None:
    model = tiny(1, **kw)
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, V, CTX).tolist() for _ in range(rows)]
    prompt_lens = [1, 5, 9][-rows:]  # different lengths in one batch
    ref = [full_logits(model, s) for s in seqs]
    dec = g.KVDecoder(model, rows)
    assert g.decoding_model(model, rows).ops.dense_dtype == model.ops.dense_dtype  # the decoder keeps them
    got = dec.prefill([s[:n] for s, n in zip(seqs, prompt_lens)])
    diffs = {(b, n - 1): np.abs(got[b] - ref[b][n - 1]).max() for b, n in enumerate(prompt_lens)}
    while (dec.lengths < CTX).any():  # feed each row its next true token at its own position
        pos = dec.lengths.copy()
        advance = pos < CTX
        got = dec.step([s[min(p, CTX - 1)] for s, p in zip(seqs, pos)], advance=advance)
        diffs.update({(b, int(pos[b])): np.abs(got[b] - ref[b][pos[b]]).max() for b in np.flatnonzero(advance)})
    assert sorted(diffs) == [(b, p) for b, n in enumerate(prompt_lens) for p in range(n - 1, CTX)]
    tol = tolerance(np.stack(ref), model.cfg.compute_dtype, model.cfg.dense_dtype)
    assert max(diffs.values()) <= tol, (max(diffs.values()), tol)
    assert max(np.abs(r).max() for r in ref) > 3


def _einsum_in_another_order(spec: str, a: jax.Array, b: jax.Array, dtype, product=None) -> jax.Array:
    """jaxgpt.ops.neutral.mixed_einsum's forward as another CPU's bfloat16 dot may sum it: the same bfloat16
    operands, their products summed in reverse order along the contracted axes."""
    (sa, sb), out = spec.replace(" ", "").split("->")[0].split(","), spec.split("->")[1].strip()
    contracted = [c for c in sa if c in sb and c not in out]
    a, b = (t.astype(dtype).astype(jnp.float32) for t in (a, b))
    a, b = jnp.flip(a, [sa.index(c) for c in contracted]), jnp.flip(b, [sb.index(c) for c in contracted])
    return jnp.einsum(spec, a, b, precision="highest")


BF16_LAYOUTS = {k: v for k, v in LAYOUTS.items() if v.get("compute_dtype") == "bfloat16"}


@CPU_ONLY
@pytest.mark.parametrize("kw", cases(BF16_LAYOUTS, fast=list(BF16_LAYOUTS)[:1]))
def test_bfloat16_tolerance_holds_against_a_full_forward_summed_in_another_order(
    kw: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU this runs on sums a bfloat16 dot in one order; a CPU with native bfloat16 dots
    (AVX512_BF16, AMX) in another. With the full forward's products summed in reverse, over five
    models, the cached logits stay within `tolerance` of it: the bound holds for any order."""
    diffs, moved = [], []
    for seed in range(1, 6):
        model = tiny(seed, **kw)
        seq = np.random.default_rng(seed + 100).integers(0, V, CTX).tolist()
        ref = full_logits(model, seq)
        with monkeypatch.context() as m:
            m.setattr(neutral, "mixed_einsum", _einsum_in_another_order)
            other = np.asarray(nnx.jit(lambda mod, idx: mod(idx))(model, jnp.asarray([seq], jnp.int32))[0])
        dec = g.KVDecoder(model, 1)
        got = [dec.prefill([seq[:2]])[0]] + [dec.step([t])[0] for t in seq[2:]]
        diffs.append((max(np.abs(a - b).max() for a, b in zip(got, other[1:])), tolerance(other, "bfloat16")))
        moved.append(np.abs(other - ref).max())
    assert all(d <= tol for d, tol in diffs), diffs
    assert max(moved) > 0  # the other order really is another program


def test_slide_reprefills_the_last_half_and_matches_the_model_on_that_window() -> None:
    model = tiny(3)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, V, 5).tolist()
    new = generate(model, [prompt], max_new_tokens=3 * CTX)[0]
    assert len(new) == 3 * CTX  # slides past the context instead of stopping or failing
    # Reference with the same policy, the full forward pass for every token.
    ids, start, keep = list(prompt), 0, CTX // 2
    for _ in range(3 * CTX):
        ids.append(int(full_logits(model, ids[start:])[-1].argmax()))
        if len(ids) - start > CTX:
            start = len(ids) - keep
    assert prompt + new == ids


def test_stop_mode_ends_at_the_context_length() -> None:
    model = tiny(3)
    stats = GenerationStats()
    out = generate(model, [[1, 2, 3], [4] * CTX], max_new_tokens=100, on_full="stop", stats=stats)
    assert len(out[0]) == CTX - 3 and out[1] == []  # a full prompt leaves no room
    assert stats.prefills == 1 and stats.new_tokens == CTX - 3


def test_batched_greedy_equals_one_prompt_at_a_time_and_decode_compiles_once() -> None:
    model = tiny(5)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8], [9, 10, 11]]
    before = dict(g.TRACES)
    stats = GenerationStats()
    batched = generate(model, prompts, max_new_tokens=2 * CTX, stats=stats)
    assert [len(b) for b in batched] == [2 * CTX] * 3
    assert g.TRACES["step"] - before.get("step", 0) <= 1  # one compile for B=3, however many tokens
    assert stats.steps > CTX and stats.prefills >= 3  # slides happened, rows at different times
    for prompt, got in zip(prompts, batched):
        assert generate(model, [prompt], max_new_tokens=2 * CTX)[0] == got


def test_end_of_text_stops_a_row_and_is_not_returned() -> None:
    model = tiny(6)
    first = generate(model, [[1, 2], [3]], max_new_tokens=6)
    eot = first[0][2]  # make row 0's third new token the end-of-text id

    def cut(seq: list[int]) -> list[int]:
        return seq[: seq.index(eot)] if eot in seq else seq

    out = generate(model, [[1, 2], [3]], max_new_tokens=6, eot_id=eot)
    assert out == [cut(first[0]), cut(first[1])] and len(out[0]) <= 2


def test_only_the_tokenizers_ids_are_drawn_from_a_padded_vocabulary() -> None:
    model = tiny(7, vocab_size=320)  # the bytes tokenizer's 257 ids, padded
    kw = dict(max_new_tokens=60, temperature=2.0, seed=1)
    assert max(generate(model, [[1]], **kw)[0]) >= 257  # without a tokenizer every id of the model is drawn
    assert max(generate(model, [[1]], tok=get_tokenizer("bytes"), **kw)[0]) < 257


def test_a_to_a_models_decode_too() -> None:
    model = build_model(ModelConfig(architecture="a-to-a", vocab_size=V, context_length=CTX, emb_dim=C))
    out = generate(model, [[3, 4]], max_new_tokens=4)[0]
    want = [4]
    for _ in range(4):  # no context: each token follows from the previous one alone
        want.append(int(full_logits(model, [want[-1]])[-1].argmax()))
    assert out == want[1:]


# ----------------------------------------------------------------------------- sampling


def test_same_seed_same_text_other_seed_other_text() -> None:
    model = tiny(8)
    kw = dict(max_new_tokens=24, temperature=1.0, top_k=20, top_p=0.9)
    a = generate(model, [[1, 2], [3]], seed=11, **kw)
    assert generate(model, [[1, 2], [3]], seed=11, **kw) == a
    assert generate(model, [[1, 2], [3]], seed=12, **kw) != a


# ----------------------------------------------------------------------------- the command line


def test_generation_cli_batches_prompts_and_reports_speed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from jaxgpt.checkpoints import store as ckpt

    model = tiny(9, vocab_size=257, context_length=32)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    ckpt.save_weights(model, folder / ckpt.WEIGHTS)
    (folder / "model.json").write_text(json.dumps(to_dict(model.cfg)))
    (folder / "train.json").write_text(json.dumps({"tokenizer": "bytes"}))
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    args = [
        str(folder),
        "--prompt",
        "ab",
        "--prompt",
        "xyz",
        "--max-new-tokens",
        "40",
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--top-p",
        "0.95",
        "--seed",
        "3",
    ]
    assert test_generation.main(args) == 0
    first = capsys.readouterr().out
    assert "\nab" in first and "\nxyz" in first and "tok/s" in first
    assert test_generation.main(args) == 0
    second = capsys.readouterr().out
    assert first.split("[")[0] == second.split("[")[0]  # same seed, same text (timings aside)
    with pytest.raises(SystemExit):
        test_generation.main([str(folder), "--top-p", "0"])
    assert test_generation.main([str(tmp_path / "missing")]) == 2


@CPU_ONLY
@pytest.mark.parametrize("rows", [1, pytest.param(3, marks=SLOW)])
def test_bfloat16_decoding_without_the_native_kernel_is_xlas_and_as_exact(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where cpu_matvec cannot be built (no compiler), a bfloat16 decoder runs XLA's kernels:
    float32 (out, in) kernels holding bfloat16 values for one row, bfloat16 ones for several, the
    full forward's logits within bfloat16's rounding (`tolerance`)."""
    monkeypatch.setattr(cpu_matvec, "_state", {"reason": "no C++ compiler found (a test)"})
    model = tiny(1, compute_dtype="bfloat16")
    ops = model.ops.for_decoding(rows)
    assert not ops.native_matvec and ops.weight_dtype == ("float32" if rows == 1 else "bfloat16")
    seq = np.random.default_rng(3).integers(0, V, CTX).tolist()
    ref = full_logits(model, seq)
    dec = g.KVDecoder(model, rows)
    got = [dec.prefill([seq[:2]] * rows)[0]] + [dec.step([t] * rows)[0] for t in seq[2:]]
    diff, tol = max(np.abs(a - b).max() for a, b in zip(got, ref[1:])), tolerance(ref, "bfloat16")
    assert diff <= tol, (diff, tol)
    assert "custom_call_target" not in dec._compiled("step", CTX).as_text()


def test_short_prompts_prefill_16_32_or_64_tokens_longer_ones_a_multiple_of_64() -> None:
    lengths = [1, 16, 17, 33, 64, 65, 129, 1000, 1024]
    assert [g.prefill_length(n, 1024) for n in lengths] == [16, 16, 32, 64, 64, 128, 192, 1024, 1024]
    assert g.prefill_length(12, 8) == 8 and g.prefill_length(100, 300, bucket=128) == 128  # at most the context


def test_bench_runs_and_both_paths_agree() -> None:
    small = ModelConfig(
        architecture="gpt2",
        vocab_size=V,
        context_length=CTX,
        emb_dim=C,
        n_heads=H,
        n_layers=L,
        qkv_bias=True,
        tie_embeddings=True,
    )
    r = decode.bench_generate(new_tokens=6, prompt_tokens=3, batch_size=2, cfg=small, log=lambda *_: None)
    assert r["same_greedy_tokens"] == 1.0 and r["cached_tok_s"] > 0 and r["full_tok_s"] > 0


def test_attention_spans_grow_with_the_rows_and_stay_exact() -> None:
    model = tiny(10, context_length=300)
    ids = np.random.default_rng(11).integers(0, V, 300).tolist()
    ref = full_logits(model, ids)
    dec = g.KVDecoder(model, 1)
    diffs = [np.abs(dec.prefill([ids[:100]])[0] - ref[99]).max()]
    for pos in range(100, 300):  # crosses the 128 and 256 span boundaries, ends at the context
        diffs.append(np.abs(dec.step([ids[pos]])[0] - ref[pos]).max())
    assert sorted(size for kind, size in dec._programs if kind == "step") == [128, 256, 300] and max(diffs) <= TOL, max(
        diffs
    )


def test_scan_layers_models_decode_with_the_unrolled_models_logits_and_prefill_through_their_scan() -> None:
    """The same logits either layout; and the model's own prefill (the decoder's off the CPU; on it the
    decoder prefills through its unrolled copy: above) walks a scanned model's blocks through its scan."""
    unrolled, scanned = tiny(12), tiny(12, scan_layers=True)  # the same weights, two layouts
    prompts = [[1, 2, 3], [4, 5]]
    logits = []
    for model in (unrolled, scanned):
        dec = g.KVDecoder(model, 2)
        logits.append([dec.prefill(prompts), dec.step([6, 7])])
    np.testing.assert_allclose(np.stack(logits[0]), np.stack(logits[1]), atol=TOL, rtol=0)
    graphdef, state = nnx.split(scanned)
    cache = g.KVCache.zeros(scanned.cfg, 2)
    ids = jnp.zeros((2, 3), jnp.int32)
    jaxpr = str(jax.make_jaxpr(g._prefill, static_argnums=0)(graphdef, state, cache.k, cache.v, ids, ids[:, 0]))
    per_block = 4 + 2 * H  # the dense layers and, per head (CPU attention), two products
    assert jaxpr.count("scan[") == 1 and jaxpr.count("dot_general") < per_block * L  # one block traced, not L


# ----------------------------------------------------------------------------- the decode step's program

# An HLO instruction: "%name = f32[32,96]{1,0} convert(%x), ..." -> (dtype, dims, opcode)
_HLO_OP = re.compile(r"^\s*(?:ROOT )?%[\w.-]+ = (\w+)\[([\d,]*)\](?:\{[^}]*\})? ([\w-]+)\(", re.M)
_COPYING = {"convert", "copy", "transpose", "slice", "dynamic-slice", "concatenate", "pad"}


def weight_copies(hlo: str, model: nnx.Module) -> list[str]:
    """The instructions of a compiled program that convert, copy or slice out something of a weight's
    shape (one layer's either way round, or a stacked one's; size-1 axes aside), and its loops."""
    shapes = set()
    for _path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = var.get_value().shape
        layer = shape[1:] if model.cfg.scan_layers else shape
        shapes |= {shape, layer, layer[::-1]} if len(layer) >= 2 else set()
    found = [
        f"{op} -> {dtype}[{dims}]"
        for dtype, dims, op in _HLO_OP.findall(hlo)
        if op in _COPYING and tuple(int(d) for d in dims.split(",") if d and d != "1") in shapes
    ]
    return found + ["while loop"] * len(re.findall(r"\) while\(", hlo))  # a loop's result is a tuple


def _original_step_hlo(model: nnx.Module, rows: int) -> str:
    """The step compiled over the model as it is (what decoding ran before decoding_model)."""
    graphdef, state = nnx.split(model)
    cache = g.KVCache.zeros(model.cfg, rows)
    ids = jnp.zeros((rows,), jnp.int32)
    leaves, treedef = jax.tree.flatten(state)
    return (
        jax.jit(g._step, static_argnums=(0, 1, 2))
        .lower(graphdef, treedef, CTX, leaves, cache.k, cache.v, ids, ids)
        .compile()
        .as_text()
    )


@CPU_ONLY
@pytest.mark.parametrize("rows", [1, pytest.param(3, marks=SLOW)])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"scan_layers": True},
        {"compute_dtype": "bfloat16"},
        {"compute_dtype": "bfloat16", "scan_layers": True, "remat": True},
        {"compute_dtype": "bfloat16", "tie_embeddings": False},
    ],
    ids=["float32", "float32-scan", "bfloat16", "bfloat16-scan-remat", "bfloat16-untied"],
)
def test_decode_step_program_casts_copies_and_slices_no_weight(kw: dict, rows: int) -> None:
    """The compiled step multiplies the decoder's weights as they are: no per-step float32 -> bfloat16
    convert (nor XLA's own bf16 -> f32 upcast) of a weight, no slice of a layer out of stacked weights."""
    model = tiny(13, **kw)
    dec = g.KVDecoder(model, rows)
    hlo = dec._compiled("step", CTX).as_text()
    assert weight_copies(hlo, model) == []
    # The dense layers' and the head's products (XLA dots, or cpu_matvec's kernel) and no more: attention
    # against the cache is ops.vecmat's fused product and sum on the CPU, and runs no YNNPACK reduction
    # (decode_compiler_options).
    ops = model.ops.for_decoding(rows)
    native = hlo.count(f'custom_call_target="{cpu_matvec.TARGET}"')
    assert (len(re.findall(r" dot\(", hlo)), native) == ((0, 4 * L + 1) if ops.native_matvec else (4 * L + 1, 0))
    assert not [line for line in hlo.splitlines() if re.search(r"%ynn_fusion[\w.]* = .*op_name=\"[^\"]*reduce", line)]
    kernels = [
        m.kernel.get_value()
        for _, m in nnx.iter_modules(nnx.merge(dec.step_graphdef, dec.step_state))
        if isinstance(m, nnx.Linear)
    ]
    assert len(kernels) == 4 * L + 1 and all(k.dtype == ops.weight_dtype for k in kernels)  # and the head
    if kw.get("compute_dtype") == "bfloat16":  # the weights hold bfloat16 values, in whatever storage
        assert all(np.array_equal(np.asarray(k), np.asarray(k.astype(jnp.bfloat16).astype(k.dtype))) for k in kernels)
        # The native kernel (it builds wherever the tests run: test_cpu_matvec), on bfloat16 (out, in) kernels.
        assert ops.native_matvec and ops.weight_dtype == "bfloat16" and ops.kernels_out_in
    else:
        assert not ops.native_matvec
    if not kw and rows > 1:  # float32 kernels for several rows: nothing to change, nothing copied
        originals = {id(m.kernel.get_value()) for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Linear)}
        assert sum(id(k) in originals for k in kernels) == 4 * L
    # The check sees what it must: the step over the model as it is converts or slices its weights.
    if kw.get("compute_dtype") == "bfloat16" or kw.get("scan_layers"):
        assert weight_copies(_original_step_hlo(model, rows), model) != []


@CPU_ONLY
@pytest.mark.parametrize("rows", [1, pytest.param(3, marks=SLOW)])
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=SLOW), "bfloat16"])
def test_cpu_prefills_run_the_decoding_copy_and_copy_no_weight(dtype: str, rows: int) -> None:
    """On the CPU a prefill runs the decode steps' copy of the weights: a scanned model's prefill slices
    no layer out of its stacked weights, a bfloat16 one converts none, and a bfloat16 one-row prompt's 16
    rows go through the native kernel, three rows' 48 through XLA's dots (the head takes only each row's
    last token: native either way). Their logits: the cached tests above."""
    model = tiny(14, compute_dtype=dtype, scan_layers=True)
    dec = g.KVDecoder(model, rows)
    assert dec.state is dec.step_state
    P = g.prefill_length(CTX, CTX)
    ids = jnp.zeros((rows, P), jnp.int32)
    hlo = g._prefill_jit.lower(dec.graphdef, dec.state, *dec._cache, ids, ids[:, 0]).compile().as_text()
    assert weight_copies(hlo, model) == []
    native = hlo.count(f'custom_call_target="{cpu_matvec.TARGET}"')
    attention = 2 * H * L  # per head (CPU attention), two products
    if dtype == "float32":
        assert (native, len(re.findall(r" dot\(", hlo))) == (0, attention + 4 * L + 1)
    else:
        assert (native, len(re.findall(r" dot\(", hlo))) == (
            (4 * L + 1, attention) if rows * P <= cpu_matvec.MAX_ROWS else (1, attention + 4 * L)
        )
    # The check sees what it must: the model's own prefill slices (and casts) its weights.
    graphdef, state = nnx.split(model)
    own = g._prefill_jit.lower(graphdef, state, *dec._cache, ids, ids[:, 0]).compile().as_text()
    assert weight_copies(own, model) != []


@CPU_ONLY
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="float32", marks=SLOW),
        pytest.param({"compute_dtype": "bfloat16", "scan_layers": True}, id="bfloat16-scan"),
    ],
)
def test_2026_decode_step_holds_k_heads_of_cache_and_copies_no_weight(kw: dict) -> None:
    """Grouped-query attention's cache holds the K key/value heads only; the step runs the 5 dense layers
    of a grouped block (q, kv, proj, fc, out) and the head on the decoder's weights as they are, and
    looks up its value embeddings without slicing a table out of the stacked ones."""
    model = tiny(15, **MODERN, **NEW_2026, **kw)
    dec = g.KVDecoder(model, 3)  # 3 rows: the gate's (3, 12) slice of the activations is no weight's shape
    assert dec._cache[0].shape == (L, 3, 2, C // H, CTX) and dec._cache[1].shape == (L, 3, 2, CTX, C // H)
    hlo = dec._compiled("step", CTX).as_text()
    assert weight_copies(hlo, model) == []
    ops = model.ops.for_decoding(3)
    native = hlo.count(f'custom_call_target="{cpu_matvec.TARGET}"')
    assert (len(re.findall(r" dot\(", hlo)), native) == ((0, 5 * L + 1) if ops.native_matvec else (5 * L + 1, 0))


def test_generate_holds_no_copy_of_the_model() -> None:
    """Decoding calls the model's own forward pass: the generation package names none of a block's parts."""
    source = "".join(p.read_text() for p in (ROOT / "jaxgpt" / "generation").glob("*.py"))
    assert "cached_features" in source
    for part in ("ln1", "ln2", ".qkv", ".proj", ".mlp", "pos_emb", "blocks", "ln_f"):
        assert part not in source, part


def test_a_compute_dtype_cache_decodes_as_a_float32_one() -> None:
    """On an accelerator the KV cache holds the compute dtype (ops.kv_dtype: half the memory in bfloat16):
    the attention products round keys and values to it anyway, so the logits are the float32 cache's,
    bit for bit (the neutral operations on this CPU stand for a TPU's; the CPU's own keep float32). On an
    accelerator XLA may skip that rounding (xla_allow_excess_precision): there, within bfloat16's precision."""
    source = tiny(21, compute_dtype="bfloat16")
    ops = neutral.Ops("cpu", "bfloat16", "xla")
    logits = {}
    for cache in ("bfloat16", "float32"):
        model = build_model(source.cfg, ops=dataclasses.replace(ops, cache_dtype=cache))
        nnx.update(model, nnx.state(source, nnx.Param))
        dec = g.KVDecoder(model, 2)
        assert dec._cache[0].dtype == jnp.dtype(cache)
        out = [dec.prefill([[1, 2, 3], [4, 5]])]
        for t in range(4):
            out.append(dec.step([6 + t, 7 + t]))
        logits[cache] = np.stack(out)
    if ON_ACCELERATOR:  # XLA there may keep a float32 key unrounded (xla_allow_excess_precision): bfloat16's precision
        scale = np.abs(logits["float32"]).max()
        np.testing.assert_allclose(logits["bfloat16"], logits["float32"], rtol=0, atol=2**-6 * scale)
    else:
        np.testing.assert_array_equal(logits["bfloat16"], logits["float32"])
    assert ops.kv_dtype() == "bfloat16" and select(source.cfg, "cpu").kv_dtype() == "float32"
