"""Muon's half of the optimiser: which parameter goes to which part, and the Muon transform itself.

The routing table is written once, from the parameters' logical axis names (a scan_layers model's
leading "layers" axis set aside):

    muon    the blocks' 2-D matrices, axes among embed/heads/qkv/kv/mlp: attention q, k, v (the fused
            (C, 3C) "qkv" kernel as three (C, C) matrices; with grouped-query attention, q and the
            (C, 2KD) "kv" kernel as two), its output projection, MLP fc and out
    embed   ("vocab", "embed") token embedding (also the head when tied) and value embeddings,
            ("ctx", "embed") positions
    head    ("embed", "vocab") untied output head
    scalar  everything of rank < 2, and the value embeddings' ("gate", "gate") gates

Axes MuonDimensionNumbers do not name are batch axes: stacked layers and the fused qkv (seen as
(C, 3, C)) are orthogonalised matrix by matrix, momentum sharded as the kernel. optimizer.py
assembles the parts. More: docs/recipes.md "Muon".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from jaxgpt.config import ConfigError

PARTS = ("muon", "embed", "head", "scalar")
_MATRIX_AXES = {"embed", "heads", "qkv", "kv", "mlp"}  # the blocks' own widths: C, heads, fused q/k/v or k/v, 4C
_FUSED = {"qkv": 3, "kv": 2}  # matrices side by side in one kernel, by its output axis
# Matrices AdamW keeps: the token table (and the value tables, connections.py, "vocab" x "embed"), the
# position table, the untied head; the value embeddings' gates (G, K) with the scalars.
_ADAMW_MATRICES = {
    ("vocab", "embed"): "embed",
    ("ctx", "embed"): "embed",
    ("embed", "vocab"): "head",
    ("gate", "gate"): "scalar",
}


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
        return Route("muon", fused=_FUSED.get(axes[-1], 1))
    raise ConfigError(
        f"parameter {name} (logical axes {axes}) has no optimiser part: add its axes to muon.route's table"
    )


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
        name = re.sub(r"\.\d+\.", ".*.", ".".join(map(str, path))) + (
            f" (as {r.fused} matrices)" if r.fused > 1 else ""
        )
        if name not in entry["names"]:
            entry["names"].append(name)
    return {part: entry for part, entry in table.items() if entry["tensors"]}


def format_table(table: dict[str, dict[str, Any]], rates: dict[str, float]) -> str:
    """The routing table in a few lines: part, peak learning rate, counts, names."""
    lines = ["optimizer muon: parameters by part"]
    for part, e in table.items():
        lines.append(
            f"  {part:<6} lr {rates[part]:<8.3g} {e['tensors']:>4} tensors {e['params']:>12,} params: "
            f"{', '.join(e['names'])}"
        )
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


# Polar Express's coefficients for 5 iterations (Amsel et al. 2025, "The Polar Express", computed with
# safety factor 2e-2 and cushion 2; nanochat's optim.py): iteration i uses row i.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


class NeuronRmsState(NamedTuple):
    second_moment: Any  # per Muon leaf, its viewed shape with the reduced axis of size 1


def _neuron_axis(r: Route, u: Any) -> int:
    """The axis NorMuon averages over: of a viewed (in, out) matrix, the shorter side, so that the
    longer side gets a statistic per row (nanochat's choice; the output neurons of a wide layer)."""
    fan_in = u.shape[-3] if r.fused > 1 else u.shape[-2]
    return (-3 if r.fused > 1 else -2) if u.shape[-1] >= fan_in else -1


def scale_by_neuron_rms(routing: nnx.State, beta2: float) -> optax.GradientTransformation:
    """NorMuon (Li et al. 2025, as nanochat's optim.py runs it): after the orthogonalisation, each
    neuron's update is divided by the square root of a running mean (decay beta2) of its mean square,
    then the whole matrix is scaled back to the orthogonalised update's Frobenius norm. optax has no
    NorMuon; this is the few lines it takes, on the viewed leaves (q, k, v apart, layers apart)."""

    def matrix_axes(r: Route) -> tuple[int, int]:
        return (-3, -1) if r.fused > 1 else (-2, -1)

    def init(params: Any) -> NeuronRmsState:
        def zeros(r: Route, p: Any) -> Any:
            if isinstance(p, optax.MaskedNode):
                return p
            value = p.get_value() if isinstance(p, nnx.Variable) else p
            shape = list(value.shape)
            shape[_neuron_axis(r, value)] = 1
            return jnp.zeros(shape, jnp.float32)

        return NeuronRmsState(_over(zeros, routing, params))

    def update(updates: Any, state: NeuronRmsState, params: Any = None) -> tuple[Any, NeuronRmsState]:
        del params

        def one(r: Route, u: Any, v: Any) -> tuple[Any, Any]:
            if isinstance(u, optax.MaskedNode):
                return u, v
            mean_sq = jnp.mean(jnp.square(u), axis=_neuron_axis(r, u), keepdims=True)  # per neuron
            v = beta2 * v + (1 - beta2) * mean_sq
            scaled = u * jax.lax.rsqrt(jnp.maximum(v, 1e-10))
            norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x), axis=matrix_axes(r), keepdims=True))  # noqa: E731
            return scaled * (norm(u) / jnp.maximum(norm(scaled), 1e-10)), v

        pairs = jax.tree.map(one, routing, updates, state.second_moment)
        is_pair = lambda x: isinstance(x, tuple)  # noqa: E731 - one's (update, moment) results
        return (
            jax.tree.map(lambda t: t[0], pairs, is_leaf=is_pair),
            NeuronRmsState(jax.tree.map(lambda t: t[1], pairs, is_leaf=is_pair)),
        )

    return optax.GradientTransformation(init, update)


def scale_by_muon_viewed(
    routing: nnx.State,
    *,
    momentum: Any,
    nesterov: bool,
    ns_steps: int,
    weight_decay: Any,
    learning_rate: Any,
    coefficients: str = "standard",
    normuon_beta2: float | None = None,
) -> optax.GradientTransformation:
    """The Muon part (its leaves as partition leaves them; the rest MaskedNode): the fused kernels
    viewed as (C, 3, C) (or (C, 2, KD)) around Muon (Polar Express's coefficients if asked, then
    NorMuon's per-neuron scale if normuon_beta2 is given), width scaling, Muon's own decoupled decay,
    the learning rate."""
    dims = lambda updates: _over(  # noqa: E731 - a tree of dimension numbers, MaskedNode where no leaf
        lambda r, u: u if isinstance(u, optax.MaskedNode) else _dimension_numbers(r), routing, updates
    )
    coeffs = {} if coefficients == "standard" else {"ns_coeffs": POLAR_EXPRESS[:ns_steps]}
    inner = optax.chain(
        scale_by_muon(ns_steps=ns_steps, beta=momentum, nesterov=nesterov, weight_dimension_numbers=dims, **coeffs),
        optax.identity() if normuon_beta2 is None else scale_by_neuron_rms(routing, normuon_beta2),
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
