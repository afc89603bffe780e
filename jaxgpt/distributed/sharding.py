"""Device mesh, logical-axis rules and placement: the one place that decides where arrays live.

The model annotates every parameter with logical axis names (jaxgpt/model/); this module maps them
onto the two mesh axes:

    data   batch rows; with fsdp also every parameter's "embed" axis
    model  tensor parallelism: attention heads ("heads", "qkv"), MLP hidden units ("mlp"), vocabulary

JAX's SPMD partitioner does the rest: no hand-written collectives. The same code runs on one CPU,
on forced host devices and on several processes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.extend.core import ClosedJaxpr, Jaxpr, Var, jaxpr_as_fun
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgpt.config import ConfigError, MeshConfig

DATA, MODEL = "data", "model"


def logical_rules(fsdp: bool) -> tuple[tuple[str, str | None], ...]:
    return (
        ("vocab", MODEL),
        ("heads", MODEL),
        ("qkv", MODEL),  # the fused (C, 3C) query/key/value projection: sharded as "heads" always was
        ("kv", MODEL),  # grouped-query attention's (C, 2KD) key/value projection: by key/value heads
        ("gate", None),  # value embeddings' (G, K) gates: a few numbers, everywhere
        ("mlp", MODEL),
        ("embed", DATA if fsdp else None),
        ("ctx", None),
        ("norm", None),
        ("layers", None),  # scan_layers' stacking axis: every device holds every layer's slice
    )


def make_mesh(cfg: MeshConfig, microbatch_size: int) -> Mesh:
    """A (data, model) mesh over every device of every process; sizes checked before compiling."""
    n = jax.device_count()
    if n % cfg.model:
        raise ConfigError(f"train.json: mesh.model={cfg.model} does not divide the {n} devices")
    data = cfg.data or n // cfg.model
    if data * cfg.model != n:
        raise ConfigError(
            f"train.json: mesh data={data} x model={cfg.model} = {data * cfg.model} devices, but {n} are available"
        )
    if cfg.model > jax.local_device_count() or jax.local_device_count() % cfg.model:
        raise ConfigError(
            f"train.json: mesh.model={cfg.model} must divide the "
            f"{jax.local_device_count()} devices of one process (tensor parallelism "
            f"stays inside a host)"
        )
    if microbatch_size % data:
        raise ConfigError(
            f"train.json: microbatch_size={microbatch_size} does not divide by the mesh data axis ({data} devices)"
        )
    # Auto axes: the partitioner propagates shardings from the annotated parameters and batches
    # (jax.make_mesh's default Explicit axes would demand annotations on every intermediate).
    return jax.make_mesh((data, cfg.model), (DATA, MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def state_shardings(state: Any, mesh: Mesh, fsdp: bool) -> Any:
    """NamedShardings for an nnx.State (parameters, or optimiser state that mirrors them)."""
    with nnx.logical_axis_rules(logical_rules(fsdp)):
        specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda p: NamedSharding(mesh, p), specs, is_leaf=lambda x: isinstance(x, P))


def check_divisible(state: Any, shardings: Any, where: str) -> None:
    """Every sharded dimension must divide by its mesh axes; say which one does not, by name."""
    flat_state = nnx.to_flat_state(state)
    flat_shard = dict(nnx.to_flat_state(shardings))
    for path, var in flat_state:
        sharding = flat_shard[path].get_value() if hasattr(flat_shard[path], "get_value") else flat_shard[path]
        shape = var.get_value().shape
        for dim, axes in zip(shape, sharding.spec):
            if axes is None:
                continue
            size = math.prod(sharding.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
            if dim % size:
                name = ".".join(map(str, path))
                raise ConfigError(
                    f"{where}: parameter {name} has a dimension of {dim}, which does not "
                    f"divide by mesh axis {axes} of size {size}"
                )


def create_sharded(
    build: Any, mesh: Mesh, fsdp: bool, where: str, then: Any = None, host: concurrent.futures.Future | None = None
) -> Any:
    """Run `build()` (returning modules), then `then(built)` (more modules made from those, or
    None: the optimiser, whose state is zeros shaped by the parameters), and place every array on its
    shard; returns build's modules, or (build's, then's). `host`: start_host_build's, begun earlier.

    On CPU devices, and across processes, both are made inside one jit with sharding constraints, so
    no device ever holds a full unsharded copy and the optimiser state inherits each parameter's
    sharding. One process on an accelerator runs `build` on the host's CPU and places its arrays,
    then runs `then` on the devices: XLA:CPU compiles random initialisers in seconds where a TPU's
    compiler took 40 s for GPT-2 124M, the values are the CPU's, bit for bit, whatever the
    accelerator, and the optimiser's zeros never cross from the host (two thirds of the bytes).
    """

    def whole() -> Any:
        built = build()
        return built if then is None else (built, then(built))

    abstract = nnx.eval_shape(whole)
    shardings = state_shardings(nnx.state(abstract), mesh, fsdp)
    check_divisible(nnx.state(abstract), shardings, where)
    if builds_on_host():
        return build_on_host(build, shardings, then, host)

    @nnx.jit
    def create() -> Any:
        objs = whole()
        state = jax.lax.with_sharding_constraint(nnx.state(objs), shardings)
        nnx.update(objs, state)
        return objs

    return create()


def builds_on_host() -> bool:
    """Whether create_sharded builds on the host's CPU: one process on an accelerator."""
    return jax.default_backend() != "cpu" and jax.process_count() == 1


def start_host_build(build: Any) -> concurrent.futures.Future | None:
    """Where create_sharded builds on the host, `build()`'s arrays begun now in a thread (host_state),
    for create_sharded(host=...) to place later; None elsewhere. build_state starts it before the
    memory plan, whose compiles take 13-40 s on a TPU v5e: the parameters do not depend on the remat
    policy or loss chunks the plan picks, and the host's build took 6-10 s of start-up after it."""
    if not builds_on_host():
        return None
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(host_state, build)
    pool.shutdown(wait=False)
    return future


