"""The memory plan (jaxgpt/training/memory.py): the candidates, the choice, the rows of a split step, and
train.py choosing a plan from XLA's compiled programs on this CPU (train.json device_memory_gib stands for
an accelerator's memory; a CPU reports none)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_MODEL, TINY_TRAIN, write_run
from test_rl import MODEL as RL_MODEL
from test_rl import SFT, rl_run

import train
from jaxgpt.checkpoints import store as ckpt
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig
from jaxgpt.distributed import sharding
from jaxgpt.tracking.history import read_record
from jaxgpt.training import memory
from jaxgpt.training.memory import Plan
from jaxgpt.training.run import prepare_run
from jaxgpt.training.state import plan_figures, step_bytes

MODEL = {**TINY_MODEL, "drop_rate": 0.0, "compute_dtype": "float32"}  # no dropout: a split draws no other masks
TRAIN = {**TINY_TRAIN, "microbatch_size": 8, "train_steps": 4, "checkpoint_interval": 2, "validation_batches": 1}


def test_candidates_go_from_the_run_as_configured_to_the_most_frugal() -> None:
    model = ModelConfig(architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1)
    train_cfg = TrainConfig(microbatch_size=8, train_steps=1)
    assert memory.candidates(model, train_cfg, data_ways=1) == [
        Plan(False, None),
        Plan(False, 4096),
        Plan("dots", 4096),
        Plan("full", 4096),
        Plan("full", 4096, 2),
        Plan("full", 4096, 4),
        Plan("full", 4096, 8),
    ]
    # Already chunked and fully recomputed: only smaller microbatches are left; each keeps every data device busy.
    done = dataclasses.replace(model, remat=True, loss_chunk=256)
    assert memory.candidates(done, train_cfg, data_ways=2) == [
        Plan(True, 256),
        Plan("full", 256, 2),
        Plan("full", 256, 4),
    ]
    assert memory.candidates(done, train_cfg, data_ways=1, max_split=1) == [Plan(True, 256)]
    # A TPU's plan: splash attention's residuals kept, then "full" ("dots" was the slower there).
    assert memory.candidates(model, train_cfg, data_ways=1, max_split=2, policies=memory.TPU_POLICIES) == [
        Plan(False, None),
        Plan(False, 4096),
        Plan("attention", 4096),
        Plan("full", 4096),
        Plan("full", 4096, 2),
    ]
    # Only policies that keep less than the configured one follow it.
    dots = memory.candidates(dataclasses.replace(model, remat="dots"), train_cfg, 1, 1, memory.TPU_POLICIES)
    assert dots == [Plan("dots", None), Plan("dots", 4096), Plan("attention", 4096), Plan("full", 4096)]


def test_choose_takes_the_first_that_fits_and_says_why_none_does() -> None:
    plans = [Plan(False, None), Plan(False, 4096), Plan("dots", 4096)]
    needs = {plans[0]: None, plans[1]: 12 * memory.GIB, plans[2]: 6 * memory.GIB}  # None: the compiler refused
    asked = []

    def need(p: Plan) -> int | None:
        asked.append(p)
        return needs[p]

    assert memory.choose(plans, need, 16 * memory.GIB, "run/train.json", str) == (plans[1], 12 * memory.GIB)
    assert asked == plans[:2]  # nothing compiled past the first fit
    with pytest.raises(ConfigError) as e:
        memory.choose(plans, needs.get, 4 * memory.GIB, "run/train.json", lambda p: f"remat {p.remat}")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("run/train.json: the train step does not fit in the device's 4.0 GiB")
    assert "as configured it needs more than the device has, and with remat dots 6.0 GiB" in msg


def test_refusals_are_read_in_both_forms_a_tpu_words_them() -> None:
    assert memory.refused_bytes("RESOURCE_EXHAUSTED: ... Used 36.32G of 15.48G hbm. Exceeded") == int(36.32 * 2**30)
    tpu = "Ran out of memory on HBM, the total memory required for HLO temporaries (22.79G) exceeds available HBM"
    assert memory.refused_bytes(tpu) == int(22.79 * 2**30) and memory.is_out_of_memory(RuntimeError(tpu))
    assert memory.refused_bytes("RESOURCE_EXHAUSTED: something else") is None
    assert not memory.is_out_of_memory(ValueError("shapes do not match"))


def test_an_rl_engine_holds_whole_groups_within_its_share() -> None:
    row = 38 * 2**20  # GPT-2 124M's KV cache row in bfloat16, 1024 tokens
    assert memory.engine_rows(256, 16, row, None) == 256  # a CPU: every sample at once
    assert memory.engine_rows(256, 16, row, 64 * memory.GIB) == 256  # 9.5 GiB within a quarter of 64
    assert memory.engine_rows(256, 16, row, int(15.75 * memory.GIB)) == 96  # a v5e: 6 prompts' 16 at a time
    assert memory.engine_rows(256, 16, row, memory.GIB) == 16  # never less than one prompt's samples


def test_split_rows_keeps_each_steps_rows_and_each_row_on_its_device() -> None:
    k, B, T, split, devices = 2, 8, 3, 4, 2
    a = np.arange(k * B * T).reshape(k, B, T)
    s = memory.split_rows(a, split)
    assert s.shape == (k * split, B // split, T)
    for i in range(k):  # configured microbatch i's rows, all of them, in its `split` smaller ones
        rows = {tuple(r) for r in s[i * split : (i + 1) * split].reshape(-1, T)}
        assert rows == {tuple(r) for r in a[i]}
    # The data axis gives device d the rows [d B/n, (d+1) B/n) of every microbatch: after the split each
    # device's rows of every smaller microbatch come from its own block of the configured one.
    per = B // devices
    for j in range(k * split):
        for d in range(devices):
            mine = s[j, d * (per // split) : (d + 1) * (per // split)]
            block = a[j // split, d * per : (d + 1) * per]
            assert all(any((r == b).all() for b in block) for r in mine)
    assert memory.split_rows(a, 1) is a


@pytest.mark.slow  # a compile per candidate, twice: the refusal below runs the same path in the fast tier
def test_train_py_picks_the_plan_that_fits_and_trains_the_same_steps(tmp_path: Path, data_root: Path, capsys) -> None:
    as_configured = write_run(tmp_path / "configured", MODEL, TRAIN)
    run = prepare_run(as_configured, data_root=data_root, restart=False, lock=False)
    mesh = sharding.make_mesh(run.train_cfg.mesh, run.train_cfg.microbatch_size)
    plans = memory.candidates(run.model_cfg, run.train_cfg, 1)
    sample = run.train_batches.batch(0, run.train_cfg.gradient_accumulation_steps)
    needs = [step_bytes(run, mesh, run.total_steps, None, p, sample) for p in plans]
    # The first plan that needs less than every plan before it: a device just big enough for it.
    i = next(i for i in range(1, len(plans)) if needs[i] < min(needs[:i]))
    limit_gib = (needs[i] / memory.HEADROOM + 1) / memory.GIB
    assert needs[i] <= memory.HEADROOM * limit_gib * memory.GIB < min(needs[:i])

    planned = write_run(tmp_path / "planned", MODEL, {**TRAIN, "device_memory_gib": limit_gib})
    assert train.main([str(planned), "--data-dir", str(data_root)]) == 0
    assert f"memory plan: {plans[i].describe(run.train_cfg)}" in capsys.readouterr().out
    meta = ckpt.read_meta(ckpt.latest_checkpoint(planned))
    assert meta["memory_plan"] == {"remat": plans[i].remat, "loss_chunk": plans[i].loss_chunk, "split": plans[i].split}
    assert json.loads((ckpt.latest_checkpoint(planned) / "model.json").read_text())["remat"] is False  # as configured

    assert train.main([str(as_configured), "--data-dir", str(data_root)]) == 0
    want, got = read_record(as_configured).series("train/loss"), read_record(planned).series("train/loss")
    assert want[0] == got[0] == [1, 2, 3, 4]
    np.testing.assert_allclose(got[1], want[1], rtol=2e-6)  # the same rows and mean: float32 rounding only


def test_the_later_plans_compiled_at_once_give_each_plan_its_own_figure(tmp_path: Path, data_root: Path) -> None:
    """plan_figures: the first plan compiled alone, the later ones in threads at once; each figure is the
    one that plan's own compile gives, asked in any order."""
    run = prepare_run(write_run(tmp_path / "run", MODEL, TRAIN), data_root=data_root, restart=False, lock=False)
    mesh = sharding.make_mesh(run.train_cfg.mesh, run.train_cfg.microbatch_size)
    plans = memory.candidates(run.model_cfg, run.train_cfg, 1, max_split=2)
    sample = run.train_batches.batch(0, run.train_cfg.gradient_accumulation_steps)
    figure = plan_figures(run, mesh, run.total_steps, None, plans, sample)
    order = [0, *reversed(range(1, len(plans)))]
    got = {i: figure(plans[i]) for i in order}
    want = {i: step_bytes(run, mesh, run.total_steps, None, plans[i], sample) for i in order}
    assert len(plans) == 5 and got == want and len(set(got.values())) > 2, (got, want)


