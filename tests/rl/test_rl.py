"""Reinforcement learning from checkable rewards: the group advantage, the rows of samples, the policy loss
(with its KL and fine-tuning terms) against numpy, the rl section's one-line errors, and an RL run that
learns, resumes exactly after kill -9 and runs on a mesh of CPU devices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, SLOW, wait_for_step, write_run
from flax import nnx

import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.config import ConfigError, ModelConfig, TrainConfig, from_dict, to_dict
from jaxgpt.data.samplers.batch import Batch
from jaxgpt.model.gpt import build_model
from jaxgpt.model.loss import policy_loss_sums
from jaxgpt.rl.prompts import PromptPool, sample_seed
from jaxgpt.rl.samples import STD_EPS, group_advantages, sample_rows
from jaxgpt.tracking.history import read_record
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.train_step import PolicyLoss, step_key, train_step

# ----------------------------------------------------------------------------- advantages and rows


def test_the_advantage_is_the_reward_minus_its_groups_mean() -> None:
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    np.testing.assert_allclose(
        group_advantages(rewards, normalise=False),
        [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [-0.25, -0.25, -0.25, 0.75]],
    )
    std = np.sqrt(0.75 * 0.25)  # the third group's population standard deviation
    np.testing.assert_allclose(
        group_advantages(rewards, normalise=True),
        [
            np.array([1, -1, -1, 1]) * 0.5 / (0.5 + STD_EPS),
            [0.0] * 4,
            [-0.25 / (std + STD_EPS)] * 3 + [0.75 / (std + STD_EPS)],
        ],
        rtol=1e-6,
    )


def test_rows_mark_the_sampled_tokens_with_their_samples_advantage() -> None:
    batch = sample_rows([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], np.array([0.5, -2.0]), width=6, k=2)
    assert batch.inputs.shape == (2, 1, 6) and batch.segments is None and batch.old_logprobs is None
    np.testing.assert_array_equal(batch.inputs[:, 0], [[5, 6, 7, 1, 0, 0], [8, 3, 4, 0, 0, 0]])
    np.testing.assert_array_equal(batch.targets[:, 0], [[6, 7, 1, 2, 0, 0], [3, 4, 9, 0, 0, 0]])
    # Target t is token t + 1: the sampled tokens are targets 2-3 of row 0, 0-2 of row 1.
    np.testing.assert_array_equal(batch.weights[:, 0], [[0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(batch.advantages[:, 0], [[0, 0, 0.5, 0.5, 0, 0], [-2, -2, -2, 0, 0, 0]])
    with pytest.raises(ValueError, match="exceed"):
        sample_rows([[1] * 5], [[2] * 3], np.zeros(1), width=6, k=1)


def test_each_epoch_visits_every_prompt_once_and_a_step_is_a_pure_function_of_seed_and_step() -> None:
    pool = PromptPool([], [[i] for i in range(10)], {})
    epoch = [i for step in range(5) for i in pool.for_step(step, 2, seed=3)]
    assert sorted(epoch) == list(range(10)) and epoch != list(range(10))
    assert pool.for_step(7, 3, seed=3) == pool.for_step(7, 3, seed=3) != pool.for_step(7, 3, seed=4)
    assert sample_seed(0, 5, 1) == sample_seed(0, 5, 1) != sample_seed(0, 6, 1)


# ----------------------------------------------------------------------------- the loss against numpy


def _logprobs_numpy(model: nnx.Module, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logits = np.asarray(model(jnp.asarray(inputs)), np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(logp, targets[..., None], -1)[..., 0]


def _hand_batch() -> tuple[nnx.Module, Batch]:
    cfg = ModelConfig(architecture="gpt2", vocab_size=40, context_length=8, emb_dim=16, n_heads=2, n_layers=1)
    model = build_model(cfg, seed=5)
    prompts, sampled = [[1, 2, 3], [4, 5], [6], [7, 8]], [[9, 10], [11, 12, 13], [14, 15, 16, 17], [18, 19]]
    adv = np.array([1.0, -0.5, 0.25, -1.5], np.float32)
    return model, sample_rows(prompts, sampled, adv, width=7, k=2)


def test_the_rl_step_loss_is_minus_the_mean_over_sampled_tokens_of_logprob_times_advantage() -> None:
    """Two microbatches with different numbers of sampled tokens: the step's loss is the mean over all of
    them (not a mean of microbatch means), as numpy computes it from the model's logits."""
    model, batch = _hand_batch()
    logp = np.stack([_logprobs_numpy(model, batch.inputs[i], batch.targets[i]) for i in range(2)])
    want = -(logp * batch.advantages * batch.weights).sum() / batch.weights.sum()
    optimizer = make_optimizer(model, TrainConfig(microbatch_size=2, gradient_accumulation_steps=2, train_steps=5), 5)
    _losses, stats = train_step(model, optimizer, batch.map(jnp.asarray), step_key(0, 0))
    assert float(stats["loss"]) == pytest.approx(want, rel=1e-5)
    assert batch.weights[0].sum() != batch.weights[1].sum()


