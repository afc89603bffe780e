"""convert_hf.py / jaxgpt/interop/nanochat_hf.py: a tiny modern-recipe model exported as transformers'
`nanochat` model type, checked against a plain-numpy NanoChatForCausalLM forward pass written here
from transformers' modeling_nanochat.py (reading only the exported config.json and model.safetensors);
refusals in one line; export -> import bit for bit; the tokenizer files; and, where transformers is
installed (the dev group; no torch), AutoConfig and AutoTokenizer on the exported folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, SLOW
from safetensors.numpy import load_file, save_file

import convert_hf
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ModelConfig, TrainConfig, to_dict
from jaxgpt.data.tokenizer import EOT_TEXT, TrainedTokenizer, get_tokenizer
from jaxgpt.interop.nanochat_hf import ConversionError, export_run, import_run
from jaxgpt.model.gpt import abstract_model, build_model

# float32 against float64: each logit is ~60 float32 operations deep (2 blocks of norms, matmuls of
# width <= 128, a softmax) on values of size <= ~30, so round-off stays near 30 * 60 * 2^-24 ~ 1e-4 at
# the very worst and ~1e-5 in practice; a mapping error (a head, a sign, a transpose) moves logits by ~1.
TOL = 1e-4
MODERN = {
    "architecture": "gpt2",
    "vocab_size": 300,
    "context_length": 24,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "bias": False,
    "positions": "rotary",
    "norm": "rmsnorm",
    "norm_scale": False,
    "embed_norm": True,
    "qk_norm": True,
    "mlp": "relu2",
    "zero_init_proj": True,
    "logit_softcap": 15.0,
}
CASES = {
    "modern": {},
    "gqa-tied-gelu-uncapped-scanned": {
        "n_kv_heads": 2,
        "tie_embeddings": True,
        "mlp": "gelu",
        "logit_softcap": None,
        "rope_base": 500.0,
        "scan_layers": True,
    },
}
SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
PROMPT = "Every effort moves you"


# ----------------------------------------------------------------------------- helpers


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Our parameters (per-layer keys, as checkpoints hold them) far from any init: N(0, 1) embeddings,
    kernels of 1.5 / sqrt(fan-in), a head that drives the logits past the soft-cap."""
    from flax import nnx

    rng = np.random.default_rng(seed)
    flat = nnx.to_flat_state(nnx.state(abstract_model(dataclasses.replace(cfg, scan_layers=False)), nnx.Param))
    out = {}
    for path, var in flat:
        key, shape = ".".join(map(str, path)), tuple(var.get_value().shape)
        scale = 1.0 if key == "tok_emb.embedding" else 2.0 if key == "head.kernel" else 1.5 / math.sqrt(shape[0])
        out[key] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def checkpoint(folder: Path, tokenizer: str = "bytes", seed: int = 0, **kw) -> tuple[Path, ModelConfig]:
    """A checkpoint folder as training leaves one (weights, model.json, train.json, meta.json)."""
    cfg = ModelConfig(**{**MODERN, **kw})
    folder.mkdir(parents=True)
    save_file(random_weights(cfg, seed), str(folder / ckpt.WEIGHTS))
    (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
    train = TrainConfig(microbatch_size=2, train_steps=10, tokenizer=tokenizer)
    (folder / "train.json").write_text(json.dumps(to_dict(train)))
    (folder / ckpt.META).write_text(json.dumps({"step": 7}))
    return folder, cfg


def nanochat_forward(folder: Path, idx: np.ndarray, *, llama_rotary: bool = False) -> np.ndarray:
    """NanoChatForCausalLM in float64 numpy, from the folder's config.json and model.safetensors:
    embedding -> norm -> blocks (norm, q/k/v, rotary, q/k norm, causal grouped attention, o_proj,
    residual; norm, fc1, act, fc2, residual) -> norm -> lm_head -> softcap. (B, T) -> (B, T, V).
    `llama_rotary`: Llama's rotate_half, cat(-x2, x1), in place of NanoChat's cat(x2, -x1)."""
    hf = json.loads((folder / "config.json").read_text())
    sd = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    H, K, C, L = hf["num_attention_heads"], hf["num_key_value_heads"], hf["hidden_size"], hf["num_hidden_layers"]
    D, eps, (B, T) = C // H, hf["rms_norm_eps"], idx.shape
    act = {
        "relu2": lambda x: np.maximum(x, 0.0) ** 2,
        "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    }[hf["hidden_act"]]

    def norm(x: np.ndarray) -> np.ndarray:  # NanoChatRMSNorm: no weight
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)

    def linear(x: np.ndarray, name: str) -> np.ndarray:  # nn.Linear(bias=False): x @ W.T
        return x @ sd[name].T

    inv_freq = 1.0 / hf["rope_parameters"]["rope_theta"] ** (np.arange(0, D, 2) / D)  # (D/2,)
    angles = np.concatenate([np.arange(T)[:, None] * inv_freq] * 2, -1)  # (T, D): cat(freqs, freqs)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]  # (T, 1, D), broadcast over heads

    def rotary(x: np.ndarray) -> np.ndarray:  # (B, T, heads, D): x * cos + rotate_half(x) * sin
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        half = np.concatenate([-x2, x1] if llama_rotary else [x2, -x1], -1)
        return x * cos + half * sin

    h = norm(sd["model.embed_tokens.weight"][idx])  # the norm before the layers
    for i in range(L):
        p = f"model.layers.{i}."
        x = norm(h)
        q = norm(rotary(linear(x, p + "self_attn.q_proj.weight").reshape(B, T, H, D)))  # rotary, then q_norm
        k = norm(rotary(linear(x, p + "self_attn.k_proj.weight").reshape(B, T, K, D)))
        v = linear(x, p + "self_attn.v_proj.weight").reshape(B, T, K, D)
        k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)  # repeat_kv
        att = np.einsum("bthd,bshd->bhts", q, k) * D**-0.5
        att = np.where(np.tril(np.ones((T, T), bool)), att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        h = h + linear(np.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C), p + "self_attn.o_proj.weight")
        h = h + linear(act(linear(norm(h), p + "mlp.fc1.weight")), p + "mlp.fc2.weight")
    logits = norm(h) @ sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).T
    cap = hf["final_logit_softcapping"]
    return logits if cap is None else np.tanh(logits / cap) * cap


