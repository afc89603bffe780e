"""checkpointing.py on real files: bit-exact round trips, layout, pruning, atomicity, resolution, errors.

Everything goes through real safetensors and Orbax on files under tmp_path (no mocks, CPU only).
One tiny GPT-2 is trained once per module (a single train_step compile); damaged-checkpoint tests
copy one saved checkpoint instead of saving their own.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

import checkpointing as ck
from checkpointing import CheckpointError
from config import ModelConfig, TrainConfig, to_dict
from model import build_model
from optim import make_optimizer, make_transform, optimizer_stats
from step import step_key, train_step

MCFG = ModelConfig(architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2,
                   n_layers=2, drop_rate=0.1)
TCFG = TrainConfig(microbatch_size=2, gradient_accumulation_steps=2, train_steps=10, warmup_percent=20.0,
                   seed=7)
MICRO = TCFG.gradient_accumulation_steps  # microbatches per train_step call
TOTAL_STEPS = 10
CONFIGS = {"model.json": to_dict(MCFG), "train.json": to_dict(TCFG)}
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
NAME_RE = re.compile(r"^\d{8}T\d{6}Z-step-\d+$")


# ----------------------------------------------------------------------------- helpers


def batch(i: int, k: int = MICRO) -> tuple[jax.Array, jax.Array]:
    """A deterministic (k, B, T) next-token batch; i picks it."""
    x = np.random.default_rng(100 + i).integers(0, MCFG.vocab_size, (k, TCFG.microbatch_size, 16),
                                                dtype=np.int32)
    return jnp.asarray(x), jnp.asarray(np.roll(x, -1, axis=-1))


# make_optimizer(model, TCFG, TOTAL_STEPS) is exactly nnx.Optimizer(model, make_transform(...)); the
# transform is built once here because a new one (new schedule closures) means a new graphdef,
# and so a fresh ~10 s compile of train_step for every optimiser.
TX = make_transform(TCFG, TOTAL_STEPS)


def fresh(seed: int = 1, cfg: ModelConfig = MCFG) -> tuple[nnx.Module, nnx.Optimizer]:
    """A newly initialised model and optimiser (zero moments, empty accumulation window)."""
    model = build_model(cfg, seed=seed)
    optimizer = nnx.Optimizer(model, TX, wrt=nnx.Param)
    # Commit every array to the device, as restored arrays are (load_checkpoint places them on
    # the old sharding): jit specialises on committed-ness, and the continued-training check
    # would otherwise pay a second compile of train_step.
    device = jax.devices()[0]
    for obj in (model, optimizer):
        nnx.update(obj, jax.tree.map(lambda a: jax.device_put(a, device), nnx.state(obj)))
    return model, optimizer


@nnx.jit
def apply_update(model: nnx.Module, optimizer: nnx.Optimizer, grads: nnx.State) -> None:
    """One microbatch through the optimiser by hand (train_step always closes its window)."""
    optimizer.update(model, grads)


def flat(obj) -> dict[str, np.ndarray]:
    """Every leaf of nnx.state(obj) as a host copy (a copy: train_step donates its inputs)."""
    return {"/".join(map(str, path)): np.array(jax.device_get(var.get_value()))
            for path, var in nnx.to_flat_state(nnx.state(obj))}


def same_bits(a, b) -> bool:
    """Bit-identical arrays: dtype, shape and bytes (NaN == NaN, 0.0 != -0.0)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert same_bits(a[key], b[key]), key


def deep_clone(obj):
    """A copy with its own buffers (nnx.clone shares them, and train_step donates them)."""
    graphdef, state = nnx.split(obj)
    device = jax.devices()[0]
    return nnx.merge(graphdef, jax.tree.map(lambda a: jax.device_put(jnp.array(a, copy=True), device), state))


def host_stats(optimizer: nnx.Optimizer) -> dict[str, np.ndarray]:
    return {k: np.asarray(jax.device_get(v)) for k, v in optimizer_stats(optimizer).items()}


