"""The layout: entry points at the root, the rest in jaxgpt/ whose folders name the concerns; imports
flow one way (entry points -> jaxgpt, and between jaxgpt's folders without a circle); the CPU-only
code loads only where the CPU is chosen; files and functions stay readable sizes."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, parse_python

ENTRY_POINTS = {
    "train",
    "model",
    "data",
    "checkpointing",
    "charts",
    "download_dataset",
    "evaluate",
    "import_gpt2",
    "convert_hf",
    "chat",
    "judge",
    "serve",
    "test_generation",
    "test_a_to_a",
}
CPU_ONLY = ("jaxgpt.cpu", "jaxgpt.ops.cpu")


def modules() -> dict[str, Path]:
    """Every project module by dotted name: the root's entry points, jaxgpt's modules, bench's."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for package in ("jaxgpt", "bench"):
        for p in sorted((ROOT / package).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


def imports(path: Path, known: set[str], deferred: bool = True) -> set[str]:
    """The project modules a file imports: anywhere in it (deferred, typing-only: a circle through
    either is still a circle), or only at its top level."""
    tree = parse_python(path.read_text())
    nodes = ast.walk(tree) if deferred else [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = set()
    for node in nodes:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph(deferred: bool = True) -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods), deferred) - {name} for name, path in mods.items()}


def assert_no_circle(g: dict[str, set[str]], what: str) -> None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            assert state.get(nxt) != 1, f"{what} circle: {' -> '.join(path + [node, nxt])}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [])