def host_state(build: Any) -> Any:
    """`build()`'s nnx.State, made by XLA:CPU on this host."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        return nnx.state(_built_in_parts(build))


def build_on_host(build: Any, shardings: Any, then: Any = None, host: concurrent.futures.Future | None = None) -> Any:
    """`build()` run by XLA:CPU on this host, its arrays then placed by `shardings`; `then(built)`
    run on the devices (shardings: of (built, then's) when `then` is given). create_sharded's way on
    one accelerator process. `host`: the arrays already begun (start_host_build), taken where they
    are `build()`'s in structure, shapes and dtypes (a model of another remat or loss_chunk)."""
    built = None
    if host is not None:
        built, state = nnx.eval_shape(build), host.result()
        if _layout(state) == _layout(nnx.state(built)):
            nnx.update(built, state)
        else:
            built = None
    if built is None:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            built = _built_in_parts(build)
    nnx.update(built, jax.device_put(nnx.state(built), shardings if then is None else shardings[0]))
    if then is None:
        return built

    @nnx.jit
    def rest(built: Any) -> Any:
        made = then(built)
        nnx.update(made, jax.lax.with_sharding_constraint(nnx.state(made), shardings[1]))
        return made

    return built, rest(built)


PART = 1 / 64  # of all the elements: an array at least this big is compiled as a program of its own


def _built_in_parts(build: Any) -> Any:
    """`build()` as jitted programs, one per large array and one for the rest, compiled in parallel
    threads (XLA compiles without Python's lock) on the default device. XLA:CPU's compile time grows
    with every random initialiser: GPT-2 124M's one program took 6.6 s to compile on a TPU v5e's host,
    as long again from the persistent cache. Each part is the one program's equations that its outputs
    need, so every array is that program's, bit for bit (tests/distributed/test_placement.py)."""
    made: dict[str, Any] = {}

    def leaves() -> list[Any]:
        made["graphdef"], state = nnx.split(build())
        flat, made["treedef"] = jax.tree.flatten(state)
        return flat

    closed = jax.make_jaxpr(leaves)()
    sizes = [math.prod(a.shape) for a in closed.out_avals]
    big = [i for i, n in enumerate(sizes) if n >= PART * sum(sizes)]
    rest = [i for i in range(len(sizes)) if i not in big]
    parts = [[i] for i in big] + ([rest] if rest else [])
    lowered = [jax.jit(_pruned(closed, part)).lower() for part in parts]
    with concurrent.futures.ThreadPoolExecutor(min(len(parts), os.cpu_count() or 1)) as pool:
        programs = list(pool.map(lambda low: low.compile(), lowered))
    arrays: list[Any] = [None] * len(sizes)
    for part, program in zip(parts, programs):
        for i, array in zip(part, program()):
            arrays[i] = array
    return nnx.merge(made["graphdef"], jax.tree.unflatten(made["treedef"], arrays))


def _pruned(closed: ClosedJaxpr, keep: list[int]) -> Any:
    """`closed` as a function of its outputs `keep` (ascending) alone: the equations they need, in order.
    Tracing the whole program once per part took most of a second of GPT-2 124M's start-up on a 2-core CPU."""
    jaxpr = closed.jaxpr
    used = [i in keep for i in range(len(jaxpr.outvars))]
    outvars = [v for v, u in zip(jaxpr.outvars, used) if u]
    needed = {v for v in outvars if isinstance(v, Var)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in needed for v in eqn.outvars):
            eqns.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, Var))
    info = jaxpr.debug_info._replace(result_paths=jaxpr.debug_info.filter_result_paths(used))
    pruned = Jaxpr(jaxpr.constvars, jaxpr.invars, outvars, eqns[::-1], jaxpr.effects, debug_info=info)
    return jaxpr_as_fun(ClosedJaxpr(pruned, closed.consts))


def _layout(state: Any) -> Any:
    """A state's structure and its leaves' shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(state)
    return treedef, [(x.shape, x.dtype) for x in leaves]


def device_memory() -> int | None:
    """Bytes of memory one local device has for arrays (an accelerator's), or None where it reports none (a CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("bytes_limit")


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Batches are (..., B, T): rows over the data axis, everything else replicated."""
    return NamedSharding(mesh, P(*([None] * (ndim - 2)), DATA, None))


def local_rows(mesh: Mesh, global_rows: int) -> slice:
    """The batch rows whose data lives on this process's devices (contiguous by construction)."""
    sharding = NamedSharding(mesh, P(DATA))
    index = sharding.addressable_devices_indices_map((global_rows,))
    starts = [idx[0].start or 0 for idx in index.values()]
    stops = [global_rows if idx[0].stop is None else idx[0].stop for idx in index.values()]
    return slice(min(starts), max(stops))


def put_batch(local: np.ndarray, mesh: Mesh, global_rows: int) -> jax.Array:
    """Assemble the global batch from this process's rows ((..., local B, T) host array)."""
    sharding = batch_sharding(mesh, local.ndim)
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    shape = (*local.shape[:-2], global_rows, local.shape[-1])
    return jax.make_array_from_process_local_data(sharding, local, shape)


def is_main_process() -> bool:
    return jax.process_index() == 0


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Process 0 runs the block first (preparing shared files); the others run it after."""
    if jax.process_count() == 1:
        yield
        return
    if not is_main_process():
        multihost_utils.sync_global_devices("main_process_first")
    yield
    if is_main_process():
        multihost_utils.sync_global_devices("main_process_first")