def make_meta(step: int, *, is_best: bool = False, **extra) -> dict:
    meta = {
        "format": 1,
        "step": step,
        "train_loss": {"min": 3.25, "max": 4.5, "mean": 4.0, "last": 3.875},
        "is_best": is_best,
        "data_position": {"next_step": step, "microbatches_consumed": 2 * step, "epoch": 0},
        "rng": {"seed": TCFG.seed, "next_step": step, "scheme": "fold_in(key(seed), step)"},
    }
    meta.update(extra)
    return meta


def ckpt_name(step: int, now: dt.datetime = T0) -> str:
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-step-{step}"


def fake_ckpt(run: Path, name: str, step: int | None = None) -> Path:
    """A folder that only looks complete (meta.json): enough for listing and resolution."""
    path = run / "checkpoints" / name
    path.mkdir(parents=True)
    step = int(name.rsplit("-", 1)[1]) if step is None else step
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return path


def entries(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def assert_one_line_error(err: pytest.ExceptionInfo, path: Path) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def trained() -> tuple[nnx.Module, nnx.Optimizer, dict]:
    """A model and optimiser after two optimiser steps plus one microbatch of an open window
    (train_step compiles here, once for the whole module)."""
    model, optimizer = fresh(seed=0)
    for s in range(2):
        x, y = batch(s)
        train_step(model, optimizer, x, y, step_key(TCFG.seed, s))
    # One microbatch by hand: MultiSteps (k=2) now holds half a window in acc_grads. The gradient
    # is synthetic but deterministic and non-zero: a jitted loss gradient would cost a long compile.
    grads = jax.tree.map(lambda p: jnp.cos(p) * 0.01, nnx.state(model, nnx.Param))
    apply_update(model, optimizer, grads)
    meta = make_meta(2, is_best=True)
    return model, optimizer, meta


@pytest.fixture(scope="module")
def template(tmp_path_factory, trained) -> Path:
    """A run directory (model.json, train.json) with one real checkpoint at step 2."""
    model, optimizer, meta = trained
    run = tmp_path_factory.mktemp("template") / "run"
    run.mkdir()
    for filename, cfg in CONFIGS.items():
        (run / filename).write_text(json.dumps(cfg))
    ck.save_checkpoint(run, model, optimizer, meta, CONFIGS, keep_last=3, now=T0)
    return run


@pytest.fixture
def run(tmp_path: Path, template: Path) -> Path:
    """A private copy of the template run, symlinks kept as symlinks."""
    dst = tmp_path / "run"
    shutil.copytree(template, dst, symlinks=True)
    return dst


@pytest.fixture
def ckpt(run: Path) -> Path:
    return run / "checkpoints" / ckpt_name(2)


# ----------------------------------------------------------------------------- round trip


def test_round_trip_is_bit_exact_and_training_continues_identically(tmp_path: Path, trained) -> None:
    # Clones: this test trains on, and the module's other tests expect the fixture untouched.
    model, optimizer, meta = deep_clone(trained[0]), deep_clone(trained[1]), trained[2]
    stats = host_stats(optimizer)
    # The state is worth checking: moments from two applied steps, one microbatch in an open window.
    assert int(stats["gradient_step"]) == 2 and int(stats["mini_step"]) == 1
    opt_leaves = flat(optimizer)
    for kind in ("acc_grads", "/mu/", "/nu/"):
        chosen = [v for k, v in opt_leaves.items() if kind in k]
        assert chosen and all(np.any(v != 0) for v in chosen if v.ndim == 2), kind

    path = ck.save_checkpoint(tmp_path / "run", model, optimizer, meta, CONFIGS, keep_last=3)
    model2, optimizer2 = fresh(seed=1)
    before_model, before_opt = flat(model2), flat(optimizer2)
    # Not vacuous: the fresh pair differs from the trained one before loading.
    assert any(not same_bits(before_model[k], v) for k, v in flat(model).items())
    assert any(not same_bits(before_opt[k], v) for k, v in opt_leaves.items())

    loaded_meta = ck.load_checkpoint(path, model2, optimizer2)
    assert loaded_meta == meta
    assert ck.read_meta(path) == meta
    assert ck.read_configs(path) == CONFIGS
    restored = ck.read_meta(path)
    assert (restored["step"], restored["data_position"], restored["rng"]) == (
        meta["step"], meta["data_position"], meta["rng"])

    assert_identical(flat(model), flat(model2))
    assert_identical(opt_leaves, flat(optimizer2))
    stats2 = host_stats(optimizer2)
    assert stats.keys() == stats2.keys()
    for key in stats:
        assert same_bits(stats[key], stats2[key]), key

    restored_params = flat(model2)
    # One more train_step from each (its first microbatch closes the restored open window, so the
    # restored acc_grads count): the same losses, parameters and optimiser state, bit for bit.
    x, y = batch(3)
    key = step_key(restored["rng"]["seed"], restored["step"])
    losses_a, stats_a = train_step(model, optimizer, x, y, key)
    losses_b, stats_b = train_step(model2, optimizer2, x, y, key)
    assert same_bits(losses_a, losses_b)
    assert_identical(flat(model), flat(model2))
    assert_identical(flat(optimizer), flat(optimizer2))
    for k in stats_a:
        assert same_bits(stats_a[k], stats_b[k]), k
    assert int(np.asarray(stats_b["gradient_step"])) == 3
    assert not same_bits(flat(model2)["head/kernel"], restored_params["head/kernel"])  # it stepped


def test_weights_only_load_leaves_optimizer_alone(ckpt: Path, trained) -> None:
    meta = trained[2]
    saved = load_file(str(ckpt / "model.safetensors"))
    model2, optimizer2 = fresh(seed=3)
    opt_before = flat(optimizer2)
    assert ck.load_checkpoint(ckpt, model2) == meta
    weights = ck.weights_to_numpy(model2)
    assert weights.keys() == saved.keys()
    for key in saved:
        assert same_bits(weights[key], saved[key]), key
    assert_identical(opt_before, flat(optimizer2))


def test_safetensors_file_has_dotted_keys(ckpt: Path, trained) -> None:
    model, _, _ = trained
    tensors = load_file(str(ckpt / "model.safetensors"))
    expected = {f"blocks.{i}.{name}" for i in range(MCFG.n_layers) for name in (
        "ln1.scale", "ln1.bias", "attn.qkv.kernel", "attn.proj.kernel", "attn.proj.bias",
        "ln2.scale", "ln2.bias", "mlp.fc.kernel", "mlp.fc.bias", "mlp.out.kernel", "mlp.out.bias")}
    expected |= {"tok_emb.embedding", "pos_emb.embedding", "ln_f.scale", "ln_f.bias", "head.kernel"}
    assert set(tensors) == expected
    C, V = MCFG.emb_dim, MCFG.vocab_size
    assert tensors["blocks.0.attn.qkv.kernel"].shape == (C, 3 * C)
    assert tensors["tok_emb.embedding"].shape == (V, C)
    assert tensors["head.kernel"].shape == (C, V)
    assert all(v.dtype == np.float32 for v in tensors.values())
    # The file holds exactly the model's parameters.
    weights = ck.weights_to_numpy(model)
    for key, arr in tensors.items():
        assert same_bits(arr, weights[key]), key
    # save_weights / load_weights on their own also round-trip exactly.
    ck.save_weights(model, ckpt.parent / "solo.safetensors")
    model2, _ = fresh(seed=5)
    ck.load_weights(model2, ckpt.parent / "solo.safetensors")
    assert_identical(flat(model), flat(model2))


# ----------------------------------------------------------------------------- layout


def test_layout_and_links(tmp_path: Path, trained) -> None:
    model, optimizer, _ = trained
    run = tmp_path / "run"
    root = run / "checkpoints"
    first = ck.save_checkpoint(run, model, optimizer, make_meta(10, is_best=True), CONFIGS, keep_last=5, now=T0)
    assert first == root / "20260102T030405Z-step-10"
    assert {"model.safetensors", "optimizer", "meta.json", "model.json", "train.json"} <= entries(first)
    assert (first / "optimizer").is_dir() and any((first / "optimizer").iterdir())
    assert json.loads((first / "meta.json").read_text()) == make_meta(10, is_best=True)
    assert json.loads((first / "model.json").read_text()) == CONFIGS["model.json"]
    assert json.loads((first / "train.json").read_text()) == CONFIGS["train.json"]
    assert not [p for p in first.rglob("*") if p.name.endswith(".tmp")]  # no half-written json
    for link in ("latest", "best"):
        assert (root / link).is_symlink()
        assert os.readlink(root / link) == first.name  # relative, not absolute
        assert (root / link).resolve() == first.resolve()

    # Not best: latest moves, best stays.
    second = ck.save_checkpoint(run, model, optimizer, make_meta(20), CONFIGS, keep_last=5,
                                now=T0 + dt.timedelta(minutes=1))
    assert os.readlink(root / "latest") == second.name
    assert os.readlink(root / "best") == first.name
    # is_best: both move.
    third = ck.save_checkpoint(run, model, optimizer, make_meta(30, is_best=True), CONFIGS, keep_last=5,
                               now=T0 + dt.timedelta(minutes=2))
    assert os.readlink(root / "latest") == os.readlink(root / "best") == third.name
    # Default `now`: a real UTC stamp in the name.
    fourth = ck.save_checkpoint(run, model, optimizer, make_meta(40), CONFIGS, keep_last=5)
    assert NAME_RE.match(fourth.name) and fourth.name.endswith("-step-40")
    assert ck.list_checkpoints(run) == [first, second, third, fourth]
    assert ck.latest_checkpoint(run) == fourth.resolve()
    # Only the four checkpoints, the two links and nothing temporary.
    assert entries(root) == {first.name, second.name, third.name, fourth.name, "latest", "best"}


def test_same_step_saved_twice_in_one_second_keeps_the_newer(run: Path, ckpt: Path, trained) -> None:
    model, optimizer, _ = trained
    newer = make_meta(2, is_best=True, note="second save")
    again = ck.save_checkpoint(run, model, optimizer, newer, CONFIGS, keep_last=3, now=T0)
    assert again == ckpt
    assert ck.read_meta(ckpt) == newer
    assert ck.list_checkpoints(run) == [ckpt]
    assert entries(run / "checkpoints") == {ckpt.name, "latest", "best"}
    model2, optimizer2 = fresh()
    assert ck.load_checkpoint(run / "checkpoints" / "latest", model2, optimizer2) == newer


# ----------------------------------------------------------------------------- pruning


def test_prune_keeps_last_k_and_best_and_records_history(tmp_path: Path, trained) -> None:
    model, optimizer, _ = trained
    run = tmp_path / "run"
    root = run / "checkpoints"
    metas, paths = {}, {}
    for i, step in enumerate((1, 2, 3, 4, 5)):
        metas[step] = make_meta(step, is_best=step <= 2, val_loss=10.0 - step)
        paths[step] = ck.save_checkpoint(run, model, optimizer, metas[step], CONFIGS, keep_last=2,
                                         now=T0 + dt.timedelta(minutes=i))
        if step == 3:
            assert ck.list_checkpoints(run) == [paths[2], paths[3]]  # 1 pruned; 2 is newest-but-one and best
    assert ck.list_checkpoints(run) == [paths[2], paths[4], paths[5]]
    assert os.readlink(root / "best") == paths[2].name
    assert os.readlink(root / "latest") == paths[5].name
    for step in (1, 3):
        assert not paths[step].exists()
    assert entries(root) == {paths[2].name, paths[4].name, paths[5].name, "latest", "best", "history"}
    history = root / "history"
    assert entries(history) == {f"{paths[1].name}.json", f"{paths[3].name}.json"}
    for step in (1, 3):
        assert json.loads((history / f"{paths[step].name}.json").read_text()) == metas[step]
    # The kept best is still a complete checkpoint, loadable into make_optimizer's optimiser.
    model2 = build_model(MCFG, seed=4)
    optimizer2 = make_optimizer(model2, TCFG, TOTAL_STEPS)
    assert ck.load_checkpoint(root / "best", model2, optimizer2) == metas[2]
    assert_identical(flat(optimizer2), flat(optimizer))


def test_list_checkpoints_ignores_temp_pruned_incomplete_and_links(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert ck.list_checkpoints(run) == []
    good9 = fake_ckpt(run, "20260102T000000Z-step-9")
    good10 = fake_ckpt(run, "20260101T000000Z-step-10")  # older stamp, higher step: sorts by step
    fake_ckpt(run, ".tmp-20260103T000000Z-step-11")
    fake_ckpt(run, ".pruned-20260103T000000Z-step-12", step=12)
    (run / "checkpoints" / "20260103T000000Z-step-13").mkdir()  # no meta.json: incomplete
    fake_ckpt(run, "not-a-checkpoint", step=14)
    fake_ckpt(run, "history", step=15)
    os.symlink(good9.name, run / "checkpoints" / "20260104T000000Z-step-16")  # a link is never one
    (run / "checkpoints" / "20260104T000000Z-step-17").write_text("a file")
    assert ck.list_checkpoints(run) == [good9, good10]
    assert ck.latest_checkpoint(run) == good10  # no latest link: the highest step


# ----------------------------------------------------------------------------- atomicity


def test_killed_save_leaves_previous_checkpoint_latest_and_next_save_cleans_up(run: Path, ckpt: Path,
                                                                            trained) -> None:
    root = run / "checkpoints"
    # A save killed mid-write: partial weights, no meta.json ...
    partial = root / f".tmp-{ckpt_name(3, T0 + dt.timedelta(minutes=1))}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:100])
    # ... one killed just before its rename (complete-looking) ...
    complete = root / f".tmp-{ckpt_name(4, T0 + dt.timedelta(minutes=2))}"
    shutil.copytree(ckpt, complete)
    # ... a prune killed between its rename and its rmtree, and a link swap killed half way.
    pruned = root / f".pruned-{ckpt_name(1, T0 - dt.timedelta(minutes=1))}"
    shutil.copytree(ckpt, pruned)
    os.symlink(complete.name, root / ".latest.tmp")

    assert ck.list_checkpoints(run) == [ckpt]
    assert ck.latest_checkpoint(run) == ckpt.resolve()
    assert ck.resolve_checkpoint(run) == ckpt.resolve()
    (root / "latest").unlink()  # even with the link gone the fallback ignores the dot-folders
    assert ck.latest_checkpoint(run) == ckpt

    model, optimizer, _ = trained
    new = ck.save_checkpoint(run, model, optimizer, make_meta(5), CONFIGS, keep_last=3,
                             now=T0 + dt.timedelta(minutes=3))
    assert entries(root) == {ckpt.name, new.name, "latest", "best"}
    assert os.readlink(root / "latest") == new.name
    assert os.readlink(root / "best") == ckpt.name


@pytest.mark.parametrize("failure", ["weights", "meta"])
def test_failed_save_raises_and_keeps_previous_latest(run: Path, ckpt: Path, trained, monkeypatch,
                                                       failure: str) -> None:
    model, optimizer, _ = trained
    root = run / "checkpoints"
    before = entries(root)
    meta = make_meta(3)
    if failure == "weights":
        def boom(*_args, **_kwargs):
            raise RuntimeError("disk full (simulated)")
        # save_file is the module's own name for the safetensors writer, whichever helper calls it.
        monkeypatch.setattr(ck, "save_file", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            ck.save_checkpoint(run, model, optimizer, meta, CONFIGS, keep_last=3,
                               now=T0 + dt.timedelta(minutes=1))
    else:
        # Fails at the very end: weights and Orbax state are written, meta.json cannot be.
        meta["unserialisable"] = object()
        with pytest.raises(TypeError):
            ck.save_checkpoint(run, model, optimizer, meta, CONFIGS, keep_last=3,
                               now=T0 + dt.timedelta(minutes=1))
    assert os.readlink(root / "latest") == ckpt.name
    assert ck.latest_checkpoint(run) == ckpt.resolve()
    assert ck.list_checkpoints(run) == [ckpt]
    assert [p.name for p in root.iterdir() if NAME_RE.match(p.name)] == [ckpt.name]
    left = entries(root) - before
    assert all(name.startswith(".tmp-") for name in left), left
    # meta.json is written last: a folder that failed earlier never looks complete.
    assert not any((root / name / "meta.json").exists() for name in left)

    monkeypatch.undo()
    new = ck.save_checkpoint(run, model, optimizer, make_meta(3), CONFIGS, keep_last=3,
                             now=T0 + dt.timedelta(minutes=2))
    assert entries(root) == before | {new.name}
    assert ck.latest_checkpoint(run) == new.resolve()


# ----------------------------------------------------------------------------- finding checkpoints


def test_latest_falls_back_to_highest_step(run: Path, ckpt: Path) -> None:
    root = run / "checkpoints"
    higher = fake_ckpt(run, "20250101T000000Z-step-7")  # earlier stamp, higher step
    assert ck.latest_checkpoint(run) == ckpt.resolve()  # the link wins while it is valid
    (root / "latest").unlink()
    assert ck.latest_checkpoint(run) == higher
    os.symlink("20990101T000000Z-step-99", root / "latest")  # dangling link
    assert ck.latest_checkpoint(run) == higher
    (root / "latest").unlink()
    incomplete = root / "20990101T000000Z-step-100"
    incomplete.mkdir()
    os.symlink(incomplete.name, root / "latest")  # link to a folder without meta.json
    assert ck.latest_checkpoint(run) == higher
    assert ck.latest_checkpoint(run.parent / "nowhere") is None


def test_resolve_checkpoint_accepts_run_checkpoint_and_links(run: Path, ckpt: Path) -> None:
    expected = ckpt.resolve()
    assert ck.resolve_checkpoint(run) == expected
    assert ck.resolve_checkpoint(ckpt) == expected
    assert ck.resolve_checkpoint(run / "checkpoints" / "latest") == expected
    assert ck.resolve_checkpoint(run / "checkpoints" / "best") == expected
    assert ck.resolve_checkpoint(str(ckpt)) == expected
    # A run without model.json is still recognised by its checkpoints/ folder.
    (run / "model.json").unlink()
    assert ck.resolve_checkpoint(run) == expected


def test_resolve_checkpoint_errors(tmp_path: Path) -> None:
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "notes.txt").write_text("hello")
    for path in (neither, tmp_path / "missing"):
        with pytest.raises(CheckpointError, match="neither a checkpoint") as err:
            ck.resolve_checkpoint(path)
        assert_one_line_error(err, path)

    untrained = tmp_path / "untrained"
    untrained.mkdir()
    (untrained / "model.json").write_text(json.dumps(CONFIGS["model.json"]))
    only_leftovers = tmp_path / "leftovers"
    fake_ckpt(only_leftovers, ".tmp-20260102T000000Z-step-3", step=3)
    (only_leftovers / "checkpoints" / "history").mkdir()
    for path in (untrained, only_leftovers):
        with pytest.raises(CheckpointError, match="no checkpoint") as err:
            ck.resolve_checkpoint(path)
        assert_one_line_error(err, path)


def test_step_of() -> None:
    assert ck.step_of(Path("x/20260102T030405Z-step-1234")) == 1234
    with pytest.raises(CheckpointError, match="not a checkpoint folder name"):
        ck.step_of(Path("latest"))


# ----------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("content", ["{\"step\": 2, \"is_", "", "[1, 2]", "{\"loss\": 1.0}",
                                     "{\"step\": \"2\"}", "{\"step\": 2.5}"])
