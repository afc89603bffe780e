"""Run configuration: every bad file fails early with one line naming the file, key and value (the
architecture options' impossible combinations among them); valid files resolve their defaults. (The
shipped runs: test_shipped_runs.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from jaxgpt.config import (
    ConfigError,
    DatasetConfig,
    ModelConfig,
    MuonConfig,
    TrainConfig,
    from_json,
    load_run_configs,
    to_dict,
)

MODEL = {"architecture": "gpt2", "vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2}
TRAIN = {"microbatch_size": 4, "gradient_accumulation_steps": 2, "train_steps": 10}
# one optimiser step = 4 x 2 x 16 = 128 tokens

DROP = object()  # marks a key to delete from the base file


def write_run(run_dir: Path, model: Any = None, train: Any = None) -> Path:
    """model/train: a dict (JSON-encoded), a str (written verbatim), bytes, or None for the base."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, content, base in (("model.json", model, MODEL), ("train.json", train, TRAIN)):
        content = base if content is None else content
        path = run_dir / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(json.dumps(content))
    return run_dir


def edit(base: dict, **changes: Any) -> dict:
    out = dict(base)
    for key, value in changes.items():
        if value is DROP:
            out.pop(key)
        else:
            out[key] = value
    return out


def m(**kw: Any) -> dict:
    return {"model": edit(MODEL, **kw)}


def t(**kw: Any) -> dict:
    return {"train": edit(TRAIN, **kw)}


