"""The run set-up runs before JAX: proven in fresh interpreters. And the import graph: no circle,
one-way flow config -> data / model -> step -> trainer -> entry points."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, write_run

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax")


def run_fresh(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh interpreter (the repository on its path); it prints one JSON line."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAXGPT_DATA_DIR": str(tmp_path / "data")})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


PROBE = """
import json, sys, time
import train
started = time.perf_counter()
{body}
took = time.perf_counter() - started
print(json.dumps({{"heavy": sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}), "took": took, **out}}))
"""


def test_a_bad_config_errors_in_well_under_a_second_without_jax(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", {"architecture": "gpt2", "emb_dim": 64, "n_heads": 3},
                        {"microbatch_size": 2, "train_steps": 1})
    body = f"rc = train.main([{str(run_dir)!r}]); out = {{'rc': rc}}"
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["rc"] == 2 and r["heavy"] == [] and r["took"] < 1.0, r


def test_a_whole_run_is_prepared_and_checked_without_jax(tmp_path: Path) -> None:
    """prepare_run builds the dataset, checks every token id against the model and finds the resume
    point, and JAX has still not been imported: train.py imports it only to train."""
    run_dir = write_run(tmp_path / "run", {"architecture": "gpt2", "vocab_size": 257, "context_length": 32,
                                           "emb_dim": 16, "n_heads": 2, "n_layers": 1},
                        {"microbatch_size": 2, "train_steps": 3})
    body = (f"import run_setup; from pathlib import Path\n"
            f"run = run_setup.prepare_run(Path({str(run_dir)!r}), data_root=Path({str(tmp_path / 'data')!r}), "
            f"restart=False)\nout = {{'steps': run.total_steps, 'windows': run.train_batches.n_windows}}")
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["heavy"] == [] and r["steps"] == 3 and r["windows"] > 0, r


def test_an_out_of_range_token_id_is_refused_before_jax(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", {"architecture": "gpt2", "vocab_size": 100, "context_length": 32,
                                           "emb_dim": 16, "n_heads": 2, "n_layers": 1},
                        {"microbatch_size": 2, "train_steps": 3})
    body = f"rc = train.main([{str(run_dir)!r}]); out = {{'rc': rc}}"
    r = run_fresh(PROBE.format(body=body, heavy=HEAVY), tmp_path)
    assert r["rc"] == 2 and r["heavy"] == [], r


# ----------------------------------------------------------------------------- the import graph


def project_imports() -> dict[str, set[str]]:
    """Each top-level module of the repository -> the project modules it imports (anywhere in it,
    typing-only and deferred imports included: a circle through either is still a circle)."""
    modules = {p.stem for p in ROOT.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
        graph[name] = (found & modules) - {name}
    return graph


def test_the_import_graph_has_no_circle() -> None:
    graph = project_imports()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, f"import circle: {' -> '.join(path + [node, nxt])}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_imports_flow_one_way_from_config_to_the_entry_points() -> None:
    graph = project_imports()

    def reaches(a: str) -> set[str]:
        seen, todo = set(), [a]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    layers = [["config"], ["data", "model"], ["step"], ["trainer"], ["train"]]
    for i, layer in enumerate(layers):
        later = {m for upper in layers[i + 1:] for m in upper}
        for module in layer:
            assert not reaches(module) & later, (module, reaches(module) & later)
    assert {"config"} <= reaches("model") and {"model", "ops"} <= reaches("step") <= reaches("trainer")
    light = reaches("run_setup") | {"run_setup"}  # what train.py imports before JAX
    assert not light & {"model", "ops", "step", "trainer", "checkpointing", "sharding", "cpu_kernels"}, light