def test_corrupt_meta_json(ckpt: Path, content: str) -> None:
    (ckpt / "meta.json").write_text(content)
    with pytest.raises(CheckpointError) as err:
        ck.read_meta(ckpt)
    assert_one_line_error(err, ckpt / "meta.json")
    model, optimizer = fresh()
    with pytest.raises(CheckpointError) as err:
        ck.load_checkpoint(ckpt, model, optimizer)
    assert_one_line_error(err, ckpt / "meta.json")


def test_missing_meta_json(ckpt: Path) -> None:
    (ckpt / "meta.json").unlink()
    model, _ = fresh()
    with pytest.raises(CheckpointError, match="not found") as err:
        ck.load_checkpoint(ckpt, model)
    assert_one_line_error(err, ckpt / "meta.json")


def test_binary_garbage_meta_json(ckpt: Path) -> None:
    (ckpt / "meta.json").write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(CheckpointError) as err:
        ck.read_meta(ckpt)
    assert_one_line_error(err, ckpt / "meta.json")


def _truncate_tail(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


@pytest.mark.parametrize("damage", ["missing", "truncated", "header-only", "garbage", "empty", "directory"])
def test_damaged_weights_file(ckpt: Path, damage: str) -> None:
    weights = ckpt / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    elif damage == "truncated":
        _truncate_tail(weights)
    elif damage == "header-only":
        weights.write_bytes(weights.read_bytes()[:40])
    elif damage == "garbage":
        weights.write_bytes(b"this is not a safetensors file" * 10)
    elif damage == "empty":
        weights.write_bytes(b"")
    else:
        weights.unlink()
        weights.mkdir()
    model, optimizer = fresh()
    before = flat(model)
    with pytest.raises(CheckpointError, match="not found" if damage == "missing" else "unreadable") as err:
        ck.load_checkpoint(ckpt, model, optimizer)
    assert_one_line_error(err, weights)
    assert_identical(before, flat(model))  # nothing half-loaded


@pytest.mark.parametrize("change, match", [
    ({"vocab_size": 65}, "has shape"),
    ({"n_layers": 3}, "missing"),
    ({"n_layers": 1}, "unexpected"),
    ({"tie_embeddings": True}, "unexpected"),
    ({"qkv_bias": True}, "missing"),
])
def test_weights_do_not_match_changed_model_json(ckpt: Path, change: dict, match: str) -> None:
    cfg = ModelConfig(**{**CONFIGS["model.json"], **change})
    model, optimizer = fresh(cfg=cfg)
    before = flat(model)
    with pytest.raises(CheckpointError, match=match) as err:
        ck.load_checkpoint(ckpt, model, optimizer)
    assert_one_line_error(err, ckpt / "model.safetensors")
    assert_identical(before, flat(model))


def test_load_weights_rejects_extra_or_missing_key(tmp_path: Path, trained) -> None:
    model, _, _ = trained
    tensors = ck.weights_to_numpy(model)
    extra = tmp_path / "extra.safetensors"
    save_file({**tensors, "blocks.9.attn.qkv.kernel": np.zeros((2, 2), np.float32)}, str(extra))
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in tensors.items() if k != "ln_f.bias"}, str(missing))
    cases = ((extra, r"unexpected \['blocks\.9\.attn\.qkv\.kernel'\]"), (missing, r"missing \['ln_f\.bias'\]"))
    for path, match in cases:
        target, _ = fresh()
        with pytest.raises(CheckpointError, match=match) as err:
            ck.load_weights(target, path)
        assert_one_line_error(err, path)


