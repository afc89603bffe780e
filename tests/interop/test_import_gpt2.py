"""import_gpt2.py: random GPT-2 weights in the Hugging Face layout, built here with numpy, imported
and checked against a plain-numpy GPT-2 forward pass written from the Hugging Face layout (not
from jaxgpt/model/gpt.py); export -> import round trips; a run made by an import samples, evaluates and
fine-tunes from the imported weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, SLOW
from safetensors.numpy import load_file, save_file

import evaluate
import import_gpt2
import test_generation
import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.checkpoints.store import load_model
from jaxgpt.conversations.template import BUILTIN
from jaxgpt.interop.gpt2 import export_run, import_run, infer_config
from jaxgpt.tracking.history import read_record

TOL = 1e-4


def hf_weights(
    seed: int,
    *,
    V: int = 67,
    ctx: int = 24,
    C: int = 32,
    L: int = 2,
    H: int = 4,
    untied: bool = False,
    buffers: bool = True,
    prefix: str = "",
) -> dict[str, np.ndarray]:
    """A random GPT-2 state dict as Hugging Face saves it: Conv1D weights (in, out), float32.

    Values are far from an init (LayerNorm scales around 1 +- 0.3, biases 0.3, kernels sharp
    enough for peaky attention), so a dropped bias, a swapped q/k or a transposed head shows.
    """
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    sd = {
        "wte.weight": w(V, C),
        "wpe.weight": w(ctx, C, scale=0.5),
        "ln_f.weight": 1 + w(C, scale=0.3),
        "ln_f.bias": w(C, scale=0.3),
    }
    for i in range(L):
        sd.update(
            {
                f"h.{i}.ln_1.weight": 1 + w(C, scale=0.3),
                f"h.{i}.ln_1.bias": w(C, scale=0.3),
                f"h.{i}.attn.c_attn.weight": w(C, 3 * C, scale=1.5 / math.sqrt(C)),
                f"h.{i}.attn.c_attn.bias": w(3 * C, scale=0.3),
                f"h.{i}.attn.c_proj.weight": w(C, C, scale=1 / math.sqrt(C)),
                f"h.{i}.attn.c_proj.bias": w(C, scale=0.3),
                f"h.{i}.ln_2.weight": 1 + w(C, scale=0.3),
                f"h.{i}.ln_2.bias": w(C, scale=0.3),
                f"h.{i}.mlp.c_fc.weight": w(C, 4 * C, scale=1 / math.sqrt(C)),
                f"h.{i}.mlp.c_fc.bias": w(4 * C, scale=0.3),
                f"h.{i}.mlp.c_proj.weight": w(4 * C, C, scale=1 / math.sqrt(4 * C)),
                f"h.{i}.mlp.c_proj.bias": w(C, scale=0.3),
            }
        )
        if buffers:  # what transformers' own files carry: the causal mask, not a weight
            sd[f"h.{i}.attn.bias"] = np.tril(np.ones((ctx, ctx), np.float32))[None, None]
            sd[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    if untied:
        sd["lm_head.weight"] = w(V, C)
    return {prefix + k if k.startswith(("h.", "w", "ln_f")) else k: v for k, v in sd.items()}


def hf_forward(sd: dict[str, np.ndarray], n_head: int, idx: np.ndarray) -> np.ndarray:
    """GPT-2 in float64 numpy, as transformers' GPT2LMHeadModel computes it. idx: (B, T) -> (B, T, V)."""

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * sd[p + ".weight"] + sd[p + ".bias"]

    def conv1d(x: np.ndarray, p: str) -> np.ndarray:
        return x @ sd[p + ".weight"] + sd[p + ".bias"]

    def gelu_new(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    B, T = idx.shape
    C = sd["wte.weight"].shape[1]
    D = C // n_head
    n_layer = len({k.split(".")[1] for k in sd if k.startswith("h.")})
    h = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    for i in range(n_layer):
        a = conv1d(ln(h, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn")
        q, k, v = (a[..., j * C : (j + 1) * C].reshape(B, T, n_head, D).transpose(0, 2, 1, 3) for j in range(3))
        w = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
        w = np.where(np.tril(np.ones((T, T), bool)), w, -1e4)  # transformers' masked_bias value
        w = np.exp(w - w.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y = (w @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + conv1d(y, f"h.{i}.attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc")), f"h.{i}.mlp.c_proj")
    h = ln(h, "ln_f")
    return h @ sd.get("lm_head.weight", sd["wte.weight"]).T


def write_hf(path: Path, sd: dict[str, np.ndarray], config: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata={"format": "pt"})
    if config is not None:
        (path.parent / "config.json").write_text(json.dumps(config))
    return path


def model_logits(run_or_ckpt: Path, idx: np.ndarray) -> np.ndarray:
    model, _cfg, _tok, _path = load_model(run_or_ckpt)
    return np.asarray(model(idx.astype(np.int32)))


# ----------------------------------------------------------------------------- import = reference


@pytest.mark.parametrize("untied", [pytest.param(False, id="tied", marks=SLOW), pytest.param(True, id="untied")])
def test_import_matches_numpy_gpt2(tmp_path: Path, untied: bool) -> None:
    sd = hf_weights(1, untied=untied, prefix="transformer." if untied else "")
    src = write_hf(tmp_path / "hf" / "model.safetensors", sd)
    init = import_run(src, tmp_path / "run", n_heads=4)
    cfg = json.loads((tmp_path / "run" / "model.json").read_text())
    assert cfg == {
        "architecture": "gpt2",
        "vocab_size": 67,
        "context_length": 24,
        "emb_dim": 32,
        "n_heads": 4,
        "n_layers": 2,
        "qkv_bias": True,
        "bias": True,
        "drop_rate": 0.0,
        "tie_embeddings": not untied,
        "compute_dtype": "float32",
        "dense_dtype": "float32",
        "attention": "auto",
        "remat": False,
        "scan_layers": False,
        "loss_chunk": None,
        "positions": "learned",
        "rope_base": None,
        "norm": "layernorm",
        "norm_scale": True,
        "embed_norm": False,
        "qk_norm": False,
        "mlp": "gelu",
        "zero_init_proj": False,
        "logit_softcap": None,
        "n_kv_heads": None,
        "value_embeds": False,
        "embed_skips": False,
        "unet_skips": False,
        "window_pattern": None,
        "short_window": None,
    }
    meta = ckpt.read_meta(init)
    assert meta["step"] == 0 and meta["weights_only"] is True
    idx = np.random.default_rng(2).integers(0, 67, size=(2, 24))
    ref = hf_forward({k.removeprefix("transformer."): v for k, v in sd.items()}, 4, idx)
    # The run directory itself resolves to pretrained/ until training writes a checkpoint.
    got = model_logits(tmp_path / "run", idx)
    assert np.abs(got - ref).max() <= TOL, np.abs(got - ref).max()
    assert np.abs(ref).max() > 5  # the comparison is not between two near-zero tensors


@SLOW  # several imports end to end
def test_heads_from_config_json_and_wrong_heads_differ(tmp_path: Path) -> None:
    sd = hf_weights(3, C=48, H=3, L=1)
    src = write_hf(tmp_path / "hf" / "model.safetensors", sd, {"n_head": 3, "activation_function": "gelu_new"})
    import_run(tmp_path / "hf", tmp_path / "run")  # a folder holding model.safetensors + config.json
    assert json.loads((tmp_path / "run" / "model.json").read_text())["n_heads"] == 3
    idx = np.random.default_rng(4).integers(0, 67, size=(1, 24))
    ref = hf_forward(sd, 3, idx)
    assert np.abs(model_logits(tmp_path / "run", idx) - ref).max() <= TOL
    # The head split matters: the same weights read as 6 heads compute something else.
    import_run(src, tmp_path / "run6", n_heads=6)
    assert np.abs(model_logits(tmp_path / "run6", idx) - ref).max() > 1e-2


def test_sizes_inferred_from_shapes() -> None:
    cfg = infer_config(
        {
            "wte.weight": np.zeros((50257, 1280)),
            "wpe.weight": np.zeros((1024, 1280)),
            **{f"h.{i}.ln_1.weight": np.zeros(1280) for i in range(36)},
        },
        "x",
    )
    assert (cfg.n_layers, cfg.emb_dim, cfg.n_heads, cfg.vocab_size, cfg.context_length) == (36, 1280, 20, 50257, 1024)
    assert cfg.tie_embeddings and cfg.qkv_bias


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_export_import_round_trip_is_bit_exact(tmp_path: Path, untied: bool) -> None:
    sd = hf_weights(5, untied=untied)
    import_run(write_hf(tmp_path / "a.safetensors", sd), tmp_path / "run", n_heads=4)
    out = export_run(tmp_path / "run", tmp_path / "export")
    exported = load_file(str(out))
    # The export is the original file minus the mask buffers, bit for bit.
    want = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert sorted(exported) == sorted(want)
    for k, v in want.items():
        assert exported[k].dtype == np.float32 and np.array_equal(exported[k], v), k
    hf_cfg = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (hf_cfg["n_head"], hf_cfg["n_layer"], hf_cfg["n_embd"], hf_cfg["tie_word_embeddings"]) == (
        4,
        2,
        32,
        not untied,
    )
    import_run(tmp_path / "export", tmp_path / "run2")  # heads from the exported config.json
    a = load_file(str(tmp_path / "run" / "pretrained" / "model.safetensors"))
    b = load_file(str(tmp_path / "run2" / "pretrained" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert ("head.kernel" in a) == untied


def test_export_of_a_model_without_qkv_bias_writes_zeros(tmp_path: Path) -> None:
    from jaxgpt.config import ModelConfig, to_dict
    from jaxgpt.model.gpt import build_model

    cfg = ModelConfig(architecture="gpt2", vocab_size=11, context_length=8, emb_dim=16, n_heads=2, n_layers=1)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    ckpt.save_weights(build_model(cfg), folder / ckpt.WEIGHTS)
    (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
    (folder / ckpt.META).write_text(json.dumps({"step": 3}))
    hf = load_file(str(export_run(folder, tmp_path / "out")))
    assert np.array_equal(hf["h.0.attn.c_attn.bias"], np.zeros(48, np.float32))
    assert hf["lm_head.weight"].shape == (11, 16)  # untied: the head goes out as an nn.Linear weight


def test_export_writes_the_runs_own_end_of_text_id(tmp_path: Path) -> None:
    """config.json's bos/eos are the run's tokenizer's end-of-text: gpt2's, bytes', or a trained one's
    from the copy its checkpoint holds."""
    from jaxgpt.config import ModelConfig, to_dict
    from jaxgpt.data.tokenizer import get_tokenizer
    from jaxgpt.model.gpt import build_model
    from jaxgpt.preparation.bpe import train_tokenizer

    src = SHARED / "data" / "tinyshakespeare.txt"
    if not src.is_file():
        pytest.skip(f"no Tiny Shakespeare at {src}")
    train_tokenizer(
        "tiny300",
        "tinyshakespeare",
        tmp_path / "data",
        vocab_size=300,
        from_path=src,
        log=lambda _m: None,
        progress=False,
    )
    trained = get_tokenizer("tiny300", tmp_path / "data")
    cfg = ModelConfig(architecture="gpt2", vocab_size=300, context_length=8, emb_dim=16, n_heads=2, n_layers=1)
    for name, eot in (("gpt2", 50256), ("bytes", 256), ("tiny300", trained.eot_id)):
        folder = tmp_path / name
        folder.mkdir()
        ckpt.save_weights(build_model(cfg), folder / ckpt.WEIGHTS)
        (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
        (folder / "train.json").write_text(json.dumps({"tokenizer": name}))
        (folder / ckpt.META).write_text(json.dumps({"step": 1}))
        if name == "tiny300":
            (folder / "tokenizer.json").write_bytes(trained.data)
        if name == "gpt2":  # a fine-tuned run: its chat template goes out with the tokenizer
            (folder / "chat_template.json").write_text(json.dumps(BUILTIN["alpaca"].to_dict()))
        export_run(folder, tmp_path / f"out-{name}")
        hf_cfg = json.loads((tmp_path / f"out-{name}" / "config.json").read_text())
        assert (hf_cfg["bos_token_id"], hf_cfg["eos_token_id"]) == (eot, eot), name
        _check_exported_tokenizer(tmp_path / f"out-{name}", get_tokenizer(name, tmp_path / "data"), name == "gpt2")
    assert trained.eot_id != 256  # the bug this pins: every non-gpt2 tokenizer got 256


def _check_exported_tokenizer(out: Path, ours, chat: bool) -> None:
    """transformers' AutoConfig reads the export and AutoTokenizer its tokenizer, which encodes as ours
    does (tiktoken's gpt2, bytes, a trained one); a fine-tuned run's template gives our chat ids."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(str(out))  # GPT2LMHeadModel itself needs torch: untested
    assert (config.model_type, config.eos_token_id, config.n_layer) == ("gpt2", ours.eot_id, 1)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "Every effort moves you, 1234 héllo\n\n  日本 <|endoftext|>"
    assert hf.encode(text, add_special_tokens=False) == ours.encode(text.removesuffix("<|endoftext|>")) + [ours.eot_id]
    assert hf.decode(ours.encode("Every effort moves you")) == "Every effort moves you"
    assert (hf.eos_token_id, hf.bos_token_id) == (ours.eot_id, ours.eot_id)
    assert (hf.chat_template is not None) == chat
    if chat:
        chat_ = [{"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "5"}]
        got = hf.apply_chat_template(chat_, tokenize=True)
        assert list(got["input_ids"] if hasattr(got, "keys") else got) == BUILTIN["alpaca"].render(ours, chat_)[0]


@SLOW  # a training, an export and an import end to end
def test_bias_free_model_exports_zeros_and_imports_back_bias_free(tmp_path: Path) -> None:
    folder, model = _checkpoint_of(tmp_path, bias=False)
    hf = load_file(str(export_run(folder, tmp_path / "out")))
    biases = {k: v for k, v in hf.items() if k.endswith(".bias")}
    assert len(biases) == 2 * 6 + 1  # per block: ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj; and ln_f
    assert all(not v.any() for v in biases.values()) and biases["h.1.mlp.c_fc.bias"].shape == (64,)
    import_run(tmp_path / "out", tmp_path / "run")
    back = json.loads((tmp_path / "run" / "model.json").read_text())
    assert back["bias"] is False and back["qkv_bias"] is False
    ours = load_file(str(folder / ckpt.WEIGHTS))
    again = load_file(str(tmp_path / "run" / "pretrained" / "model.safetensors"))
    assert sorted(ours) == sorted(again) and all(np.array_equal(ours[k], again[k]) for k in ours)
    idx = np.random.default_rng(0).integers(0, 11, size=(2, 8))
    assert np.array_equal(model_logits(tmp_path / "run", idx), np.asarray(model(idx.astype(np.int32))))


def _checkpoint_of(tmp_path: Path, **kw) -> tuple[Path, object]:
    from jaxgpt.config import ModelConfig, to_dict
    from jaxgpt.model.gpt import build_model

    cfg = ModelConfig(
        **{**dict(architecture="gpt2", vocab_size=11, context_length=8, emb_dim=16, n_heads=2, n_layers=2), **kw}
    )
    folder = tmp_path / "ckpt"
    folder.mkdir()
    model = build_model(cfg, seed=1)
    ckpt.save_weights(model, folder / ckpt.WEIGHTS)
    (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
    (folder / ckpt.META).write_text(json.dumps({"step": 3}))
    return folder, model


@SLOW  # a training and an export end to end
def test_parameter_free_layernorm_exports_ones_and_computes_the_same(tmp_path: Path) -> None:
    folder, model = _checkpoint_of(tmp_path, norm_scale=False, bias=False, zero_init_proj=True)
    hf = load_file(str(export_run(folder, tmp_path / "out")))
    assert all(np.array_equal(v, np.ones(16, np.float32)) for k, v in hf.items() if k.endswith("ln_1.weight"))
    # zero_init_proj is an initialisation only: the layout is GPT-2's. Zero projections would
    # hide a wrong scale, so give them values first (through the file, as a trained model would).
    weights = {
        k: v if not k.endswith("proj.kernel") else np.full_like(v, 0.05)
        for k, v in ckpt.weights_to_numpy(model).items()
    }
    from safetensors.numpy import save_file as save_ours

    save_ours(weights, str(folder / ckpt.WEIGHTS))
    ckpt.load_weights(model, folder / ckpt.WEIGHTS)
    hf = load_file(str(export_run(folder, tmp_path / "out", force=True)))
    idx = np.random.default_rng(0).integers(0, 11, size=(2, 8))
    np.testing.assert_allclose(hf_forward(hf, 2, idx), np.asarray(model(idx.astype(np.int32))), atol=TOL)


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"positions": "rotary"}, "positions"),
        ({"norm": "rmsnorm"}, "norm"),
        ({"embed_norm": True}, "embed_norm"),
        ({"qk_norm": True}, "qk_norm"),
        ({"mlp": "relu2"}, "mlp"),
        ({"logit_softcap": 30.0}, "logit_softcap"),
        ({"n_kv_heads": 1}, "n_kv_heads"),
        ({"value_embeds": True}, "value_embeds"),
        ({"embed_skips": True}, "embed_skips"),
        ({"unet_skips": True}, "unet_skips"),
        ({"window_pattern": "SL"}, "window_pattern"),
    ],
)
def test_export_of_a_modern_option_is_one_line_naming_it(tmp_path: Path, capsys, kw: dict, key: str) -> None:
    folder, _ = _checkpoint_of(tmp_path, **kw)
    assert import_gpt2.main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"model.json {key}=" in err and "no Hugging Face GPT-2 layout" in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_export_refusal_names_every_option_gpt2_lacks(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    model = {"architecture": "gpt2", "vocab_size": 11, "context_length": 8, "emb_dim": 16, "n_heads": 2, "n_layers": 1}
    (folder / "model.json").write_text(json.dumps(model | {"positions": "rotary", "norm": "rmsnorm", "mlp": "relu2"}))
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    assert import_gpt2.main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "have no Hugging Face GPT-2 layout" in err, err
    assert all(f"{k}=" in err for k in ("positions", "norm", "mlp")) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- errors


def test_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sd = hf_weights(6, L=1)
    src = write_hf(tmp_path / "ok.safetensors", sd)
    bad = dict(sd)
    del bad["h.0.mlp.c_fc.bias"]
    cases = {
        "missing tensor 'h.0.mlp.c_fc.bias'": [
            str(write_hf(tmp_path / "missing.safetensors", bad)),
            str(tmp_path / "r1"),
        ],
        "unexpected tensors ['extra']": [
            str(write_hf(tmp_path / "extra.safetensors", {**sd, "extra": np.zeros(2, np.float32)})),
            str(tmp_path / "r2"),
        ],
        "neither a file nor a GPT-2 variant": [str(tmp_path / "nope.safetensors"), str(tmp_path / "r3")],
        "not a readable safetensors file": [str(_write_bytes(tmp_path / "junk.safetensors")), str(tmp_path / "r4")],
    }
    for needle, args in cases.items():
        assert import_gpt2.main(["import", *args, "--n-heads", "4"]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert import_gpt2.main(["import", str(src), str(tmp_path / "r5")]) == 2  # emb_dim 32: heads unknown
    assert "pass --n-heads" in capsys.readouterr().err
    assert import_gpt2.main(["import", str(src), str(tmp_path / "r5"), "--n-heads", "4"]) == 0
    assert import_gpt2.main(["import", str(src), str(tmp_path / "r5"), "--n-heads", "4"]) == 2  # would overwrite
    assert "already exists" in capsys.readouterr().err
    assert import_gpt2.main(["import", str(src), str(tmp_path / "r5"), "--n-heads", "4", "--force"]) == 0
    bad_shape = {**sd, "h.0.attn.c_proj.weight": np.zeros((32, 31), np.float32)}
    assert (
        import_gpt2.main(
            ["import", str(write_hf(tmp_path / "s.safetensors", bad_shape)), str(tmp_path / "r6"), "--n-heads", "4"]
        )
        == 2
    )
    assert "h.0.attn.c_proj.weight has shape (32, 31), expected (32, 32)" in capsys.readouterr().err
    assert import_gpt2.main(["export", str(tmp_path / "nowhere"), str(tmp_path / "e")]) == 2


def _write_bytes(path: Path) -> Path:
    path.write_bytes(b"\x00" * 5)
    return path


# ----------------------------------------------------------------------------- a run made by an import


@pytest.fixture(scope="module")
def gpt2_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in corpus with the gpt2 tokenizer (needs tiktoken's files; tests/conftest.py
    points TIKTOKEN_CACHE_DIR at ../shared when it is there)."""
    from jaxgpt.data.tokenizer import TokenizerError, get_tokenizer
    from jaxgpt.preparation.prepare import prepare_dataset

    try:
        get_tokenizer("gpt2")
    except TokenizerError as e:
        pytest.skip(f"gpt2 tokenizer unavailable offline: {e}")
    root = tmp_path_factory.mktemp("data-gpt2")
    prepare_dataset("builtin", "gpt2", root, log=lambda _msg: None)
    return root


@SLOW  # import, sampling, evaluation and fine-tuning end to end
def test_imported_run_samples_evaluates_and_fine_tunes(
    tmp_path: Path, gpt2_data: Path, capsys: pytest.CaptureFixture
) -> None:
    from jaxgpt.data.samplers.windows import BatchSampler
    from jaxgpt.data.storage.shards import open_dataset
    from jaxgpt.preparation.prepare import dataset_dir

    sd = hf_weights(7, V=50257, ctx=32, C=16, L=1, H=2)
    run = tmp_path / "gpt2"
    assert import_gpt2.main(["import", str(write_hf(tmp_path / "hf.safetensors", sd)), str(run), "--n-heads", "2"]) == 0
    capsys.readouterr()
    assert test_generation.main([str(run), "--max-new-tokens", "8", "--prompt", "Hello", "--prompt", "The"]) == 0
    out = capsys.readouterr().out
    assert "pretrained" in out and "tok/s" in out
    assert evaluate.main([str(run), "--data-dir", str(gpt2_data), "--max-batches", "2"]) == 0
    assert "bits per byte" in capsys.readouterr().out

    # Fine-tune for 2 steps: step 1's loss is the imported weights' loss on step 1's batch.
    settings = json.loads((run / "train.json").read_text())
    assert settings["init_from"] == "pretrained" and settings["tokenizer"] == "gpt2"
    settings.update(
        microbatch_size=2,
        gradient_accumulation_steps=1,
        sequence_length=32,
        train_steps=2,
        checkpoint_interval=2,
        validation_batches=1,
        seed=3,
    )
    (run / "train.json").write_text(json.dumps(settings))
    assert train.main([str(run), "--data-dir", str(gpt2_data)]) == 0
    assert "Initialised" in capsys.readouterr().out
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["step"] == 2 and meta["optimizer_steps_applied"] == 2  # a fresh optimiser

    x, y = BatchSampler(
        open_dataset(dataset_dir(gpt2_data, "builtin", "gpt2")).train, microbatch_size=2, seq_len=32, seed=3
    ).microbatch(0)[:2]
    logits = hf_forward(sd, 2, x)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    first_loss = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert read_record(run).series("train/loss")[1][0] == pytest.approx(first_loss, abs=1e-4)
    # ... and the run now samples from its own checkpoint, not from pretrained/.
    assert test_generation.main([str(run), "--max-new-tokens", "3"]) == 0
    assert "step-2" in capsys.readouterr().out
