"""checkpointing.py on real files: bit-exact round trips, layout, pruning, atomicity, damaged checkpoints.

Everything goes through real safetensors and Orbax on files under tmp_path (no mocks, CPU only).
One tiny GPT-2 is trained once per session (conftest.trained: a single train_step compile);
damaged-checkpoint tests copy one saved checkpoint instead of saving their own.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from checkpoint_helpers import (
    CONFIGS,
    MCFG,
    NAME_RE,
    T0,
    TCFG,
    TOTAL_STEPS,
    assert_identical,
    assert_one_line_error,
    batch,
    ckpt_name,
    deep_clone,
    entries,
    flat,
    fresh,
    host_stats,
    make_meta,
    same_bits,
    without_files,
)
from flax import nnx
from jax.experimental.layout import Format, Layout
from safetensors.numpy import load_file, save_file

from jaxgpt.checkpoints import store as ck
from jaxgpt.checkpoints.store import CheckpointError
from jaxgpt.config import ModelConfig
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.files import write_tensors
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.train_step import step_key, train_step

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
    assert without_files(loaded_meta) == meta
    assert without_files(ck.read_meta(path)) == meta
    # meta.json records every other file of the checkpoint, as it is on disk.
    files = loaded_meta["files"]
    assert {"model.safetensors", "model.json", "train.json"} <= set(files) and any(
        f.startswith("optimizer/") for f in files
    )
    assert files == {
        str(p.relative_to(path)): {
            "size": p.stat().st_size,
            "sha256": ck.file_records(path)[str(p.relative_to(path))]["sha256"],
        }
        for p in path.rglob("*")
        if p.is_file() and p.name != "meta.json"
    }
    assert ck.verify_checkpoint(path) is None
    assert ck.read_configs(path) == CONFIGS
    restored = ck.read_meta(path)
    assert (restored["step"], restored["data_position"], restored["rng"]) == (
        meta["step"],
        meta["data_position"],
        meta["rng"],
    )

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
    losses_a, stats_a = train_step(model, optimizer, Batch(x, y), key)
    losses_b, stats_b = train_step(model2, optimizer2, Batch(x, y), key)
    assert same_bits(losses_a, losses_b)
    assert_identical(flat(model), flat(model2))
    assert_identical(flat(optimizer), flat(optimizer2))
    for k in stats_a:
        assert same_bits(stats_a[k], stats_b[k]), k
    assert int(np.asarray(stats_b["gradient_step"])) == 3
    assert not same_bits(flat(model2)["head/kernel"], restored_params["head/kernel"])  # it stepped


def test_round_trip_of_parameters_laid_out_column_major(tmp_path: Path, trained) -> None:
    """A device array laid out column-major comes to the host column-major (NumPy's Fortran order), and
    safetensors writes an array's memory as it lies: such weights came back scrambled, a trained model
    loaded as an untrained one (on a TPU the file differed from the weights it was written from). The
    CPU lays an array out so when asked: the round trip of such parameters, run on a CPU."""
    model = deep_clone(trained[0])
    columns = lambda a: jax.device_put(a, Format(Layout(tuple(reversed(range(a.ndim)))), a.sharding))  # noqa: E731
    nnx.update(model, jax.tree.map(lambda a: columns(a) if a.ndim >= 2 else a, nnx.state(model, nnx.Param)))
    host = {
        "/".join(map(str, path)): jax.device_get(var.get_value())
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }
    assert any(v.flags.f_contiguous and not v.flags.c_contiguous for v in host.values())  # the mechanism is there
    ck.save_weights(model, tmp_path / "w.safetensors")
    loaded = build_model(MCFG, seed=1)
    ck.load_weights(loaded, tmp_path / "w.safetensors")
    assert_identical({k: np.ascontiguousarray(v) for k, v in host.items()}, flat(loaded))
    path = ck.save_checkpoint(tmp_path / "run", model, deep_clone(trained[1]), trained[2], CONFIGS, keep_last=3)
    again = build_model(MCFG, seed=1)
    ck.load_checkpoint(path, again)
    assert_identical(flat(loaded), flat(again))


def test_write_tensors_writes_row_major_whatever_the_memory_order(tmp_path: Path) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    views = {"fortran": np.asfortranarray(a), "transposed": a.transpose(1, 0, 2), "strided": a[:, ::2]}
    write_tensors(views, tmp_path / "t.safetensors")
    back = load_file(str(tmp_path / "t.safetensors"))
    assert {k: back[k].tolist() for k in views} == {k: v.tolist() for k, v in views.items()}


def test_weights_only_load_leaves_optimizer_alone(ckpt: Path, trained) -> None:
    meta = trained[2]
    saved = load_file(str(ckpt / "model.safetensors"))
    model2, optimizer2 = fresh(seed=3)
    opt_before = flat(optimizer2)
    assert without_files(ck.load_checkpoint(ckpt, model2)) == meta
    weights = ck.weights_to_numpy(model2)
    assert weights.keys() == saved.keys()
    for key in saved:
        assert same_bits(weights[key], saved[key]), key
    assert_identical(opt_before, flat(optimizer2))


def test_safetensors_file_has_dotted_keys(ckpt: Path, trained) -> None:
    model, _, _ = trained
    tensors = load_file(str(ckpt / "model.safetensors"))
    expected = {
        f"blocks.{i}.{name}"
        for i in range(MCFG.n_layers)
        for name in (
            "ln1.scale",
            "ln1.bias",
            "attn.qkv.kernel",
            "attn.proj.kernel",
            "attn.proj.bias",
            "ln2.scale",
            "ln2.bias",
            "mlp.fc.kernel",
            "mlp.fc.bias",
            "mlp.out.kernel",
            "mlp.out.bias",
        )
    }
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
    assert without_files(json.loads((first / "meta.json").read_text())) == make_meta(10, is_best=True)
    assert json.loads((first / "model.json").read_text()) == CONFIGS["model.json"]
    assert json.loads((first / "train.json").read_text()) == CONFIGS["train.json"]
    assert not [p for p in first.rglob("*") if p.name.endswith(".tmp")]  # no half-written json
    for link in ("latest", "best"):
        assert (root / link).is_symlink()
        assert os.readlink(root / link) == first.name  # relative, not absolute
        assert (root / link).resolve() == first.resolve()

    # Not best: latest moves, best stays.
    second = ck.save_checkpoint(
        run, model, optimizer, make_meta(20), CONFIGS, keep_last=5, now=T0 + dt.timedelta(minutes=1)
    )
    assert os.readlink(root / "latest") == second.name
    assert os.readlink(root / "best") == first.name
    # is_best: both move.
    third = ck.save_checkpoint(
        run, model, optimizer, make_meta(30, is_best=True), CONFIGS, keep_last=5, now=T0 + dt.timedelta(minutes=2)
    )
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
    assert without_files(ck.read_meta(ckpt)) == newer
    assert ck.list_checkpoints(run) == [ckpt]
    assert entries(run / "checkpoints") == {ckpt.name, "latest", "best"}
    model2, optimizer2 = fresh()
    assert without_files(ck.load_checkpoint(run / "checkpoints" / "latest", model2, optimizer2)) == newer


# ----------------------------------------------------------------------------- pruning


def test_prune_keeps_last_k_and_best_and_nothing_else(tmp_path: Path, trained) -> None:
    model, optimizer, _ = trained
    run = tmp_path / "run"
    root = run / "checkpoints"
    metas, paths = {}, {}
    for i, step in enumerate((1, 2, 3, 4, 5)):
        metas[step] = make_meta(step, is_best=step <= 2, val_loss=10.0 - step)
        paths[step] = ck.save_checkpoint(
            run, model, optimizer, metas[step], CONFIGS, keep_last=2, now=T0 + dt.timedelta(minutes=i)
        )
        if step == 3:
            assert ck.list_checkpoints(run) == [paths[2], paths[3]]  # 1 pruned; 2 is newest-but-one and best
    assert ck.list_checkpoints(run) == [paths[2], paths[4], paths[5]]
    assert os.readlink(root / "best") == paths[2].name
    assert os.readlink(root / "latest") == paths[5].name
    for step in (1, 3):
        assert not paths[step].exists()
    # Nothing of the pruned ones is left (the run's record, metrics.jsonl, keeps their steps).
    assert entries(root) == {paths[2].name, paths[4].name, paths[5].name, "latest", "best"}
    # The kept best is still a complete checkpoint, loadable into make_optimizer's optimiser.
    model2 = build_model(MCFG, seed=4)
    optimizer2 = make_optimizer(model2, TCFG, TOTAL_STEPS)
    assert without_files(ck.load_checkpoint(root / "best", model2, optimizer2)) == metas[2]
    assert_identical(flat(optimizer2), flat(optimizer))


# ----------------------------------------------------------------------------- atomicity


def test_killed_save_leaves_previous_checkpoint_latest_and_next_save_cleans_up(run: Path, ckpt: Path, trained) -> None:
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
    new = ck.save_checkpoint(
        run, model, optimizer, make_meta(5), CONFIGS, keep_last=3, now=T0 + dt.timedelta(minutes=3)
    )
    assert entries(root) == {ckpt.name, new.name, "latest", "best"}
    assert os.readlink(root / "latest") == new.name
    assert os.readlink(root / "best") == ckpt.name


@pytest.mark.parametrize("failure", ["weights", "meta"])
def test_failed_save_raises_and_keeps_previous_latest(
    run: Path, ckpt: Path, trained, monkeypatch, failure: str
) -> None:
    model, optimizer, _ = trained
    root = run / "checkpoints"
    before = entries(root)
    meta = make_meta(3)
    if failure == "weights":

        def boom(*_args, **_kwargs):
            raise RuntimeError("disk full (simulated)")

        # write_tensors is the module's own name for the safetensors writer, whichever helper calls it.
        monkeypatch.setattr(ck, "write_tensors", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            ck.save_checkpoint(run, model, optimizer, meta, CONFIGS, keep_last=3, now=T0 + dt.timedelta(minutes=1))
    else:
        # Fails at the very end: weights and Orbax state are written, meta.json cannot be.
        meta["unserialisable"] = object()
        with pytest.raises(TypeError):
            ck.save_checkpoint(run, model, optimizer, meta, CONFIGS, keep_last=3, now=T0 + dt.timedelta(minutes=1))
    assert os.readlink(root / "latest") == ckpt.name
    assert ck.latest_checkpoint(run) == ckpt.resolve()
    assert ck.list_checkpoints(run) == [ckpt]
    assert [p.name for p in root.iterdir() if NAME_RE.match(p.name)] == [ckpt.name]
    left = entries(root) - before
    assert all(name.startswith(".tmp-") for name in left), left
    # meta.json is written last: a folder that failed earlier never looks complete.
    assert not any((root / name / "meta.json").exists() for name in left)

    monkeypatch.undo()
    new = ck.save_checkpoint(
        run, model, optimizer, make_meta(3), CONFIGS, keep_last=3, now=T0 + dt.timedelta(minutes=2)
    )
    assert entries(root) == before | {new.name}
    assert ck.latest_checkpoint(run) == new.resolve()


# ----------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize(
    "content", ['{"step": 2, "is_', "", "[1, 2]", '{"loss": 1.0}', '{"step": "2"}', '{"step": 2.5}']
)
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


@pytest.mark.parametrize(
    "change, match",
    [
        ({"vocab_size": 65}, "has shape"),
        ({"n_layers": 3}, "missing"),
        ({"n_layers": 1}, "unexpected"),
        ({"tie_embeddings": True}, "unexpected"),
        ({"qkv_bias": True}, "missing"),
    ],
)
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