# (id, files, the file the message must start with, substrings that must appear in it)
BAD: list[tuple[str, dict, str, list[str]]] = [
    # --- the file itself
    ("malformed-json-model", {"model": '{"architecture": "gpt2",}'}, "model.json", ["malformed JSON", "line 1"]),
    ("malformed-json-train", {"train": '{"microbatch_size": 4\n'}, "train.json", ["malformed JSON", "line"]),
    ("empty-file", {"train": ""}, "train.json", ["malformed JSON"]),
    ("top-level-array", {"train": "[1, 2]"}, "train.json", ["JSON object", "list"]),
    ("top-level-string", {"model": '"gpt2"'}, "model.json", ["JSON object", "str"]),
    # --- keys
    ("unknown-key-typo", t(learning_rat=0.001), "train.json", ["unknown key", "'learning_rat'"]),
    ("unknown-key-model", m(n_head=4), "model.json", ["unknown key", "'n_head'"]),
    ("missing-required-model", m(emb_dim=DROP), "model.json", ["missing", "'emb_dim'"]),
    ("missing-required-train", t(microbatch_size=DROP), "train.json", ["missing", "'microbatch_size'"]),
    ("unknown-dataset-key", t(dataset={"sorce": "builtin"}), "train.json", ["dataset", "unknown key", "'sorce'"]),
    # --- types
    ("string-for-int", t(microbatch_size="4"), "train.json", ["microbatch_size", "'4'", "integer"]),
    ("true-for-int", m(n_layers=True), "model.json", ["n_layers", "True", "integer"]),
    ("float-for-int", m(vocab_size=2.5), "model.json", ["vocab_size", "2.5", "integer"]),
    ("null-for-int", t(microbatch_size=None), "train.json", ["microbatch_size", "None"]),
    (
        "infinity-for-int",
        {"train": json.dumps(TRAIN)[:-1] + ', "train_tokens": Infinity}'},
        "train.json",
        ["train_tokens", "inf"],
    ),
    ("float-for-bool", m(qkv_bias=1.0), "model.json", ["qkv_bias", "1.0", "true or false"]),
    ("int-for-bool", t(charts_log_y=1), "train.json", ["charts_log_y", "1", "true or false"]),
    ("string-for-float", t(learning_rate="1e-3"), "train.json", ["learning_rate", "'1e-3'"]),
    ("bool-for-float", m(drop_rate=False), "model.json", ["drop_rate", "False"]),
    (
        "nan-for-float",
        {"train": json.dumps(TRAIN)[:-1] + ', "learning_rate": NaN}'},
        "train.json",
        ["learning_rate", "nan"],
    ),
    ("int-for-string", t(dataset={"source": 3}), "train.json", ["dataset", "source", "3"]),
    ("string-for-dict", t(dataset={"options": "x"}), "train.json", ["options", "'x'"]),
    # --- choices
    ("unknown-architecture", m(architecture="bert"), "model.json", ["architecture", "'bert'", "'gpt2'"]),
    ("unknown-dense-dtype", m(dense_dtype="bfloat16"), "model.json", ["dense_dtype", "'bfloat16'", "'compute'"]),
    # Any other name may be a trained tokenizer's (looked up when the run starts): only an impossible one fails here.
    ("bad-tokenizer-name", t(tokenizer="sentence/piece"), "train.json", ["tokenizer", "'sentence/piece'", "'bytes'"]),
    ("unknown-targets", t(targets="prev"), "train.json", ["targets", "'prev'", "'next'"]),
    # --- model values
    ("emb-not-divisible", m(emb_dim=30), "model.json", ["emb_dim=30", "n_heads=4"]),
    ("zero-vocab", m(vocab_size=0), "model.json", ["vocab_size=0"]),
    ("negative-context", m(context_length=-16), "model.json", ["context_length=-16"]),
    ("zero-emb-dim", m(emb_dim=0), "model.json", ["emb_dim=0"]),
    ("zero-heads", m(n_heads=0), "model.json", ["n_heads=0"]),
    ("gpt2-zero-layers", m(n_layers=0), "model.json", ["n_layers=0"]),
    ("atoa-negative-layers", m(architecture="a-to-a", n_layers=-1), "model.json", ["n_layers=-1"]),
    ("drop-rate-one", m(drop_rate=1.0), "model.json", ["drop_rate=1.0"]),
    ("drop-rate-negative", m(drop_rate=-0.1), "model.json", ["drop_rate=-0.1"]),
    # --- train values
    ("zero-microbatch", t(microbatch_size=0), "train.json", ["microbatch_size=0"]),
    ("negative-accumulation", t(gradient_accumulation_steps=-2), "train.json", ["gradient_accumulation_steps=-2"]),
    ("zero-train-steps", t(train_steps=0), "train.json", ["train_steps=0"]),
    ("zero-sequence-length", t(sequence_length=0), "train.json", ["sequence_length=0"]),
    ("zero-learning-rate", t(learning_rate=0), "train.json", ["learning_rate=0"]),
    ("negative-clip", t(clipping_max_norm=-1), "train.json", ["clipping_max_norm=-1"]),
    ("zero-checkpoint-interval", t(checkpoint_interval=0), "train.json", ["checkpoint_interval=0"]),
    ("zero-validation-interval", t(validation_interval=0), "train.json", ["validation_interval=0"]),
    ("negative-weight-decay", t(weight_decay=-0.1), "train.json", ["weight_decay=-0.1"]),
    ("negative-seed", t(seed=-1), "train.json", ["seed=-1"]),
    ("adam-b1-one", t(adam_b1=1.0), "train.json", ["adam_b1=1.0"]),
    ("warmup-150", t(warmup_percent=150), "train.json", ["warmup_percent=150"]),
    ("warmup-negative", t(warmup_percent=-1), "train.json", ["warmup_percent=-1"]),
    ("both-steps-and-tokens", t(train_tokens=1280), "train.json", ["train_steps=10", "train_tokens=1280"]),
    ("neither-steps-nor-tokens", t(train_steps=DROP), "train.json", ["train_steps=None", "train_tokens=None"]),
    ("batch-size-mismatch", t(batch_size=6), "train.json", ["batch_size=6", "4 x 2 = 8"]),
    ("mesh-model-zero", t(mesh={"model": 0}), "train.json", ["mesh", "model=0"]),
    ("mesh-unknown-key", t(mesh={"modle": 2}), "train.json", ["mesh", "unknown key", "'modle'"]),
    ("mesh-fsdp-string", t(mesh={"fsdp": "yes"}), "train.json", ["mesh", "fsdp", "'yes'"]),
    ("init-from-blank", t(init_from="  "), "train.json", ["init_from", "'  '"]),
    # --- optimizer, schedule, target
    ("unknown-optimizer", t(optimizer="sgd"), "train.json", ["optimizer", "'sgd'", "'muon'"]),
    ("muon-section-for-adamw", t(muon={"momentum": 0.9}), "train.json", ["muon", "optimizer='adamw'"]),
    ("muon-momentum-one", t(optimizer="muon", muon={"momentum": 1.0}), "train.json", ["muon", "momentum=1.0"]),
    ("muon-unknown-key", t(optimizer="muon", muon={"lr": 0.1}), "train.json", ["muon", "unknown key", "'lr'"]),
    ("muon-zero-ns-steps", t(optimizer="muon", muon={"ns_steps": 0}), "train.json", ["muon", "ns_steps=0"]),
    (
        "muon-zero-embed-lr",
        t(optimizer="muon", muon={"embed_learning_rate": 0}),
        "train.json",
        ["muon", "embed_learning_rate=0"],
    ),
    (
        "muon-negative-warmup",
        t(optimizer="muon", muon={"momentum_warmup_steps": -1}),
        "train.json",
        ["muon", "momentum_warmup_steps=-1"],
    ),
    (
        "muon-negative-decay",
        t(optimizer="muon", muon={"weight_decay": -0.1}),
        "train.json",
        ["muon", "weight_decay=-0.1"],
    ),
    ("unknown-schedule", t(schedule="linear"), "train.json", ["schedule", "'linear'", "'wsd'"]),
    (
        "wsd-over-100-percent",
        t(schedule="wsd", warmup_percent=30, cooldown_percent=80),
        "train.json",
        ["warmup_percent=30", "cooldown_percent=80", "100"],
    ),
    (
        "wsd-default-cooldown-over-100",
        t(schedule="wsd", warmup_percent=90),
        "train.json",
        ["warmup_percent=90", "cooldown_percent=20"],
    ),
    ("cooldown-for-cosine", t(cooldown_percent=10), "train.json", ["cooldown_percent=10", "'wsd'"]),
    ("cooldown-negative", t(schedule="wsd", cooldown_percent=-5), "train.json", ["cooldown_percent=-5"]),
    ("zero-target", t(target_val_loss=0), "train.json", ["target_val_loss=0"]),
    ("string-target", t(target_val_loss="low"), "train.json", ["target_val_loss", "'low'"]),
    # --- across the two files
    (
        "muon-without-matrices",
        {"model": edit(MODEL, architecture="a-to-a", n_layers=0), "train": edit(TRAIN, optimizer="muon")},
        "train.json",
        ["optimizer='muon'", "a-to-a", "adamw"],
    ),
    ("train-tokens-below-one-step", t(train_steps=DROP, train_tokens=100), "train.json", ["train_tokens=100", "128"]),
    ("sequence-longer-than-context", t(sequence_length=32), "train.json", ["sequence_length=32", "context_length=16"]),
]