def _mix_rows() -> Batch:
    """Two microbatches of fine-tuning rows (5 wide, two conversations packed in one row), answers weighted."""
    inputs = np.array([[[3, 4, 5, 6, 0]], [[7, 8, 9, 10, 11]]], np.int32)
    targets = np.array([[[4, 5, 6, 0, 0]], [[8, 9, 10, 11, 12]]], np.int32)
    weights = np.array([[[0, 1, 1, 0, 0]], [[0, 1, 0, 1, 1]]], np.float32)
    segments = np.array([[[1, 1, 1, 1, 0]], [[1, 1, 2, 2, 2]]], np.int32)
    return Batch(inputs, targets, weights, segments)


def test_the_kl_and_fine_tuning_terms_are_numpys_k3_and_cross_entropy_each_over_its_own_tokens() -> None:
    """loss = policy + kl x mean over sampled tokens of exp(ref - logp) - (ref - logp) - 1 + sft x mean over
    the fine-tuning rows' answer tokens of their cross-entropy, from the model's logits in numpy."""
    model, batch = _hand_batch()
    logp = np.stack([_logprobs_numpy(model, batch.inputs[i], batch.targets[i]) for i in range(2)])
    ref = (logp + np.random.default_rng(1).normal(0, 0.5, logp.shape)).astype(np.float32)  # other weights'
    mix = _mix_rows()
    segs = [np.asarray(mix.segments[i]) for i in range(2)]
    # Packed rows: each conversation attends to itself only, as numpy sees it one conversation at a time.
    mix_logp = np.zeros(mix.inputs.shape)
    for i in range(2):
        for seg in (1, 2):
            cols = np.flatnonzero(segs[i][0] == seg)
            if len(cols):
                x, y = mix.inputs[i][:, cols], mix.targets[i][:, cols]
                mix_logp[i][:, cols] = _logprobs_numpy(model, x, y)
    w, n = batch.weights, batch.weights.sum()
    d = ref - logp
    k3 = np.exp(d) - d - 1
    policy = -(logp * batch.advantages * w).sum() / n
    kl, sft = (k3 * w).sum() / n, -(mix_logp * mix.weights).sum() / mix.weights.sum()
    assert kl > 0.01 and sft > 0.1
    optimizer = make_optimizer(model, TrainConfig(microbatch_size=2, gradient_accumulation_steps=2, train_steps=5), 5)
    both = batch._replace(ref_logprobs=ref, mix=mix).map(jnp.asarray)
    _losses, stats = train_step(model, optimizer, both, step_key(0, 0), PolicyLoss(kl=0.3, sft=2.0))
    assert float(stats["kl"]) == pytest.approx(kl, rel=1e-4)
    assert float(stats["sft_loss"]) == pytest.approx(sft, rel=1e-5)
    assert float(stats["loss"]) == pytest.approx(policy + 0.3 * kl + 2.0 * sft, rel=1e-5)


@SLOW  # gradients taken op by op, unjitted (policy_loss_sums runs in the fast tier through the step above)
def test_the_clipped_ratio_is_numpys_and_at_the_sampling_weights_the_on_policy_gradient() -> None:
    model, batch = _hand_batch()
    x, y, w, a = (jnp.asarray(batch[i][0]) for i in (0, 1, 2, 4))
    logp = _logprobs_numpy(model, batch.inputs[0], batch.targets[0])
    old = logp + np.random.default_rng(0).normal(0, 0.3, logp.shape)  # the samplers' weights were other ones
    ratio = np.exp(logp - old)
    a_np, w_np = batch.advantages[0], batch.weights[0]
    want = -(np.minimum(ratio * a_np, np.clip(ratio, 0.8, 1.2) * a_np) * w_np).sum()
    got = policy_loss_sums(model, x, y, w, a, jnp.asarray(old, jnp.float32), 0.2)["policy"]
    assert float(got) == pytest.approx(want, rel=1e-5)
    graphdef, state = nnx.split(model)

    def grad(old_logprobs: jax.Array | None) -> list[np.ndarray]:
        loss = lambda s: policy_loss_sums(nnx.merge(graphdef, s), x, y, w, a, old_logprobs, 0.2)["policy"]  # noqa: E731
        return [np.asarray(g) for g in jax.tree.leaves(jax.grad(loss)(state))]

    on_policy, clipped = grad(None), grad(jnp.asarray(logp, jnp.float32))  # ratio 1: inside the clip
    for g1, g2 in zip(on_policy, clipped):
        np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------- the rl section