def our_logits(folder: Path, cfg: ModelConfig, idx: np.ndarray) -> np.ndarray:
    model = build_model(cfg)
    ckpt.load_weights(model, folder / ckpt.WEIGHTS)
    return np.asarray(model(idx.astype(np.int32)))


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="transformers is not installed (uv sync --group dev)")


# ----------------------------------------------------------------------------- export = NanoChat


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_logits_equal_a_numpy_nanochat_forward(tmp_path: Path, case: dict) -> None:
    folder, cfg = checkpoint(tmp_path / "ckpt", **case)
    out = export_run(folder, tmp_path / "out")
    idx = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, cfg.context_length))
    ref = nanochat_forward(out, idx)
    got = our_logits(folder, cfg, idx)
    assert got.dtype == np.float32 and got.shape == ref.shape == (2, 24, 300)
    assert np.abs(got - ref).max() <= TOL, np.abs(got - ref).max()
    assert np.abs(ref).max() > 5  # not two near-zero tensors
    # The rotary's direction matters: read with Llama's rotate_half, the same file computes something else.
    assert np.abs(nanochat_forward(out, idx, llama_rotary=True) - ref).max() > 1e-2


def test_config_json_maps_every_model_json_field(tmp_path: Path) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt", **CASES["gqa-tied-gelu-uncapped-scanned"])
    hf = json.loads((export_run(folder, tmp_path / "out") / "config.json").read_text())
    assert hf == {
        "architectures": ["NanoChatForCausalLM"],
        "model_type": "nanochat",
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        "final_logit_softcapping": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": 256,
        "eos_token_id": 256,
        "pad_token_id": 256,
        "dtype": "float32",
        "torch_dtype": "float32",
    }
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text()) == {
        "bos_token_id": 256,
        "eos_token_id": 256,
        "pad_token_id": 256,
    }


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_tensor_names_shapes_and_dtypes(tmp_path: Path, case: dict) -> None:
    folder, cfg = checkpoint(tmp_path / "ckpt", **case)
    hf = load_file(str(export_run(folder, tmp_path / "out") / "model.safetensors"))
    C, V, KD = 32, 300, cfg.kv_heads * cfg.head_dim
    want = {"model.embed_tokens.weight": (V, C)} | ({} if cfg.tie_embeddings else {"lm_head.weight": (V, C)})
    for i in range(2):
        p = f"model.layers.{i}."
        want |= {
            p + "self_attn.q_proj.weight": (C, C),
            p + "self_attn.k_proj.weight": (KD, C),
            p + "self_attn.v_proj.weight": (KD, C),
            p + "self_attn.o_proj.weight": (C, C),
            p + "mlp.fc1.weight": (4 * C, C),
            p + "mlp.fc2.weight": (C, 4 * C),
        }
    assert {k: v.shape for k, v in hf.items()} == want
    assert all(v.dtype == np.float32 for v in hf.values())
    ours = load_file(str(folder / ckpt.WEIGHTS))  # a torch Linear weight is (out, in): our kernel transposed
    assert np.array_equal(hf["model.layers.1.mlp.fc1.weight"], ours["blocks.1.mlp.fc.kernel"].T)
    v = ours["blocks.0.attn.qkv.kernel"][:, 2 * C :] if KD == C else ours["blocks.0.attn.kv.kernel"][:, KD:]
    assert np.array_equal(hf["model.layers.0.self_attn.v_proj.weight"], v.T)


