"""runs/gpt2-rl's path rehearsed on CPU before a GPU runs it: the shipped gpt2-alpaca and gpt2-rl configs with a
tiny stand-in model (GPT-2's tokenizer, vocabulary and context) and a handful of rows in GSM8K's public format:
fine-tuning on Alpaca records, the prompts through the Alpaca template, 256 new tokens in rows of 512,
last_number rewards, checkpoints, a resume, and evaluate.py --tasks gsm8k=... on the result."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ROOT, SLOW, write_run

import evaluate
import train
from jaxgpt.checkpoints import layout as cf
from jaxgpt.conversations.template import template_named
from jaxgpt.tasks.rewards import LastNumber
from jaxgpt.tracking.history import read_record

FIXTURE = ROOT / "tests" / "fixtures" / "tasks" / "gsm8k-test.jsonl"  # GSM8K's first five test rows
# A long question in GSM8K's format: 206 GPT-2 tokens, 236 with the Alpaca template, where a row of 512 less
# 256 new tokens leaves room for 257 (the fixture's five: 25-104 tokens, 55-134 with the template).
LONG = {
    "question": "A school is planning a trip. "
    + " ".join(
        f"Bus {i} carries {20 + i} students and {i % 3 + 1} teachers, and costs ${100 + 5 * i} to hire."
        for i in range(12)
    )
    + " How many people travel in all?",
    "answer": "Students: <<21+22+23+24+25+26+27+28+29+30+31+32=318>>318\nTeachers: 24\n#### 342",
}


def _shipped(run: str, name: str) -> dict:
    return json.loads((ROOT / "runs" / run / name).read_text())


def _gsm8k_rows(folder: Path) -> None:
    """The training and held-out files, as `download_dataset.py tasks gsm8k gsm8k-train` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    (folder / "gsm8k-train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows[1:], LONG]))
    (folder / "gsm8k-test.jsonl").write_text(FIXTURE.read_text())


# The shipped model with a stand-in's width and depth: GPT-2's vocabulary, context and dtype kept.
MODEL = {**_shipped("gpt2-alpaca", "model.json"), "emb_dim": 16, "n_heads": 2, "n_layers": 1}


def _rl_run(path: Path, tuned: Path, steps: int) -> Path:
    """runs/gpt2-rl's train.json with the stand-in's paths and a step of 2 questions x 4 samples; every length,
    the tokenizer, the sampling and the rewards as shipped."""
    shipped = _shipped("gpt2-rl", "train.json")
    rl = shipped["rl"]
    assert rl["prompts"]["path"].endswith("gsm8k-train.jsonl") and rl["max_new_tokens"] == 256
    section = {
        **rl,
        "prompts": {**rl["prompts"], "path": "tasks/gsm8k-train.jsonl"},
        "validation": {**rl["validation"], "path": "tasks/gsm8k-test.jsonl"},
        "prompts_per_step": 2,
        "samples_per_prompt": 4,
        "validation_samples": 2,
    }
    train_json = {
        **shipped,
        "init_from": str(tuned),
        "rl": section,
        "microbatch_size": 4,
        "gradient_accumulation_steps": 2,
        "train_steps": steps,
        "checkpoint_interval": 2,
        "validation_interval": 2,
    }
    _gsm8k_rows(path / "tasks")
    return write_run(path, MODEL, train_json)


def _fake_alpaca(folder: Path) -> Path:
    """A checkpoint folder as gpt2-alpaca's fine-tuning writes one, without weights: what the set-up reads."""
    from jaxgpt.config import ModelConfig, to_dict

    folder.mkdir(parents=True)
    (folder / "model.json").write_text(json.dumps(to_dict(ModelConfig(**MODEL))))
    (folder / "train.json").write_text(json.dumps({"tokenizer": "gpt2"}))
    (folder / "chat_template.json").write_text(json.dumps(template_named("alpaca").to_dict()))
    (folder / cf.META).write_text(json.dumps({"step": 1}))
    return folder


def test_gsm8k_prompts_fit_the_shipped_lengths_and_are_scored_by_their_last_number(tmp_path: Path) -> None:
    """The fast sibling of the run below: set-up only (no JAX): every GSM8K-format prompt through the Alpaca
    template leaves room for 256 new tokens in a row of 512 (GPT-2's context 1024), the long one too."""
    from jaxgpt.rl.run import prepare_rl_run

    run = _rl_run(tmp_path / "rl", _fake_alpaca(tmp_path / "alpaca"), steps=2)
    prepared = prepare_rl_run(run, data_root=tmp_path / "data", restart=False)
    assert prepared.prompts.dropped == {} and len(prepared.prompts.ids) == 5
    longest = max(len(ids) for ids in prepared.prompts.ids)
    assert 200 < longest <= 512 + 1 - 256, longest  # the LONG question, with the template, in its room
    assert [t.name for t in prepared.validation] == ["gsm8k"] and len(prepared.validation[0].examples) == 5
    task, example = max(prepared.prompts.items, key=lambda item: int(item[1].reference))  # 70000: "70,000"
    assert task.rule == LastNumber() and task.reward(f"So he made ${int(example.reference):,}.", example) == 1.0
    assert task.reward(f"Not {int(example.reference):,} but 3.", example) == 0.0


@SLOW  # a fine-tuning run and two rl sessions of 256-token samples at GPT-2's vocabulary
def test_the_gpt2_rl_path_runs_end_to_end_resumes_and_is_scored_on_gsm8k(tmp_path: Path, capsys) -> None:
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    alpaca_rows = [{"instruction": r["question"], "input": "", "output": r["answer"]} for r in records * 2]
    (tmp_path / "instruction-data.json").write_text(json.dumps(alpaca_rows))
    sft = _shipped("gpt2-alpaca", "train.json")
    options = {**sft["dataset"]["options"], "paths": [str(tmp_path / "instruction-data.json")]}
    sft = {**sft, "dataset": {**sft["dataset"], "options": options}, "microbatch_size": 2}
    sft = {k: v for k, v in sft.items() if k not in ("init_from", "train_epochs")}  # random weights stand in for GPT-2
    tuned = write_run(tmp_path / "gpt2-alpaca", MODEL, {**sft, "train_steps": 2, "checkpoint_interval": 2})
    data = ["--data-dir", str(tmp_path / "data")]
    assert train.main([str(tuned), *data]) == 0

    run = _rl_run(tmp_path / "gpt2-rl", tuned, steps=2)
    assert train.main([str(run), *data]) == 0
    _rl_run(tmp_path / "gpt2-rl", tuned, steps=4)  # a longer run: resumes from step 2
    capsys.readouterr()
    assert train.main([str(run), *data]) == 0
    assert "from " in capsys.readouterr().out
    latest = cf.latest_checkpoint(run)
    meta = cf.read_meta(latest)
    assert meta["kind"] == "rl" and meta["step"] == 4 and (latest / "chat_template.json").is_file()
    record = read_record(run)
    assert record.series("rl/reward")[0] == [1, 2, 3, 4]
    tokens = record.series("rl/answer_tokens")[1]
    assert all(1 <= t <= 256 for t in tokens)
    assert record.series("val/gsm8k")[0] == [2, 4]

    assert evaluate.main([str(run), "--tasks", f"gsm8k={FIXTURE}", "--limit", "2", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "template 'alpaca'" in out and "gsm8k" in out