def _damage_optimizer(opt: Path, damage: str) -> None:
    if damage == "deleted":
        shutil.rmtree(opt)
    elif damage == "emptied":
        shutil.rmtree(opt)
        opt.mkdir()
    elif damage == "state-deleted":
        shutil.rmtree(opt / "state")
    elif damage == "metadata-garbage":
        (opt / "state" / "_METADATA").write_text("{not json")
    elif damage == "data-truncated":
        data = [p for p in opt.rglob("*") if p.is_file() and p.parent.name == "d"]
        assert data
        for p in data:
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    else:
        raise AssertionError(damage)


class _DamagedReadNoise(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for reads of our damaged folders only.

    When Orbax's concurrent tensorstore reads fail, the first error is raised (and wrapped by
    load_checkpoint), the others stay in abandoned tasks that asyncio logs when they are collected,
    possibly at interpreter exit, after pytest's log capture: noise about a deliberate damage.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("never retrieved" in msg and "test_damaged_optimizer_folder" in msg)


# Those abandoned tasks may also report into their closed event loop while a test runs.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["deleted", "emptied", "state-deleted", "metadata-garbage", "data-truncated"])
def test_damaged_optimizer_folder(ckpt: Path, damage: str) -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _DamagedReadNoise) for f in asyncio_log.filters):
        asyncio_log.addFilter(_DamagedReadNoise())  # kept: the late reports come after this test
    opt = ckpt / "optimizer"
    _damage_optimizer(opt, damage)
    model, optimizer = fresh()
    before = flat(optimizer)
    with pytest.raises(CheckpointError, match="not found" if damage == "deleted" else "cannot restore") as err:
        ck.load_checkpoint(ckpt, model, optimizer)
    assert_one_line_error(err, opt)
    assert_identical(before, flat(optimizer))
    # The weights alone are still usable.
    model2, _ = fresh()
    assert ck.load_checkpoint(ckpt, model2)["step"] == 2