# ----------------------------------------------------------------------------- refusals


REFUSED = {  # model.json change -> the key and value the one-line error names
    "a-to-a": ({"architecture": "a-to-a", "n_layers": 0}, "architecture='a-to-a'"),
    "bias": ({"bias": True}, "bias=True"),
    "qkv_bias": ({"bias": True, "qkv_bias": True}, "qkv_bias=True"),
    "learned": ({"positions": "learned"}, "positions='learned'"),
    "layernorm": ({"norm": "layernorm"}, "norm='layernorm'"),
    "norm_scale": ({"norm_scale": True}, "norm_scale=True"),
    "embed_norm": ({"embed_norm": False}, "embed_norm=False"),
    "qk_norm": ({"qk_norm": False}, "qk_norm=False"),
    "value_embeds": ({"value_embeds": True}, "value_embeds=True"),
    "embed_skips": ({"embed_skips": True}, "embed_skips=True"),
    "unet_skips": ({"unet_skips": True}, "unet_skips=True"),
    "window_pattern": ({"window_pattern": "SL"}, "window_pattern='SL'"),
}


@pytest.mark.parametrize("change, named", list(REFUSED.values()), ids=list(REFUSED))
def test_export_refuses_each_option_nanochat_lacks_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, change: dict, named: str
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({**MODERN, **change}))  # no weights: refused before reading them
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    assert convert_hf.main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and f"model.json {named} (" in err, err
    assert "no NanoChat counterpart" in err and str(folder) in err and not (tmp_path / "out").exists()


def test_export_refusal_names_every_blocking_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The 2026 recipe's model.json (runs/shakespeare-char-2026's): value embeddings, U-net skips and
    short windows each lack a NanoChat form, and the one line names all three."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shipped = json.loads(
        (Path(convert_hf.__file__).parent / "runs" / "shakespeare-char-2026" / "model.json").read_text()
    )
    (folder / "model.json").write_text(json.dumps(shipped))
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    assert convert_hf.main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "have no NanoChat counterpart" in err, err
    for named in ("value_embeds=True (", "unet_skips=True (", "window_pattern='SSSL' ("):
        assert named in err, err


def test_an_all_long_window_pattern_and_the_run_only_options_export(tmp_path: Path) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt", window_pattern="L", drop_rate=0.1, remat=True, loss_chunk=8)
    assert (export_run(folder, tmp_path / "out") / "config.json").is_file()


def test_export_keeps_an_existing_folder_unless_forced(tmp_path: Path) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt")
    export_run(folder, tmp_path / "out")
    with pytest.raises(ConversionError, match=r"config.json: already exists; pass --force"):
        export_run(folder, tmp_path / "out")
    export_run(folder, tmp_path / "out", force=True)


def test_chat_template_goes_into_tokenizer_config(tmp_path: Path) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = export_run(folder, tmp_path / "out", chat_template=template)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == template
    out = export_run(folder, tmp_path / "plain")
    assert "chat_template" not in json.loads((out / "tokenizer_config.json").read_text())


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_export_import_round_trip_is_bit_exact(tmp_path: Path, case: dict) -> None:
    folder, cfg = checkpoint(tmp_path / "ckpt", **case)
    export_run(folder, tmp_path / "out")
    assert convert_hf.main(["import", str(tmp_path / "out"), str(tmp_path / "run")]) == 0
    ours = load_file(str(folder / ckpt.WEIGHTS))
    back = load_file(str(tmp_path / "run" / "pretrained" / "model.safetensors"))
    assert sorted(ours) == sorted(back)
    assert all(ours[k].dtype == back[k].dtype and ours[k].tobytes() == back[k].tobytes() for k in ours)
    # Every key that decides what the model computes comes back; the rest only say how it runs or starts.
    how = {"drop_rate", "compute_dtype", "attention", "remat", "scan_layers", "loss_chunk", "zero_init_proj"}
    want = {k: v for k, v in to_dict(cfg).items() if k not in how}
    got = json.loads((tmp_path / "run" / "model.json").read_text())
    assert {k: v for k, v in got.items() if k not in how} == want
    assert json.loads((tmp_path / "run" / "pretrained" / "model.json").read_text()) == got
    train = json.loads((tmp_path / "run" / "train.json").read_text())
    assert train["init_from"] == "pretrained" and train["tokenizer"] == "bytes"
    assert ckpt.read_meta(tmp_path / "run" / "pretrained")["weights_only"] is True


