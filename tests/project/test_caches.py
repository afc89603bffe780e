"""caches.py: XLA's persistent compilation cache as train.py uses it (where, off, a second run
loads every program and trains bit for bit the same), and the remembered JSON values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SLOW, write_run
from test_train import A_TO_A_MODEL, A_TO_A_TRAIN, per_step_losses

from jaxgpt import caches

TRAIN = A_TO_A_TRAIN | {"train_steps": 20, "checkpoint_interval": 10}


def train(run: Path, data_root: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), str(run), "--data-dir", str(data_root)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def without_jax_settings() -> dict[str, str]:
    """This environment less any JAX_* variable: caches.py's defaults apply."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*-cache")}


@SLOW  # two train.py subprocesses
def test_a_second_run_loads_every_program_and_trains_the_same(tmp_path: Path, data_root: Path) -> None:
    env = without_jax_settings() | {"JAXGPT_CACHE_DIR": str(tmp_path / "c")}
    first, second = (write_run(tmp_path / name, A_TO_A_MODEL, TRAIN) for name in ("first", "second"))
    train(first, data_root, env)
    (folder,) = (tmp_path / "c" / "xla").iterdir()  # one folder, named for this CPU
    written = entries(folder)
    assert any(name.startswith("jit_") for name in written) and len(written) > 5, written
    train(second, data_root, env)
    assert entries(folder) == written  # every program of the second run came from the cache
    assert per_step_losses(second) == per_step_losses(first)  # and computes what a compile does


@SLOW  # train.py subprocesses
def test_the_users_settings_win(tmp_path: Path, data_root: Path) -> None:
    env = without_jax_settings() | {"JAXGPT_CACHE_DIR": str(tmp_path / "c")}
    train(write_run(tmp_path / "off", A_TO_A_MODEL, TRAIN), data_root, env | {"JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert not (tmp_path / "c" / "xla").exists()
    elsewhere = tmp_path / "mine"
    train(
        write_run(tmp_path / "mine-run", A_TO_A_MODEL, TRAIN),
        data_root,
        env | {"JAX_COMPILATION_CACHE_DIR": str(elsewhere)},
    )
    assert entries(elsewhere) and not (tmp_path / "c" / "xla").exists()


def test_remember_and_recall(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path / "c"))
    assert caches.recall("x.json", "a") is None  # nothing yet
    caches.remember("x.json", "a", 1.5)
    caches.remember("x.json", "b", "two")
    assert caches.recall("x.json", "a") == 1.5 and caches.recall("x.json", "b") == "two"
    assert json.loads((tmp_path / "c" / "x.json").read_text()) == {"a": 1.5, "b": "two"}
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["x.json"]  # no temporary file left
    (tmp_path / "c" / "x.json").write_text("{torn")
    assert caches.recall("x.json", "a") is None  # unreadable: computed again, never an error
    caches.remember("x.json", "a", 2)
    assert caches.recall("x.json", "a") == 2
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("JAXGPT_CACHE_DIR", str(tmp_path / "a-file" / "c"))  # cannot be created, even by root
    caches.remember("x.json", "a", 1)  # an unwritable cache folder remembers nothing, quietly
    assert caches.recall("x.json", "a") is None


def test_an_unwritable_cache_folder_means_no_compile_cache(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    env = without_jax_settings()
    code = (
        "from jaxgpt import caches; import jax, jax.numpy as jnp; print(caches.enable_compile_cache()); "
        "print(jax.jit(lambda x: x + 1)(jnp.ones(2)).tolist())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env | {"JAXGPT_CACHE_DIR": str(tmp_path / "a-file" / "c")},
    )
    assert done.returncode == 0 and done.stdout.split("\n")[:2] == ["None", "[2.0, 2.0]"], done.stderr
    assert "Traceback" not in done.stderr and "arning" not in done.stderr, done.stderr  # quietly