@pytest.mark.parametrize("files,file,needles", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config(tmp_path: Path, files: dict, file: str, needles: list[str]) -> None:
    run_dir = write_run(tmp_path / "run", **files)
    with pytest.raises(ConfigError) as info:
        load_run_configs(run_dir)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg, msg
    assert msg.startswith(f"{run_dir / file}:"), msg  # the full path of the offending file
    for needle in needles:
        assert needle.lower() in msg.lower(), (needle, msg)


def test_missing_file(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    (run_dir / "train.json").unlink()
    with pytest.raises(ConfigError, match="not found") as info:
        load_run_configs(run_dir)
    assert str(info.value).startswith(f"{run_dir / 'train.json'}:") and "\n" not in str(info.value)


def test_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_configs(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value) and "\n" not in str(info.value)


def test_known_keys_listed_for_a_typo(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_configs(write_run(tmp_path, **t(learning_rat=0.001)))
    assert "learning_rate" in str(info.value)  # the user can see the key they meant


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", model=b'{"architecture": "gpt2\xff"}')
    with pytest.raises(ConfigError) as info:
        load_run_configs(run_dir)
    assert str(info.value).startswith(f"{run_dir / 'model.json'}:")


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    (run_dir / "model.json").unlink()
    (run_dir / "model.json").mkdir()
    with pytest.raises(ConfigError) as info:
        load_run_configs(run_dir)
    assert str(info.value).startswith(f"{run_dir / 'model.json'}:")


def test_dataset_not_an_object_names_the_value(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", **t(dataset="builtin"))
    with pytest.raises(ConfigError) as info:
        load_run_configs(run_dir)
    msg = str(info.value)
    assert msg.startswith(f"{run_dir / 'train.json'}:") and "dataset" in msg
    assert "builtin" in msg


def test_nested_value_error_names_the_file_once(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", **t(mesh={"model": 0}))
    with pytest.raises(ConfigError) as info:
        load_run_configs(run_dir)
    assert str(info.value) == f"{run_dir / 'train.json'}: mesh: model=0 must be > 0"


# ----------------------------------------------------------------------------- the architecture options

ARCH = {
    "architecture": "gpt2",
    "vocab_size": 61,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "qkv_bias": False,
    "drop_rate": 0.0,
    "tie_embeddings": False,
}


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"logit_softcap": 0.0}, r"^model.json: logit_softcap=0.0 must be > 0"),
        ({"logit_softcap": -3.0}, r"^model.json: logit_softcap=-3.0 must be > 0"),
        (
            {"rope_base": 500.0},
            (
                r"^model.json: rope_base=500.0 is the rotary base, but positions='learned' asks for a "
                r"learned position table"
            ),
        ),
        ({"positions": "rotary", "rope_base": 0.0}, r"rope_base=0.0 must be > 0"),
        (
            {"positions": "rotary", "emb_dim": 36, "n_heads": 4},
            r"head size emb_dim / n_heads = 36 / 4 = 9 must be even",
        ),
        ({"n_kv_heads": 3}, r"^model.json: n_kv_heads=3 must divide n_heads=4"),
        ({"n_kv_heads": 0}, r"^model.json: n_kv_heads=0 must be > 0"),
        ({"window_pattern": "SXL"}, r"^model.json: window_pattern='SXL' must be a string of 'S'"),
        ({"window_pattern": ""}, r"^model.json: window_pattern='' must be a string of 'S'"),
        (
            {"short_window": 4},
            (
                r"^model.json: short_window=4 is the window of the 'S' layers of window_pattern, which is "
                r"null; set window_pattern"
            ),
        ),
        ({"window_pattern": "SL", "short_window": 17}, r"^model.json: short_window=17 must be in 1..context_length=16"),
        ({"unet_skips": True, "n_layers": 1}, r"^model.json: unet_skips=true joins the first half .* n_layers=1"),
        ({"architecture": "a-to-a", "value_embeds": True}, r"^model.json: value_embeds=True needs architecture 'gpt2'"),
    ],
)
def test_bad_architecture_options_are_one_line_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        ModelConfig(**{**ARCH, **kw})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"n_layers": 1, "logit_softcap": 0}, "logit_softcap=0.0 must be > 0"),
        ({"n_layers": 2, "n_kv_heads": 3}, "n_kv_heads=3 must divide n_heads=4"),
    ],
    ids=["softcap", "kv-heads"],
)
def test_a_bad_architecture_option_in_a_file_names_the_file(tmp_path: Path, kw: dict, match: str) -> None:
    path = tmp_path / "model.json"
    path.write_text(
        json.dumps({"architecture": "gpt2", "vocab_size": 61, "context_length": 16, "emb_dim": 32, "n_heads": 4, **kw})
    )
    with pytest.raises(ConfigError, match=rf"^{path}: {match}"):
        from_json(ModelConfig, path)


