"""Shared fixtures: one prepared built-in dataset for the whole session, tiny run directories."""

from __future__ import annotations

import ast
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

# tests/ mirrors the packages: a folder per package or concern (tests/model/, tests/data/, ...), without
# __init__.py, each test file's base name unique across folders. pytest imports a test file by its base name
# with its folder on sys.path (rootdir/prepend mode; packages would be named model, data, ... and shadow the
# root's model.py and data.py); this folder is on sys.path for conftest and the shared helpers. A test
# module that uses another's helpers (`from test_hellaswag import fixture_records`) finds it in any folder,
# however pytest is launched (one file, -k, the whole suite): every folder is on sys.path from the start.
sys.path += [str(p) for p in sorted(ROOT.joinpath("tests").iterdir()) if any(p.glob("test_*.py"))]

# gpt2 tokenizer tests read tiktoken's files from the shared offline cache when it exists.
if "TIKTOKEN_CACHE_DIR" not in os.environ and (SHARED / "tiktoken-cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken-cache")

# The measured matmul peak behind MFU (mfu.peak_flops) and XLA's compiled programs
# (caches.py) are cached per machine; the tests (and the training processes they start)
# share one cache of their own, not the user's, removed when the session ends. Most of the
# suite's processes compile the same small programs: this test process and each train.py
# started load them instead of compiling them again.
if "JAXGPT_CACHE_DIR" not in os.environ:
    os.environ["JAXGPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxgpt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["JAXGPT_CACHE_DIR"], ignore_errors=True)

# Where PYTHONDONTWRITEBYTECODE is set (this project's machines, CI's included, set it), every
# Python process the tests start would compile jax, flax, optax, orbax and matplotlib from source
# again: seconds per process, minutes over the suite. This process and those it starts share one bytecode cache instead,
# outside the source trees (PYTHONPYCACHEPREFIX), removed when the session ends.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and "PYTHONPYCACHEPREFIX" not in os.environ:
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = tempfile.mkdtemp(prefix="jaxgpt-test-pycache-")
    sys.dont_write_bytecode = False
    atexit.register(shutil.rmtree, sys.pycache_prefix, ignore_errors=True)

from jaxgpt import caches  # noqa: E402 - after JAXGPT_CACHE_DIR is set: it decides where the cache lives
from jaxgpt.data.samplers.batch import Batch  # noqa: E402

caches.enable_compile_cache()

# On an accelerator (docs/tests.md, "On a TPU"): this process holds the chip, which takes one program at
# a time, so the programs the tests start (train.py, evaluate.py, ...) run on the host's CPU; and float32
# matrix products run at full precision (a TPU's default multiplies float32 in bfloat16 passes), so the
# comparisons against float32 references keep the tolerances they have on a CPU. JAX read JAX_PLATFORMS
# when it was imported: setting it now changes the children's platform, not this process's.
import jax  # noqa: E402

ON_ACCELERATOR = jax.default_backend() != "cpu"
if ON_ACCELERATOR:
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_default_matmul_precision", "highest")

# How much wider a float32 comparison's tolerance is on an accelerator than on a CPU: a TPU's float32
# exp, tanh and erf, and the Pallas kernels' products, agree with a CPU's to about five digits, not
# seven: on a TPU v5e the numpy-reference and interpreted-splash comparisons failed at the CPU's
# tolerance and passed at 30 times it (docs/tests.md "On a TPU"). JAXGPT_TEST_F32_SLACK overrides it.
F32_SLACK = float(os.environ.get("JAXGPT_TEST_F32_SLACK", "30")) if ON_ACCELERATOR else 1.0

# A test of what only a CPU runs (XLA:CPU's compiled decode programs, the CPU's bfloat16 kernels and
# summation orders): on an accelerator its premise does not hold, so it is skipped there.
CPU_ONLY = pytest.mark.skipif(ON_ACCELERATOR, reason="checks a CPU's own programs or kernels")


# The fast tier (`uv run pytest -m "not slow"`, docs/tests.md) leaves these out; the whole suite runs them.
SLOW = pytest.mark.slow


def cases(grid: dict[str, Any], fast: Iterable[str]) -> list[Any]:
    """One pytest.param per case of `grid` (its key the id); the cases not named in `fast` are marked
    slow: the fast tier runs a representative few of a long grid, the whole suite every case."""
    fast = set(fast)
    assert fast <= set(grid), fast - set(grid)
    return [pytest.param(value, id=key, marks=() if key in fast else SLOW) for key, value in grid.items()]


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding the built-in corpus with the bytes tokenizer, built once."""
    from jaxgpt.preparation.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("data")
    prepare_dataset("builtin", "bytes", root, log=lambda _msg: None)
    return root


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every download fails at once, as on a machine without network: urllib's connection refused."""

    def refused(url: object, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(urllib.request, "urlopen", refused)


def wait_for_step(run_dir: Path, proc: subprocess.Popen, min_step: int, timeout: float = 600) -> None:
    """Wait until a training subprocess has a checkpoint at step >= min_step (it must not exit first)."""
    from jaxgpt.checkpoints import layout as cf

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = cf.latest_checkpoint(run_dir)
        if latest is not None and cf.step_of(latest) >= min_step:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at step >= {min_step} within {timeout} s")


# The tiny GPT-2 and its training that the subprocess tests (train, robustness, target, peers) start
# from, each changing what it needs with {**TINY_TRAIN, ...}: quick to compile, dropout on.
TINY_MODEL = {
    "architecture": "gpt2",
    "vocab_size": 257,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 2,
    "n_layers": 1,
    "qkv_bias": True,
    "drop_rate": 0.1,
}
TINY_TRAIN = {
    "dataset": {"source": "builtin"},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "gradient_accumulation_steps": 2,
    "train_steps": 120,
    "learning_rate": 0.003,
    "checkpoint_interval": 10,
    "validation_batches": 1,
    "keep_last_checkpoints": 2,
}


def parse_python(source: str) -> ast.Module:
    """ast.parse, tried again where CPython 3.11.7 fails with "SystemError: AST constructor recursion depth
    mismatch": its AST constructor counts its depth in interpreter-wide state, which another thread
    building an AST at the same moment upsets (CPython gh-106905, fixed in later releases); a retry
    parses the same source whole."""
    for attempt in range(20):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == 19:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def write_run(run_dir: Path, model: dict, train: dict) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "model.json").write_text(json.dumps(model, indent=2))
    (run_dir / "train.json").write_text(json.dumps(train, indent=2))
    return run_dir


# ----------------------------------------------------------------------------- checkpoint tests
# A tiny GPT-2 trained once per session and a run holding its real checkpoint (checkpoint_helpers.py).
# The tests read them (a test that trains further does so on a deep_clone), so the checkpoint
# modules share them.


@pytest.fixture(scope="session")
def trained() -> tuple:
    """A model and optimiser after two optimiser steps plus one microbatch of an open window
    (train_step compiles here, once for the whole session)."""
    import jax
    import jax.numpy as jnp
    from checkpoint_helpers import TCFG, apply_update, batch, fresh, make_meta
    from flax import nnx

    from jaxgpt.training.train_step import step_key, train_step

    model, optimizer = fresh(seed=0)
    for s in range(2):
        x, y = batch(s)
        train_step(model, optimizer, Batch(x, y), step_key(TCFG.seed, s))
    # One microbatch by hand: MultiSteps (k=2) now holds half a window in acc_grads. The gradient
    # is synthetic but deterministic and non-zero: a jitted loss gradient would cost a long compile.
    grads = jax.tree.map(lambda p: jnp.cos(p) * 0.01, nnx.state(model, nnx.Param))
    apply_update(model, optimizer, grads)
    meta = make_meta(2, is_best=True)
    return model, optimizer, meta


@pytest.fixture(scope="session")
def template(tmp_path_factory, trained) -> Path:
    """A run directory (model.json, train.json) with one real checkpoint at step 2."""
    from checkpoint_helpers import CONFIGS, T0

    from jaxgpt.checkpoints import store as ck

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
    from checkpoint_helpers import ckpt_name

    return run / "checkpoints" / ckpt_name(2)
