"""checkpoint_files.py (the JAX-free half of checkpointing): listing, finding and resolving
checkpoints, and moving a run's checkpoints aside, on real files."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import types
from pathlib import Path

import pytest
from checkpoint_helpers import CONFIGS, T0, assert_one_line_error, fake_ckpt, fresh

from jaxgpt.checkpoints import layout as cf
from jaxgpt.checkpoints import store as ck
from jaxgpt.checkpoints.layout import CheckpointError

# ----------------------------------------------------------------------------- listing


def test_list_checkpoints_ignores_temp_pruned_incomplete_and_links(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert cf.list_checkpoints(run) == []
    good9 = fake_ckpt(run, "20260102T000000Z-step-9")
    good10 = fake_ckpt(run, "20260101T000000Z-step-10")  # older stamp, higher step: sorts by step
    fake_ckpt(run, ".tmp-20260103T000000Z-step-11")
    fake_ckpt(run, ".pruned-20260103T000000Z-step-12", step=12)
    (run / "checkpoints" / "20260103T000000Z-step-13").mkdir()  # no meta.json: incomplete
    fake_ckpt(run, "not-a-checkpoint", step=14)
    fake_ckpt(run, "history", step=15)
    os.symlink(good9.name, run / "checkpoints" / "20260104T000000Z-step-16")  # a link is never one
    (run / "checkpoints" / "20260104T000000Z-step-17").write_text("a file")
    assert cf.list_checkpoints(run) == [good9, good10]
    assert cf.latest_checkpoint(run) == good10  # no latest link: the highest step


def test_listing_while_a_trainer_starts_finds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starting trainer makes checkpoints/ to probe it and removes it again when it was new
    (run.check_writable): a reader (evaluate, a test's watcher) that saw the folder and lists it a
    moment later finds no checkpoint rather than raising FileNotFoundError."""
    run = tmp_path / "run"
    root = run / "checkpoints"
    root.mkdir(parents=True)  # the trainer's probe folder, there when the reader asks is_dir
    listing = Path.iterdir

    def removed_first(self: Path):  # the trainer's rmdir lands between the reader's is_dir and iterdir
        if self == root and root.is_dir():
            root.rmdir()
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", removed_first)
    assert cf.list_checkpoints(run) == []
    root.mkdir()
    assert cf.latest_checkpoint(run) is None
    assert not root.exists()


# ----------------------------------------------------------------------------- finding checkpoints


def test_latest_falls_back_to_highest_step(run: Path, ckpt: Path) -> None:
    root = run / "checkpoints"
    higher = fake_ckpt(run, "20250101T000000Z-step-7")  # earlier stamp, higher step
    assert cf.latest_checkpoint(run) == ckpt.resolve()  # the link wins while it is valid
    (root / "latest").unlink()
    assert cf.latest_checkpoint(run) == higher
    os.symlink("20990101T000000Z-step-99", root / "latest")  # dangling link
    assert cf.latest_checkpoint(run) == higher
    (root / "latest").unlink()
    incomplete = root / "20990101T000000Z-step-100"
    incomplete.mkdir()
    os.symlink(incomplete.name, root / "latest")  # link to a folder without meta.json
    assert cf.latest_checkpoint(run) == higher
    assert cf.latest_checkpoint(run.parent / "nowhere") is None


def test_resolve_checkpoint_accepts_run_checkpoint_and_links(run: Path, ckpt: Path) -> None:
    expected = ckpt.resolve()
    assert cf.resolve_checkpoint(run) == expected
    assert cf.resolve_checkpoint(ckpt) == expected
    assert cf.resolve_checkpoint(run / "checkpoints" / "latest") == expected
    assert cf.resolve_checkpoint(run / "checkpoints" / "best") == expected
    assert cf.resolve_checkpoint(str(ckpt)) == expected
    # A run without model.json is still recognised by its checkpoints/ folder.
    (run / "model.json").unlink()
    assert cf.resolve_checkpoint(run) == expected


def test_resolve_checkpoint_errors(tmp_path: Path) -> None:
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "notes.txt").write_text("hello")
    for path in (neither, tmp_path / "missing"):
        with pytest.raises(CheckpointError, match="neither a checkpoint") as err:
            cf.resolve_checkpoint(path)
        assert_one_line_error(err, path)

    untrained = tmp_path / "untrained"
    untrained.mkdir()
    (untrained / "model.json").write_text(json.dumps(CONFIGS["model.json"]))
    only_leftovers = tmp_path / "leftovers"
    fake_ckpt(only_leftovers, ".tmp-20260102T000000Z-step-3", step=3)
    (only_leftovers / "checkpoints" / "history").mkdir()
    for path in (untrained, only_leftovers):
        with pytest.raises(CheckpointError, match="no checkpoint") as err:
            cf.resolve_checkpoint(path)
        assert_one_line_error(err, path)


def test_step_of() -> None:
    assert cf.step_of(Path("x/20260102T030405Z-step-1234")) == 1234
    with pytest.raises(CheckpointError, match="not a checkpoint folder name"):
        cf.step_of(Path("latest"))


# ----------------------------------------------------------------------------- archive_checkpoints


def test_move_aside_keeps_everything(run: Path, ckpt: Path) -> None:
    root = run / "checkpoints"
    fake_ckpt(run, ".tmp-20260102T000000Z-step-3", step=3)
    (root / "history").mkdir()
    (root / "history" / "old.json").write_text("{}")
    snapshot = {
        str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
        for p in root.rglob("*")
    }
    target = cf.archive_checkpoints(run)
    assert target is not None and target.parent == run
    assert re.fullmatch(r"checkpoints\.old-\d{8}T\d{6}Z", target.name)
    assert not root.exists()
    moved = {
        str(p.relative_to(target)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
        for p in target.rglob("*")
    }
    assert moved == snapshot
    assert cf.list_checkpoints(run) == []
    assert cf.latest_checkpoint(run) is None
    with pytest.raises(CheckpointError, match="no checkpoint"):
        cf.resolve_checkpoint(run)  # model.json is still there: a run with nothing to resume
    # The moved checkpoint is intact and loadable through its relative links.
    model, optimizer = fresh()
    assert ck.load_checkpoint(target / "latest", model, optimizer)["step"] == 2
    assert cf.archive_checkpoints(run) is None  # nothing left to move


def test_move_aside_twice_in_one_second(tmp_path: Path, monkeypatch) -> None:
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return T0

    monkeypatch.setattr(cf, "dt", types.SimpleNamespace(datetime=Frozen, timezone=dt.timezone))
    run = tmp_path / "run"
    fake_ckpt(run, "20260101T000000Z-step-1")
    first = cf.archive_checkpoints(run)
    fake_ckpt(run, "20260101T000000Z-step-2")
    second = cf.archive_checkpoints(run)
    assert first != second
    assert (first / "20260101T000000Z-step-1" / "meta.json").is_file()
    assert (second / "20260101T000000Z-step-2" / "meta.json").is_file()
