"""Muon's half of the optimiser: which parameter goes to which part, and the Muon transform itself.

The routing table is written once, from the logical axis names jaxgpt/model/ gives every parameter (the
names sharding.py maps onto the mesh), per layer (a scan_layers model's leading "layers" axis set
aside):

    muon    2-D matrices of the blocks, axes among embed/heads/qkv/mlp: attention q, k, v (the fused
            (C, 3C) "qkv" kernel as three (C, C) matrices), its output projection, MLP fc and out
    embed   ("vocab", "embed") token embedding (also the head when tied), ("ctx", "embed") positions
    head    ("embed", "vocab") untied output head
    scalar  everything of rank < 2: every norm scale and bias

Muon (optax.contrib.scale_by_muon) orthogonalises the momentum of each matrix with Newton-Schulz
iterations; every axis its MuonDimensionNumbers do not name is a batch axis, so the stacked (L, ...)
leaves of a scan_layers model are orthogonalised layer by layer, and the fused qkv kernel, seen as
(C, 3, C), as q, k and v apart. Its momentum state has that view's shape, and the view's logical
names ("embed", None, "qkv"), so it shards (FSDP, tensor parallel) as the kernel does. jaxgpt/training/optimizer.py
puts the parts together (optax.partition inside inject_hyperparams).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import jax
import optax
from flax import nnx
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from jaxgpt.config import ConfigError

PARTS = ("muon", "embed", "head", "scalar")
_MATRIX_AXES = {"embed", "heads", "qkv", "mlp"}  # the blocks' own widths: C, heads, fused q/k/v, 4C
_ADAMW_MATRICES = {("vocab", "embed"): "embed", ("ctx", "embed"): "embed", ("embed", "vocab"): "head"}


@dataclass(frozen=True)
class Route:
    """Where one parameter goes: a leaf of the routing tree (a plain class, so never a pytree node)."""

    part: str  # one of PARTS
    fused: int = 1  # matrices side by side along the last axis (the qkv kernel: 3)


def route(name: str, axes: tuple[str | None, ...] | None, ndim: int) -> Route:
    """The part of one parameter, from its logical axis names (layers.py's out_sharding metadata)."""
    axes = tuple(axes or ())
    if axes[:1] == ("layers",):  # scan_layers: the stacking axis is not one of the matrix's
        axes, ndim = axes[1:], ndim - 1
    if ndim < 2:
        return Route("scalar")
    if axes in _ADAMW_MATRICES:
        return Route(_ADAMW_MATRICES[axes])
    if len(axes) == 2 and set(axes) <= _MATRIX_AXES:
        return Route("muon", fused=3 if axes[-1] == "qkv" else 1)
    raise ConfigError(f"parameter {name} (logical axes {axes}) has no optimiser part: add its axes to "
                      f"muon.route's table")


def routes(model: nnx.Module) -> nnx.State:
    """Route leaves in the structure of nnx.state(model, nnx.Param) (what the optimiser sees)."""
    def one(path: tuple[Any, ...], var: nnx.Variable) -> Route:
        return route(".".join(map(str, path)), var.get_metadata().get("out_sharding"), var.get_value().ndim)

    state = nnx.state(model, nnx.Param)
    flat = [(path, one(path, var)) for path, var in nnx.to_flat_state(state)]
    if not any(r.part == "muon" for _, r in flat):
        raise ConfigError("train.json: optimizer='muon' found no weight matrix for Muon in the model; use 'adamw'")
    return nnx.from_flat_state(flat)


def routing_table(model: nnx.Module, routing: nnx.State) -> dict[str, dict[str, Any]]:
    """Per part: how many tensors and parameters, and their names (layer numbers as *): what the
    trainer prints at the start and records in meta.json."""
    params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    table: dict[str, dict[str, Any]] = {part: {"tensors": 0, "params": 0, "names": []} for part in PARTS}
    for path, r in nnx.to_flat_state(routing):
        entry = table[r.part]
        entry["tensors"] += 1
        entry["params"] += math.prod(params[path].get_value().shape)
        name = re.sub(r"\.\d+\.", ".*.", ".".join(map(str, path))) + (f" (as {r.fused} matrices)" if r.fused > 1 else "")
        if name not in entry["names"]:
            entry["names"].append(name)
    return {part: entry for part, entry in table.items() if entry["tensors"]}


def format_table(table: dict[str, dict[str, Any]], rates: dict[str, float]) -> str:
    """The routing table in a few lines: part, peak learning rate, counts, names."""
    lines = ["optimizer muon: parameters by part"]
    for part, e in table.items():
        lines.append(f"  {part:<6} lr {rates[part]:<8.3g} {e['tensors']:>4} tensors {e['params']:>12,} params: "
                     f"{', '.join(e['names'])}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the Muon part


def _view(r: Route, x: Any) -> Any:
    """(..., C, 3C) -> (..., C, 3, C): q, k, v on an axis of their own. A Variable (init) keeps its
    metadata, with the logical names of the view, so the momentum built from it is sharded."""
    if r.fused == 1 or isinstance(x, optax.MaskedNode):
        return x
    if isinstance(x, nnx.Variable):
        names = x.get_metadata().get("out_sharding")
        view = _view(r, x.get_value())
        return x.replace(view, out_sharding=None if names is None else (*names[:-1], None, names[-1]))
    return x.reshape(*x.shape[:-1], r.fused, x.shape[-1] // r.fused)


def _unview(r: Route, x: Any) -> Any:
    if r.fused == 1 or isinstance(x, optax.MaskedNode):
        return x
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _dimension_numbers(r: Route) -> MuonDimensionNumbers:
    # A Linear kernel is (in, out): in the (C, 3, C) view the input axis is -3, and the 3, like the
    # stacking axis, is not named, so it is a batch axis.
    return MuonDimensionNumbers(reduction_axis=-3 if r.fused > 1 else -2, output_axis=-1)


def _over(fn: Any, routing: nnx.State, tree: Any) -> Any:
    """fn(route, leaf) over the leaves of `tree` (arrays, Variables or partition's MaskedNodes)."""
    return jax.tree.map(fn, routing, tree)  # routing's leaves decide: tree's subtree there is passed whole


def _width_scale(routing: nnx.State) -> optax.GradientTransformation:
    """Keller Jordan's sqrt(max(1, fan_out / fan_in)) per matrix (as optax.contrib.muon's own
    scale_by_shape, which optax does not export)."""
    def scale(r: Route, u: Any) -> Any:
        if isinstance(u, optax.MaskedNode):
            return u
        fan_in = u.shape[-3] if r.fused > 1 else u.shape[-2]
        return u * math.sqrt(max(1.0, u.shape[-1] / fan_in))

    return optax.stateless(lambda updates, params: _over(scale, routing, updates))


def scale_by_muon_viewed(routing: nnx.State, *, momentum: Any, nesterov: bool, ns_steps: int,
                         weight_decay: Any, learning_rate: Any) -> optax.GradientTransformation:
    """The Muon part (its leaves as partition leaves them; the rest MaskedNode): the fused kernels
    viewed as (C, 3, C) around Muon, width scaling, Muon's own decoupled decay, the learning rate."""
    dims = lambda updates: _over(  # noqa: E731 - a tree of dimension numbers, MaskedNode where no leaf
        lambda r, u: u if isinstance(u, optax.MaskedNode) else _dimension_numbers(r), routing, updates)
    inner = optax.chain(
        scale_by_muon(ns_steps=ns_steps, beta=momentum, nesterov=nesterov, weight_dimension_numbers=dims),
        _width_scale(routing),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )

    def init(params: Any) -> Any:
        return inner.init(_over(_view, routing, params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        viewed_params = None if params is None else _over(_view, routing, params)
        updates, state = inner.update(_over(_view, routing, updates), state, viewed_params)
        return _over(_unview, routing, updates), state

    return optax.GradientTransformation(init, update)


def labels(routing: nnx.State) -> nnx.State:
    """The part names, as optax.partition takes them."""
    return jax.tree.map(lambda r: r.part, routing)