@SLOW  # a second model built and compiled
def test_an_imported_run_computes_the_exported_model(tmp_path: Path) -> None:
    folder, cfg = checkpoint(tmp_path / "ckpt", n_kv_heads=1)
    import_run(export_run(folder, tmp_path / "out"), tmp_path / "run")
    model, got_cfg, tok, path = ckpt.load_model(tmp_path / "run")  # the run dir resolves to pretrained/
    idx = np.random.default_rng(3).integers(0, 300, size=(1, 24))
    assert path.name == "pretrained" and tok.name == "bytes" and got_cfg.kv_heads == 1
    assert np.array_equal(np.asarray(model(idx.astype(np.int32))), our_logits(folder, cfg, idx))


BAD_CONFIG = {  # config.json change -> what the one-line error names
    "model_type": ({"model_type": "llama"}, "model_type='llama'"),
    "hidden_act": ({"hidden_act": "silu"}, "hidden_act='silu'"),
    "rms_norm_eps": ({"rms_norm_eps": 1e-5}, "rms_norm_eps=1e-05"),
    "attention_bias": ({"attention_bias": True}, "attention_bias=True"),
    "intermediate_size": ({"intermediate_size": 100}, "intermediate_size=100"),
    "head_dim": ({"head_dim": 16}, "head_dim=16"),
    "rope_type": ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters="),
    "heads": ({"num_attention_heads": 5}, "hidden_size=32 does not divide by num_attention_heads=5"),
}


@pytest.mark.parametrize("change, named", list(BAD_CONFIG.values()), ids=list(BAD_CONFIG))
def test_import_refuses_a_config_value_it_cannot_compute_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, change: dict, named: str
) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt")
    out = export_run(folder, tmp_path / "out")
    (out / "config.json").write_text(json.dumps({**json.loads((out / "config.json").read_text()), **change}))
    assert convert_hf.main(["import", str(out), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'config.json'}: {named}" in err, err
    assert not (tmp_path / "run").exists()


def test_import_refuses_missing_tensors_and_an_occupied_run(tmp_path: Path) -> None:
    folder, _ = checkpoint(tmp_path / "ckpt")
    out = export_run(folder, tmp_path / "out")
    import_run(out, tmp_path / "run")
    with pytest.raises(ConversionError, match=r"model.json: already exists"):
        import_run(out, tmp_path / "run")
    sd = load_file(str(out / "model.safetensors"))
    del sd["model.layers.1.mlp.fc2.weight"]
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"missing \['model.layers.1.mlp.fc2.weight'\]"):
        import_run(out, tmp_path / "run2")


