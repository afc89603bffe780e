"""lm-evaluation-harness through serve.py: its local-completions model (loglikelihoods from echo +
logprobs, tokens from the server's own tokenizer endpoints) scores the local HellaSwag task of
tests/lm_eval_tasks/ offline, and its acc and acc_norm equal evaluate.py --hellaswag-file's on the
same examples, example by example, with the same loglikelihoods."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SLOW
from test_serve import MODEL, random_run, start_server

import evaluate
from jaxgpt.evaluation import hellaswag

TASKS = ROOT / "tests" / "lm_eval_tasks"
EXAMPLES = TASKS / "hellaswag_local.jsonl"


def lm_eval(url: str, name: str, context: int, out: Path, tmp: Path) -> subprocess.CompletedProcess:
    """The documented command, offline (the task's data is a local JSONL file; nothing is downloaded)."""
    env = os.environ | {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
        "HF_DATASETS_CACHE": str(tmp / "hf" / "datasets"),
        "OPENAI_API_KEY": "none",
    }
    model_args = (
        f"base_url={url}/v1/completions,model={name},tokenizer_backend=remote,max_length={context},"
        f"num_concurrent=4,max_retries=1"
    )
    args = [
        "run",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--include_path",
        str(TASKS),
        "--tasks",
        "hellaswag_local",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    return subprocess.run(
        [sys.executable, "-m", "lm_eval", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@SLOW
def test_lm_evals_hellaswag_through_the_server_equals_evaluate_py(tmp_path: Path, capsys) -> None:
    run = random_run(tmp_path, {**MODEL, "context_length": 256})
    server = start_server(run, tmp_path / "serve.log", "--max-batch", "4")
    try:
        done = lm_eval(server.url, server.name, 256, tmp_path / "out", tmp_path)
    finally:
        assert server.stop() == 0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    (samples,) = (tmp_path / "out").rglob("samples_hellaswag_local_*.jsonl")
    metrics = json.loads(results.read_text())["results"]["hellaswag_local"]
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda s: s["doc_id"])

    assert evaluate.main([str(run), "--hellaswag-file", str(EXAMPLES)]) == 0
    printed = re.search(r"hellaswag acc (\S+) \| acc_norm (\S+)", capsys.readouterr().out)
    assert (float(printed[1]), float(printed[2])) == (round(metrics["acc,none"], 4), round(metrics["acc_norm,none"], 4))

    from jaxgpt.checkpoints.store import load_model
    from jaxgpt.evaluation.scoring import hellaswag_score

    model, _cfg, tok, _ = load_model(run)
    examples = hellaswag.read_examples(EXAMPLES)
    ours = hellaswag_score(model, examples, tok)
    assert len(rows) == len(examples) == 15
    for i, (sample, example) in enumerate(zip(rows, examples)):
        assert sample["doc"]["ctx"] == example.ctx
        loglikelihoods = [float(resp[0][0]) for resp in sample["resps"]]  # one (logprob, is_greedy) per choice
        np.testing.assert_allclose(loglikelihoods, -ours["sum_losses"][i], rtol=1e-4, atol=1e-4)
        assert sample["acc"] == float(ours["pred"][i] == example.label)
        assert sample["acc_norm"] == float(ours["pred_norm"][i] == example.label), i
    assert metrics["acc,none"] == pytest.approx(ours["acc"]) and metrics["acc_norm,none"] == pytest.approx(
        ours["acc_norm"]
    )
