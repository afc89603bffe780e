"""How a run's model and optimiser are built and placed (distributed/sharding.py create_sharded): on one
accelerator process they are built by XLA:CPU on the host, then placed; that path, run here on the CPU,
gives the arrays and shardings the on-device path gives, bit for bit."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxgpt.config import MeshConfig, ModelConfig, TrainConfig
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import build_model
from jaxgpt.training.optimizer import make_optimizer

MODEL = ModelConfig(architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=2)
TRAIN = TrainConfig(microbatch_size=2, train_steps=4, seed=3)


def build() -> nnx.Module:
    return build_model(MODEL, seed=TRAIN.seed)


def then(model: nnx.Module) -> nnx.Optimizer:
    return make_optimizer(model, TRAIN, 4)


def test_built_on_the_host_and_placed_equals_built_on_the_device() -> None:
    """The model from the host, the optimiser made on the device from it (build_on_host), against both
    made in one jit (create_sharded on CPU devices): the same arrays, bit for bit, the same shardings."""
    mesh = sharding.make_mesh(MeshConfig(), TRAIN.microbatch_size)
    on_device = nnx.state(sharding.create_sharded(build, mesh, False, where="model.json", then=then))
    whole = nnx.eval_shape(lambda: (lambda m: (m, then(m)))(build()))
    shardings = sharding.state_shardings(nnx.state(whole), mesh, False)
    on_host = nnx.state(sharding.build_on_host(build, shardings, then))
    a, b = jax.tree.leaves(on_device), jax.tree.leaves(on_host)
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):
        assert x.sharding.is_equivalent_to(y.sharding, x.ndim) and x.dtype == y.dtype
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_arrays_begun_before_the_plan_are_the_ones_built_after_it() -> None:
    """build_state begins the host's build before the memory plan (start_host_build), from the model as
    configured; the planned model (another remat and loss_chunk) takes those arrays, which are bit for bit
    the ones it would build itself, and keeps its own config. Arrays of another seed are taken as they
    are (so they were taken, not rebuilt); arrays of another shape are not taken."""
    mesh = sharding.make_mesh(MeshConfig(), TRAIN.microbatch_size)
    planned = dataclasses.replace(MODEL, remat="full", loss_chunk=8)
    whole = nnx.eval_shape(lambda: (lambda m: (m, then(m)))(build()))
    shardings = sharding.state_shardings(nnx.state(whole), mesh, False)

    def params(begun_from: object | None) -> list[np.ndarray]:
        begun = None
        if begun_from is not None:
            begun = concurrent.futures.ThreadPoolExecutor(1).submit(sharding.host_state, begun_from)
        model, _ = sharding.build_on_host(lambda: build_model(planned, seed=TRAIN.seed), shardings, then, begun)
        assert model.cfg == planned
        return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]

    fresh = params(None)
    assert len(fresh) > 10
    for begun_from, want in (
        (build, fresh),  # the configured model's arrays: the planned model's own
        (lambda: build_model(MODEL, seed=TRAIN.seed + 1), params(lambda: build_model(planned, seed=TRAIN.seed + 1))),
        (lambda: build_model(dataclasses.replace(MODEL, emb_dim=16)), fresh),  # another shape: built anew
    ):
        got = params(begun_from)
        assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert not all(np.array_equal(x, y) for x, y in zip(params(lambda: build_model(MODEL, seed=9)), fresh))