def nanochat_style_tokenizer() -> str:
    """A byte-level BPE with karpathy/nanochat's special tokens: <|bos|> begins documents, no <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([PROMPT, "the effort of every move", "you move the world"] * 20, trainer)
    return tok.to_str()


def test_import_of_nanochats_format_bfloat16_and_bos_as_end_of_text(tmp_path: Path) -> None:
    import ml_dtypes

    folder, _ = checkpoint(tmp_path / "ckpt")
    out = export_run(folder, tmp_path / "nanochat-d0")
    sd = {k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(str(out / "model.safetensors")).items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})  # nanochat's checkpoints: bfloat16
    (out / "tokenizer.json").write_text(nanochat_style_tokenizer())
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>", "eos_token": "<|assistant_end|>"}))
    init = import_run(out, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "train.json").read_text())["tokenizer"] == "nanochat-d0"
    back = load_file(str(init / "model.safetensors"))
    assert back["tok_emb.embedding"].dtype == np.float32
    assert np.array_equal(back["tok_emb.embedding"], sd["model.embed_tokens.weight"].astype(np.float32))
    tok = get_tokenizer("nanochat-d0", file=init / "tokenizer.json")
    original = json.loads(nanochat_style_tokenizer())
    bos = next(t["id"] for t in original["added_tokens"] if t["content"] == "<|bos|>")
    assert isinstance(tok, TrainedTokenizer) and tok.eot_id == bos
    from tokenizers import Tokenizer

    assert tok.encode(PROMPT) == Tokenizer.from_str(nanochat_style_tokenizer()).encode(PROMPT).ids
    # Without a bos_token naming a special token (config.json's bos_token_id 256 is an ordinary one here),
    # nothing stands for end-of-text: refused in one line.
    (out / "tokenizer_config.json").unlink()
    with pytest.raises(ConversionError, match=r"tokenizer.json: has no <\|endoftext\|> token and names no bos token"):
        import_run(out, tmp_path / "run2")


# ----------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def shakes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding a trained tokenizer "shakes" (vocab 300), trained once here."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"no Tiny Shakespeare at {SHAKESPEARE}")
    import download_dataset as dd

    root = tmp_path_factory.mktemp("bpe-data")
    assert (
        dd.main(
            [
                "tokenizer",
                "shakes",
                "tinyshakespeare",
                "--from",
                str(SHAKESPEARE),
                "--vocab-size",
                "300",
                "--data-dir",
                str(root),
            ]
        )
        == 0
    )
    return root


def exported(tmp_path: Path, tokenizer: str, shakes_root: Path | None = None) -> Path:
    vocab_size = 50304 if tokenizer == "gpt2" else 320
    folder, _ = checkpoint(tmp_path / f"ckpt-{tokenizer}", tokenizer=tokenizer, vocab_size=vocab_size)
    if shakes_root is not None:  # a checkpoint keeps its trained tokenizer's file
        trained = shakes_root / "tokenizers" / tokenizer / "tokenizer.json"
        (folder / "tokenizer.json").write_bytes(trained.read_bytes())
    return export_run(folder, tmp_path / f"out-{tokenizer}")


def test_gpt2_and_bytes_tokenizers_come_back_by_name(tmp_path: Path) -> None:
    for name in ("gpt2", "bytes"):
        import_run(exported(tmp_path, name), tmp_path / f"run-{name}")
        assert json.loads((tmp_path / f"run-{name}" / "train.json").read_text())["tokenizer"] == name
        assert not (tmp_path / f"run-{name}" / "pretrained" / "tokenizer.json").exists()


def test_a_trained_tokenizer_is_exported_and_imported_byte_for_byte(tmp_path: Path, shakes: Path) -> None:
    out = exported(tmp_path, "shakes", shakes)
    original = (shakes / "tokenizers" / "shakes" / "tokenizer.json").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == original
    assert convert_hf.main(["import", str(out), str(tmp_path / "run"), "--tokenizer-name", "shakes"]) == 0
    assert json.loads((tmp_path / "run" / "train.json").read_text())["tokenizer"] == "shakes"
    assert (tmp_path / "run" / "pretrained" / "tokenizer.json").read_bytes() == original
    eot = get_tokenizer("shakes", shakes).eot_id
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eot


@pytest.mark.parametrize("name", ["gpt2", "bytes", "shakes"])
def test_transformers_loads_the_config_and_encodes_as_we_do(tmp_path: Path, name: str, request) -> None:
    transformers = transformers_or_skip()
    root = request.getfixturevalue("shakes") if name == "shakes" else None
    out = exported(tmp_path, name, root)
    config = transformers.AutoConfig.from_pretrained(out)
    assert (
        config.model_type,
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.final_logit_softcapping,
        config.rope_parameters["rope_theta"],
    ) == ("nanochat", 32, 2, 4, 4, 128, 15.0, 10000.0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    tok = get_tokenizer(name, root)
    texts = [PROMPT, "héllo wörld — 日本語 🙂\n\ttabs  spaces", " First Citizen:\nBefore we proceed"]
    for text in texts:
        assert hf_tok.encode(text) == tok.encode(text), text
        assert hf_tok.decode(tok.encode(text)) == text
    if name == "gpt2":
        assert hf_tok.encode(PROMPT) == [6109, 3626, 6100, 345]
    assert hf_tok.eos_token == hf_tok.bos_token == hf_tok.pad_token == EOT_TEXT
    assert hf_tok.eos_token_id == tok.eot_id == config.eos_token_id
