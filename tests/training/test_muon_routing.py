"""optimizer "muon"'s routing table (muon.py): each parameter's part (the matrices, embeddings, head,
norms and biases) from its logical axes, q/k/v and a grouped kv kernel as matrices apart, the
connections' parameters, one-line refusals; and the state's sharding (the fused qkv kernel and its
momentum placed as before)."""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from model_reference import ALL_NEW, gpt_cfg
from muon_helpers import GQA, MODEL, abstract_optimizer, expected_part, flat_names, params_np, routed, train_cfg

from jaxgpt.config import ConfigError, ModelConfig, check_combination
from jaxgpt.distributed import sharding
from jaxgpt.model.gpt import abstract_model, build_model
from jaxgpt.training import muon

# ----------------------------------------------------------------------------- the table


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_routing_table(tied: bool, bias: bool, scan: bool) -> None:
    model = abstract_model(replace(MODEL, qkv_bias=bias, bias=bias, tie_embeddings=tied, scan_layers=scan))
    routing = flat_names(muon.routes(model))
    params = flat_names(nnx.state(model, nnx.Param))
    assert routing.keys() == params.keys()
    for name, r in routing.items():
        assert r.part == expected_part(name), name
        assert r.fused == (3 if name.endswith("attn.qkv.kernel") else 1), name
    parts = {p: sorted(n for n, r in routing.items() if r.part == p) for p in muon.PARTS}
    L = 1 if scan else 2  # stacked: one leaf holds every layer
    assert len(parts["muon"]) == 4 * L and len(parts["embed"]) == 2
    assert parts["head"] == ([] if tied else ["head.kernel"])
    per_layer = 8 if bias else 2  # 2 LayerNorms x (scale, bias) + 4 Linear biases, or the scales alone
    assert len(parts["scalar"]) == per_layer * L + (2 if bias else 1)
    # The printed / recorded table: every tensor and parameter counted once, layers as *.
    table = muon.routing_table(model, muon.routes(model))
    assert sum(e["tensors"] for e in table.values()) == len(params)
    assert sum(e["params"] for e in table.values()) == sum(math.prod(v.get_value().shape) for v in params.values())
    assert ("head" in table) == (not tied)
    assert "blocks.*.attn.qkv.kernel (as 3 matrices)" in table["muon"]["names"] or scan
    text = muon.format_table(table, {p: 0.1 for p in muon.PARTS})
    assert len(text.splitlines()) == 1 + len(table) and "qkv.kernel (as 3 matrices)" in text


def test_a_parameter_with_unknown_axes_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"blocks\.0\.x\.kernel.*\('embed', 'rotary'\)"):
        muon.route("blocks.0.x.kernel", ("embed", "rotary"), 2)
    assert muon.route("ln.scale", ("norm",), 1).part == "scalar"
    assert muon.route("blocks.ln.scale", ("layers", "norm"), 2).part == "scalar"  # stacked 1-D: still a norm


def test_muon_without_a_matrix_is_a_config_error() -> None:
    a_to_a = ModelConfig(architecture="a-to-a", vocab_size=50, context_length=8, emb_dim=16)
    with pytest.raises(ConfigError) as err:
        check_combination(a_to_a, train_cfg())
    assert "\n" not in str(err.value) and "optimizer='muon'" in str(err.value) and "a-to-a" in str(err.value)
    check_combination(a_to_a, train_cfg(optimizer="adamw", learning_rate=None, weight_decay=None, muon=None))


def test_gqa_kv_kernel_is_orthogonalised_as_two_matrices() -> None:
    model = build_model(GQA, seed=0)
    table = muon.routing_table(model, muon.routes(model))
    assert "blocks.*.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"]
    assert "blocks.*.attn.q.kernel" in table["muon"]["names"]
    assert jnp.shape(
        muon._view(routed(model)["blocks.0.attn.kv.kernel"], params_np(model)["blocks.0.attn.kv.kernel"])
    ) == (16, 2, 8)


def test_muon_routes_the_connections_and_grouped_heads() -> None:
    for scan in (False, True):
        model = build_model(gpt_cfg(**ALL_NEW, n_layers=3, scan_layers=scan))
        table = muon.routing_table(model, muon.routes(model))
        assert (
            "blocks.*.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"]
            or "blocks.attn.kv.kernel (as 2 matrices)" in table["muon"]["names"]
        ), table["muon"]["names"]
        assert "connections.value_tables" in table["embed"]["names"]
        assert {
            "connections.value_gates",
            "connections.resid_lambdas",
            "connections.x0_lambdas",
            "connections.skip_weights",
        } <= set(table["scalar"]["names"])
        assert not any("qkv" in n for n in table["muon"]["names"])


# ----------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("fsdp", [False, True], ids=["tp", "fsdp"])
def test_qkv_shards_as_before_and_so_does_its_momentum(fsdp: bool) -> None:
    """The "qkv" name maps where "heads" did (today's placement, unchanged); Muon's momentum of the
    (C, 3, C) view carries the view's names, so FSDP and tensor parallelism shard it too."""
    rules = dict(sharding.logical_rules(fsdp))
    mesh = jax.make_mesh((1, 1), (sharding.DATA, sharding.MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = abstract_model(MODEL)
    specs = flat_names(sharding.state_shardings(nnx.state(model, nnx.Param), mesh, fsdp))
    names = {n: v.get_metadata()["out_sharding"] for n, v in flat_names(nnx.state(model, nnx.Param)).items()}
    assert names["blocks.0.attn.qkv.kernel"] == ("embed", "qkv") and names["blocks.0.attn.qkv.bias"] == ("qkv",)
    for name, axes in names.items():
        before = tuple("heads" if a == "qkv" else a for a in axes)  # what model.py named them before
        assert specs[name].get_value().spec == P(*(rules[a] for a in before)), name

    opt = nnx.eval_shape(lambda: abstract_optimizer(train_cfg()))
    state = flat_names(nnx.state(opt))
    shard = flat_names(sharding.state_shardings(nnx.state(opt), mesh, fsdp))
    (mu,) = [n for n in state if n.endswith("muon.inner_state.0.mu.blocks.0.attn.qkv.kernel")]
    assert state[mu].get_value().shape == (16, 3, 16)
    assert shard[mu].get_value().spec == P(rules["embed"], None, sharding.MODEL)
    fc = mu.replace("attn.qkv", "mlp.fc")
    assert state[fc].get_value().shape == (16, 64) and shard[fc].get_value().spec == P(rules["embed"], sharding.MODEL)