# ----------------------------------------------------------------------------- valid configs


def test_defaults_resolved(tmp_path: Path) -> None:
    model, train = load_run_configs(write_run(tmp_path))
    md, td = to_dict(model), to_dict(train)
    assert set(md) == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(td) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert md == {
        **MODEL,
        "qkv_bias": False,
        "bias": True,
        "drop_rate": 0.0,
        "tie_embeddings": False,
        "compute_dtype": "float32",
        "dense_dtype": "float32",
        "attention": "auto",
        "remat": False,
        "scan_layers": False,
        "loss_chunk": None,
        # the modern recipe's options, off: GPT-2's layout
        "positions": "learned",
        "rope_base": None,
        "norm": "layernorm",
        "norm_scale": True,
        "embed_norm": False,
        "qk_norm": False,
        "mlp": "gelu",
        "zero_init_proj": False,
        "logit_softcap": None,
        # the 2026 recipe's, off: every head its own keys and values, no windows
        "n_kv_heads": None,
        "value_embeds": False,
        "embed_skips": False,
        "unet_skips": False,
        "window_pattern": None,
        "short_window": None,
    }
    assert td["packing"] == "windows"
    assert td["dataset"] == {"source": "builtin", "options": {}}
    assert isinstance(train.dataset, DatasetConfig)
    assert (td["tokenizer"], td["targets"], td["sequence_length"], td["train_tokens"]) == ("bytes", "next", None, None)
    assert (td["learning_rate"], td["warmup_percent"], td["weight_decay"]) == (6e-4, 5.0, 0.1)
    assert train.seq_len(model) == 16 and train.sequences_per_step == 8
    assert train.tokens_per_step(model) == 128 and train.total_steps(model) == 10
    assert train.validation_interval == train.checkpoint_interval == 100
    json.dumps(td)  # serialisable as written beside the checkpoints
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.learning_rate = 1.0  # type: ignore[misc]