def reaches(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in g.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def folder(module: str) -> str:
    """The room a jaxgpt module stands in: its sub-package (jaxgpt.model), or itself (jaxgpt.config)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_root_holds_the_entry_points_and_the_rest_is_in_the_package() -> None:
    assert {p.stem for p in ROOT.glob("*.py")} == ENTRY_POINTS
    assert len(ENTRY_POINTS) <= 15
    folders = {p.name for p in (ROOT / "jaxgpt").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {
        "checkpoints",
        "conversations",
        "cpu",
        "data",
        "distributed",
        "evaluation",
        "generation",
        "interop",
        "model",
        "ops",
        "preparation",
        "rl",
        "serving",
        "tasks",
        "tracking",
        "training",
    }
    assert all((ROOT / "jaxgpt" / f / "__init__.py").is_file() for f in folders)


def test_the_tests_mirror_the_packages() -> None:
    """tests/ holds a folder per package of jaxgpt/ (bench/ for the benchmarks, project/ for the root) and no
    test file at its top; no __init__.py, so pytest imports each test file by its base name: unique."""
    tests = ROOT / "tests"
    files = sorted(tests.rglob("test_*.py"))
    packages = {p.name for p in (ROOT / "jaxgpt").iterdir() if (p / "__init__.py").is_file()}
    assert {p.parent.relative_to(tests).as_posix() for p in files} <= packages | {"bench", "project"}
    names = [p.name for p in files]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not list(tests.rglob("__init__.py"))


def test_the_import_graph_has_no_circle() -> None:
    assert_no_circle(graph(), "import")


def test_no_package_module_imports_an_entry_point_or_the_benchmarks() -> None:
    for name, deps in graph().items():
        if name.startswith("jaxgpt"):
            assert not deps & (ENTRY_POINTS | {"bench"}) and not any(d.startswith("bench") for d in deps), (name, deps)


def test_the_package_folders_import_each_other_without_a_circle() -> None:
    g: dict[str, set[str]] = {}
    for name, deps in graph().items():
        if name.startswith("jaxgpt."):
            g.setdefault(folder(name), set()).update(
                folder(d) for d in deps if d.startswith("jaxgpt.") and folder(d) != folder(name)
            )
    assert_no_circle(g, "folder")
    assert "jaxgpt.training" not in reaches(g, "jaxgpt.model") and "jaxgpt.model" not in reaches(g, "jaxgpt.data")


def test_imports_flow_one_way_from_config_to_the_entry_points() -> None:
    g = graph()
    layers = [
        ["jaxgpt.config"],
        ["jaxgpt.data.storage.shards", "jaxgpt.model.gpt"],
        ["jaxgpt.training.train_step"],
        ["jaxgpt.training.loop"],
        ["train"],
    ]
    for i, layer in enumerate(layers):
        later = {m for upper in layers[i + 1 :] for m in upper}
        for module in layer:
            assert not reaches(g, module) & later, (module, reaches(g, module) & later)
    assert {"jaxgpt.config"} <= reaches(g, "jaxgpt.model.gpt")
    assert (
        {"jaxgpt.model.gpt", "jaxgpt.ops.select"}
        <= reaches(g, "jaxgpt.training.train_step")
        <= reaches(g, "jaxgpt.training.loop")
    )
    light = reaches(g, "jaxgpt.training.run") | {"jaxgpt.training.run"}  # what train.py imports before JAX
    assert not light & {
        "jaxgpt.model.gpt",
        "jaxgpt.ops",
        "jaxgpt.ops.select",
        "jaxgpt.training.train_step",
        "jaxgpt.training.loop",
        "jaxgpt.checkpoints.store",
        "jaxgpt.distributed.sharding",
        "jaxgpt.cpu.kernels",
    }, light


def test_cpu_only_code_is_imported_where_the_cpu_is_chosen_only() -> None:
    """At the top of a module, only the CPU forms themselves import jaxgpt/cpu/; deferred, only the two
    places that choose the CPU (ops/select.py for a model's operations, backend.py for the process)."""
    top, anywhere = graph(deferred=False), graph()
    for name in top:
        if name.startswith(CPU_ONLY) or name.startswith("bench") or name in ENTRY_POINTS:
            continue  # the CPU code itself; the benchmarks measure the CPU; entry points use the package's choice
        cpu = {d for d in anywhere[name] if d.startswith(CPU_ONLY)}
        assert not {d for d in top[name] if d.startswith(CPU_ONLY)}, (name, cpu)
        assert not cpu or name in ("jaxgpt.ops.select", "jaxgpt.backend"), (name, cpu)


def test_a_gpu_process_loads_none_of_the_cpu_code() -> None:
    """In a fresh interpreter: every non-CPU module of the package imported, a model's operations
    selected for a GPU, a model built with them and the process prepared as on a GPU (JAX_PLATFORMS=cuda
    names the platform backend.py reads; JAX itself runs on the CPU here): jaxgpt/cpu/ never loads."""
    names = sorted(n for n in modules() if n.startswith("jaxgpt") and not n.startswith(CPU_ONLY))
    code = f"""
import importlib, json, os, sys
for name in {names!r}:
    importlib.import_module(name)
os.environ["JAX_PLATFORMS"] = "cuda"
from jaxgpt import backend
backend.prepare_process()
os.environ["JAX_PLATFORMS"] = "cpu"
from jaxgpt.config import ModelConfig
from jaxgpt.model.gpt import abstract_model
from jaxgpt.ops import select
cfg = ModelConfig(architecture="gpt2", vocab_size=64, context_length=16, emb_dim=32, n_heads=2, n_layers=1,
                  compute_dtype="bfloat16", attention="xla")
abstract_model(cfg, select(cfg, "gpu"))
print(json.dumps(sorted(m for m in sys.modules if m.startswith({CPU_ONLY!r}))))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_files_and_functions_stay_readable_sizes() -> None:
    """No project file over 600 lines and no function over 60 (tests aside)."""
    for path in modules().values():
        text = path.read_text()
        assert text.count("\n") <= 600, (path, text.count("\n"))
        for node in ast.walk(parse_python(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 60, (
                    f"{path}:{node.lineno} {node.name}",
                    node.end_lineno - node.lineno + 1,
                )
