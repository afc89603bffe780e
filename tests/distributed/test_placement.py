"""How a run's model and optimiser are built and placed (distributed/sharding.py create_sharded): on one
accelerator process they are built by XLA:CPU on the host, then placed; that path, run here on the CPU,
gives the arrays and shardings the on-device path gives, bit for bit."""

from __future__ import annotations

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