def test_defaults_depend_on_the_optimizer_and_schedule(tmp_path: Path) -> None:
    """learning_rate / weight_decay left out: AdamW's or Muon's own; set: kept as given. The resolved
    values are what to_dict writes beside the checkpoints, and load back the same."""
    _, adamw = load_run_configs(write_run(tmp_path / "a"))
    assert (adamw.learning_rate, adamw.weight_decay, adamw.muon, adamw.cooldown_percent) == (6e-4, 0.1, None, None)
    _, muon = load_run_configs(write_run(tmp_path / "m", **t(optimizer="muon", schedule="wsd")))
    assert (muon.learning_rate, muon.weight_decay, muon.cooldown_percent) == (0.02, 0.0, 20.0)
    assert muon.muon == MuonConfig() and to_dict(muon)["muon"] == dataclasses.asdict(MuonConfig())
    _, given = load_run_configs(
        write_run(tmp_path / "g", **t(optimizer="muon", learning_rate=0.05, weight_decay=0.01, muon={"momentum": 0.9}))
    )
    assert (given.learning_rate, given.weight_decay, given.muon.momentum, given.muon.ns_steps) == (0.05, 0.01, 0.9, 5)
    for cfg, name in ((muon, "m2"), (given, "g2")):
        again = load_run_configs(write_run(tmp_path / name, train=to_dict(cfg)))[1]
        assert again == cfg


def test_resolved_dict_round_trips(tmp_path: Path) -> None:
    model, train = load_run_configs(write_run(tmp_path / "a", **t(dataset={"source": "x", "options": {"k": 1}})))
    again = load_run_configs(write_run(tmp_path / "b", model=to_dict(model), train=to_dict(train)))
    assert again == (model, train)


def test_integral_float_accepted_for_int(tmp_path: Path) -> None:
    model, train = load_run_configs(
        write_run(
            tmp_path,
            model=edit(MODEL, vocab_size=64.0),
            train=edit(TRAIN, train_steps=DROP, train_tokens=1e6, learning_rate=1, sequence_length=8.0),
        )
    )
    assert train.train_tokens == 1_000_000 and type(train.train_tokens) is int
    assert model.vocab_size == 64 and type(model.vocab_size) is int
    assert train.learning_rate == 1.0 and type(train.learning_rate) is float
    # total steps from tokens: 1e6 // (4 x 2 x 8) = 15625
    assert train.tokens_per_step(model) == 64
    assert train.total_steps(model) == 15_625


def test_total_steps_from_train_tokens_rounds_down(tmp_path: Path) -> None:
    model, train = load_run_configs(write_run(tmp_path, **t(train_steps=DROP, train_tokens=128 * 7 + 127)))
    assert train.train_steps is None and train.total_steps(model) == 7
    _, one = load_run_configs(write_run(tmp_path / "one", **t(train_steps=DROP, train_tokens=128)))
    assert one.total_steps(model) == 1  # exactly one step is enough


def test_optional_fields_accept_null_and_valid_values(tmp_path: Path) -> None:
    model, train = load_run_configs(
        write_run(
            tmp_path,
            model=edit(MODEL, architecture="a-to-a", n_layers=0, emb_dim=30, drop_rate=0.5),
            train=edit(
                TRAIN,
                sequence_length=None,
                batch_size=8,
                validation_interval=5,
                warmup_percent=100,
                targets="same",
                tokenizer="gpt2",
                lr_end_factor=0,
                weight_decay=0,
            ),
        )
    )
    assert model.architecture == "a-to-a" and model.n_layers == 0  # no n_layers/divisibility rule
    assert train.sequence_length is None and train.batch_size == 8 and train.validation_interval == 5
    assert (train.targets, train.tokenizer, train.warmup_percent) == ("same", "gpt2", 100.0)


def test_the_tokenizer_default_is_download_datasets_for_the_source() -> None:
    """A FineWeb-Edu train.json without "tokenizer" trains on the gpt2 dataset download_dataset.py
    fineweb-edu prepares by default, not on a bytes one; every other source defaults to bytes."""
    from jaxgpt.config import TrainConfig, from_dict

    def tokenizer(source: str, **given: str) -> str:
        return from_dict(
            TrainConfig, {"microbatch_size": 1, "train_steps": 1, "dataset": {"source": source}, **given}, "train.json"
        ).tokenizer

    assert tokenizer("fineweb-edu") == tokenizer("fineweb10B-gpt2") == "gpt2"
    assert tokenizer("builtin") == tokenizer("tinyshakespeare") == tokenizer("instructions") == "bytes"
    assert tokenizer("fineweb-edu", tokenizer="edu32k") == "edu32k"