# ----------------------------------------------------------------------------- move_aside


def test_move_aside_keeps_everything(run: Path, ckpt: Path) -> None:
    root = run / "checkpoints"
    fake_ckpt(run, ".tmp-20260102T000000Z-step-3", step=3)
    (root / "history").mkdir()
    (root / "history" / "old.json").write_text("{}")
    snapshot = {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else
                                           p.read_bytes() if p.is_file() else None)
                for p in root.rglob("*")}
    target = ck.move_aside(run)
    assert target is not None and target.parent == run
    assert re.fullmatch(r"checkpoints\.old-\d{8}T\d{6}Z", target.name)
    assert not root.exists()
    moved = {str(p.relative_to(target)): (os.readlink(p) if p.is_symlink() else
                                          p.read_bytes() if p.is_file() else None)
             for p in target.rglob("*")}
    assert moved == snapshot
    assert ck.list_checkpoints(run) == []
    assert ck.latest_checkpoint(run) is None
    with pytest.raises(CheckpointError, match="no checkpoint"):
        ck.resolve_checkpoint(run)  # model.json is still there: a run with nothing to resume
    # The moved checkpoint is intact and loadable through its relative links.
    model, optimizer = fresh()
    assert ck.load_checkpoint(target / "latest", model, optimizer)["step"] == 2
    assert ck.move_aside(run) is None  # nothing left to move


def test_move_aside_twice_in_one_second(tmp_path: Path, monkeypatch) -> None:
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return T0

    monkeypatch.setattr(ck, "dt", types.SimpleNamespace(datetime=Frozen, timezone=dt.timezone))
    run = tmp_path / "run"
    fake_ckpt(run, "20260101T000000Z-step-1")
    first = ck.move_aside(run)
    fake_ckpt(run, "20260101T000000Z-step-2")
    second = ck.move_aside(run)
    assert first != second
    assert (first / "20260101T000000Z-step-1" / "meta.json").is_file()
    assert (second / "20260101T000000Z-step-2" / "meta.json").is_file()