RL = {"prompts": {"task": "builtin", "tasks": ["add"]}, "prompts_per_step": 2, "samples_per_prompt": 4}
RL_TRAIN = {"init_from": "../tuned", "tokenizer": "bytes", "microbatch_size": 4, "gradient_accumulation_steps": 2}


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"init_from": None}, "give init_from"),
        ({"dataset": {"source": "shakespeare"}, "packing": "documents"}, "dataset, packing: no meaning in an rl run"),
        ({"microbatch_size": 3}, "must equal rl.prompts_per_step x rl.samples_per_prompt = 2 x 4 = 8"),
        ({"rl": {**RL, "samples_per_prompt": 1}}, "rl.samples_per_prompt=1 must be >= 2"),
        ({"rl": {**RL, "advantage": "max"}}, "rl: advantage='max' must be one of"),
        ({"rl": {**RL, "prompts": {"task": "gsm8k"}}}, "task 'gsm8k' needs a path"),
        ({"rl": {**RL, "prompts": {"task": "jsonl", "path": "p.jsonl"}}}, "needs a reward rule"),
        ({"rl": {**RL, "prompts": {"task": "gsm8k", "path": "g.jsonl"}}}, "rl.validation: give held-out prompts"),
        ({"rl": {**RL, "clip_ratio": 1.5}}, "clip_ratio=1.5 must be in (0, 1)"),
        ({"rl": {**RL, "typo": 1}}, "unknown key 'typo'"),
        ({"rl": {**RL, "kl_coef": -0.1}}, "rl.kl_coef=-0.1 must be a finite number >= 0"),
        ({"rl": {**RL, "sft_rows": 3}}, "rl.sft_rows=3 must divide by gradient_accumulation_steps=2"),
        ({"rl": {**RL, "sft_coef": 0}}, "rl.sft_coef=0.0 must be a finite number > 0"),
    ],
)
def test_a_bad_rl_section_is_one_line_naming_train_json(changes: dict, needle: str) -> None:
    raw = {**RL_TRAIN, "train_steps": 4, "rl": RL, **changes}
    with pytest.raises(ConfigError) as e:
        from_dict(TrainConfig, {k: v for k, v in raw.items() if v is not None}, "runs/x/train.json")
    assert needle in str(e.value) and str(e.value).startswith("runs/x/train.json") and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- an rl run

SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 1}
SFT = {
    "dataset": {"source": "instructions", "options": {"examples": 400, "validation_examples": 20, "template": SHORT}},
    "tokenizer": "bytes",
    "microbatch_size": 8,
    "train_steps": 60,
    "learning_rate": 0.01,
    "checkpoint_interval": 60,
    "validation_batches": 1,
}
WORDS = ["apple", "beet", "cheese", "deep", "eagle", "fence", "green", "hedge", "ledger", "melee"]
RULE = {"rule": "regex", "pattern": "(e)"}  # rewarded when the answer holds an "e" anywhere