def test_a_step_that_fits_nowhere_is_one_line_before_training(tmp_path: Path, data_root: Path, capsys) -> None:
    run = write_run(tmp_path / "run", MODEL, {**TRAIN, "microbatch_size": 2, "device_memory_gib": 1e-6})
    assert train.main([str(run), "--data-dir", str(data_root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run}/train.json: the train step does not fit"), err
    assert "lower microbatch_size" in err[0] and not (run / "checkpoints").exists()


@pytest.mark.slow  # a fine-tuning run first (test_rl's), then an rl run
def test_an_rl_run_plans_its_step_with_its_leash(tmp_path: Path, capsys) -> None:
    """RL's step (its KL and fine-tuning terms, the batch as its update builds it) goes through the plan too."""
    tuned = write_run(tmp_path / "sft", RL_MODEL, SFT)
    assert train.main([str(tuned), "--data-dir", str(tmp_path / "data")]) == 0
    run = rl_run(tmp_path / "rl", tuned, steps=2, kl_coef=0.1, sft_rows=2)
    raw = json.loads((run / "train.json").read_text())
    (run / "train.json").write_text(json.dumps(raw | {"device_memory_gib": 1.0}))
    assert train.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "memory plan: remat off, loss_chunk off, 2 microbatch(es) of 8 per step" in out and "(as configured)" in out
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["memory_plan"] == {
        "remat": False,
        "loss_chunk": None,
        "split": 1,
    }