def rl_run(path: Path, tuned: Path, steps: int = 6, **rl: object) -> Path:
    """An rl run from `tuned` on prompts whose answers (the word reversed) hold an "e" more or less often."""
    path.mkdir(parents=True, exist_ok=True)
    for name, words in (("prompts.jsonl", WORDS), ("held.jsonl", WORDS[:4])):
        lines = [json.dumps({"prompt": f"Reverse the letters: {w}", "reference": "e"}) for w in words]
        (path / name).write_text("\n".join(lines) + "\n")
    section = {
        "prompts": {"task": "jsonl", "path": "prompts.jsonl", "reward": RULE},
        "validation": {"task": "jsonl", "path": "held.jsonl", "reward": RULE},
        "prompts_per_step": 2,
        "samples_per_prompt": 8,
        "max_new_tokens": 8,
        "validation_samples": 4,
        **rl,
    }
    train_json = {
        **RL_TRAIN,
        "microbatch_size": 8,
        "init_from": str(tuned),
        "train_steps": steps,
        "learning_rate": 0.003,
        "checkpoint_interval": 2,
        "validation_interval": 2,
        "rl": section,
    }
    return write_run(path, MODEL, train_json)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model fine-tuned for a few steps on the instruction set: its answers are letters, sometimes an e."""
    tmp = tmp_path_factory.mktemp("sft")
    run = write_run(tmp / "sft", MODEL, SFT)
    assert train.main([str(run), "--data-dir", str(tmp / "data")]) == 0
    return run


def _series(run: Path, key: str) -> dict[int, float]:
    return dict(zip(*read_record(run).series(key)))


LEASHES = {"kl_coef": 0.1, "sft_rows": 8}  # the KL term and 4 fine-tuning rows a microbatch


@SLOW  # a fine-tuning run, then rl runs
def test_an_rl_run_trains_on_its_rewards_and_resumes_exactly_after_kill_9(tuned: Path, tmp_path: Path) -> None:
    straight = rl_run(tmp_path / "straight", tuned, **LEASHES)
    assert train.main([str(straight)]) == 0
    rewards, signal_ = _series(straight, "rl/reward"), _series(straight, "rl/groups_with_signal")
    assert sorted(rewards) == list(range(1, 7)) and max(signal_.values()) > 0  # some groups had something to learn
    kl, sft = _series(straight, "rl/kl"), _series(straight, "rl/sft_loss")
    assert sorted(kl) == sorted(sft) == list(range(1, 7)) and kl[1] < 1e-3 < max(kl.values())  # drifts from 0
    assert 0 < min(sft.values())
    meta = cf.read_meta(cf.latest_checkpoint(straight))
    assert meta["kind"] == "rl" and meta["step"] == 6 and 0.0 <= meta["rl"]["greedy"] <= 1.0
    assert meta["reference"] == str(cf.resolve_checkpoint(tuned))
    assert (cf.latest_checkpoint(straight) / "chat_template.json").is_file()
    assert set(_series(straight, "val/greedy")) == {2, 4, 6} and _series(straight, "val/pass@4")

    run = rl_run(tmp_path / "run", tuned, **LEASHES)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(run)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for_step(run, proc, 2)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: whatever was not saved is lost
    proc.communicate()
    assert 2 <= cf.step_of(cf.latest_checkpoint(run)) < 6
    assert train.main([str(run)]) == 0
    for key in ("rl/reward", "train/loss", "rl/answer_tokens", "rl/kl", "rl/sft_loss"):
        a, b = _series(run, key), _series(straight, key)
        assert [a[s] for s in sorted(b)] == [b[s] for s in sorted(b)], key
    from safetensors.numpy import load_file

    wa = load_file(str(cf.latest_checkpoint(run) / cf.WEIGHTS))
    wb = load_file(str(cf.latest_checkpoint(straight) / cf.WEIGHTS))
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)


@SLOW  # a fine-tuning run, then an rl run in a process of its own
def test_an_rl_run_samples_and_updates_over_a_mesh_of_two_cpu_devices(tuned: Path, tmp_path: Path) -> None:
    one = rl_run(tmp_path / "one", tuned, steps=2, updates_per_batch=2)
    assert train.main([str(one)]) == 0
    two = rl_run(tmp_path / "two", tuned, steps=2, updates_per_batch=2)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), str(two)], cwd=ROOT, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert cf.read_meta(cf.latest_checkpoint(two))["mesh"]["data"] == 2
    # The same samples (each row drawn on its device), the same update within float32's reordering.
    assert _series(two, "rl/reward") == _series(one, "rl/reward")
    a, b = _series(two, "train/loss"), _series(one, "train/loss")
    np.testing.assert_allclose([a[s] for s in sorted(b)], [b[s] for s in sorted(b)], rtol=1e-4, atol=1e-6)


def _fake_tuned(folder: Path, train_json: dict) -> Path:
    """A checkpoint folder as fine-tuning writes one, without weights: what an rl run's set-up reads."""
    folder.mkdir(parents=True)
    (folder / "model.json").write_text(json.dumps(to_dict(ModelConfig(**MODEL))))  # resolved, as saved
    (folder / "train.json").write_text(json.dumps(train_json))
    (folder / "chat_template.json").write_text(json.dumps(SHORT))
    (folder / cf.META).write_text(json.dumps({"step": 60}))
    return folder


def test_the_fine_tuning_rows_are_init_froms_data_as_it_packed_them_a_pure_function_of_the_step(
    tmp_path: Path,
) -> None:
    """The fast sibling of the kill -9 test's leashes: set-up only, no JAX."""
    from jaxgpt.rl.run import prepare_rl_run

    tuned = _fake_tuned(tmp_path / "tuned", SFT)
    run = rl_run(tmp_path / "run", tuned, **LEASHES)
    prepared = prepare_rl_run(run, data_root=tmp_path / "data", restart=False)
    assert prepared.reference == tuned.resolve() and prepared.mix is not None
    rows = prepared.mix.batch(3, 2)
    assert rows.inputs.shape == (2, 4, 64) and rows.segments is not None  # packed to the context, as SFT did
    assert 0 < rows.weights.sum() < rows.weights.size  # the answers only
    np.testing.assert_array_equal(rows.inputs, prepared.mix.batch(3, 2).inputs)
    assert not np.array_equal(rows.inputs, prepared.mix.batch(4, 2).inputs)
    assert prepare_rl_run(rl_run(tmp_path / "plain", tuned), data_root=tmp_path / "data", restart=False).mix is None

    pretrained = _fake_tuned(tmp_path / "base", {k: v for k, v in SFT.items() if k != "dataset"})
    with pytest.raises(ConfigError) as e:
        prepare_rl_run(
            rl_run(tmp_path / "from-base", pretrained, sft_rows=8), data_root=tmp_path / "data", restart=False
        )
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'from-base'}/train.json: rl.sft_rows=8: init_from") and "\n" not in msg
    assert "was not fine-tuned on conversations" in msg


@SLOW  # a fine-tuning run first
def test_an_rl_run_refuses_a_base_model_a_changed_section_and_other_reference_weights_on_resume(
    tuned: Path, tmp_path: Path, capsys
) -> None:
    base = write_run(tmp_path / "base", MODEL, {**{k: v for k, v in SFT.items() if k != "dataset"}, "train_steps": 2})
    assert train.main([str(base), "--data-dir", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    assert train.main([str(rl_run(tmp_path / "from-base", base))]) == 2
    err = capsys.readouterr().err
    assert "has no chat template: an rl run starts from a model fine-tuned on conversations" in err
    run = rl_run(tmp_path / "run", tuned, steps=2)
    assert train.main([str(run)]) == 0
    rl_run(tmp_path / "run", tuned, steps=4, max_new_tokens=6)
    capsys.readouterr()
    assert train.main([str(run)]) == 2
    assert "train.json: rl differs from checkpoint" in capsys.readouterr().err
    leashed = rl_run(tmp_path / "leashed", tuned, steps=2, kl_coef=0.1)
    assert train.main([str(leashed)]) == 0
    rl_run(tmp_path / "leashed", base, steps=2, kl_coef=0.1)  # init_from now names other weights
    capsys.readouterr()
    assert train.main([str(leashed)]) == 2
    err = capsys.readouterr().err
    assert f"init_from={cf.resolve_checkpoint(base)} is not the checkpoint" in err and "use --restart" in err


@SLOW  # a fine-tuning run first
def test_an_rl_run_refuses_a_task_whose_every_prompt_is_too_long_and_names_the_rest_it_leaves_out(
    tuned: Path, tmp_path: Path, capsys
) -> None:
    from jaxgpt.rl.run import prepare_rl_run

    prompts = {"task": "builtin", "tasks": ["add", "reverse"], "examples": 600}  # 100 of each
    run = rl_run(tmp_path / "run", tuned, prompts=prompts, validation=None, max_new_tokens=4)

    def prepare(seq_len: int):
        cfg = json.loads((run / "train.json").read_text())
        (run / "train.json").write_text(json.dumps({**cfg, "sequence_length": seq_len}))
        return prepare_rl_run(run, data_root=tmp_path / "data", restart=False)

    # "Q: Add 7 and 12.\nA: " fits in 29 tokens; no "Q: Reverse the letters: abc\nA: " does.
    with pytest.raises(ConfigError) as e:
        prepare(32)
    msg = str(e.value)
    assert msg.startswith(f"{run}/train.json: every rl.prompts prompt of builtin-reverse is longer than 29 tokens")
    assert "sequence_length=32" in msg and "max_new_tokens=4" in msg and "\n" not in msg
    capsys.readouterr()
    pool = prepare(36).prompts  # 33 tokens: the shorter words' reversals fit, the longer ones are left out
    n, of = pool.dropped["builtin-reverse"]
    assert 0 < n < of == 100 and "builtin-add" not in pool.dropped and len(pool.ids) == 200 - n
    assert (
        f"Note: {n:,} of 100 rl.prompts prompts of builtin-reverse are longer than 33 tokens" in capsys.readouterr().out
    )
