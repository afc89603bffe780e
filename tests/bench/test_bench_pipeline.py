"""bench pipeline (bench/pipeline.py): the README's workflow once, shortened, every stage a fresh process of the
command a user types; on CPU here, on an accelerator machine as the check of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cli

pytestmark = pytest.mark.slow  # fifteen processes, six trainings


def test_every_stage_of_the_workflow_runs(tmp_path: Path) -> None:
    out = tmp_path / "p"
    assert cli.main(["pipeline", "--cpu-smoke", "--out", str(out)]) == 0
    rows = {r["stage"]: r for r in json.loads(Path(f"{out}.json").read_text())["stages"]}
    assert list(rows) == [
        "train a-to-a",
        "test_a_to_a.py",
        "train tiny",
        "test_generation.py",
        "train tiny-instruct",
        "evaluate --exact-match",
        "chat.py one answer",
        "kill -9 and resume tiny-instruct",
        "train tiny-rl",
        "kill -9 and resume tiny-rl",
        "evaluate --tasks builtin",
        "serve.py API in-process",
        "export to transformers",
    ]
    assert all(r["status"] == "ok" for r in rows.values()), [r for r in rows.values() if r["status"] != "ok"]
    assert rows["test_a_to_a.py"]["last"].startswith("Reproduced")
    for name, first in (("tiny-instruct", 5), ("tiny-rl", 2)):  # SIGKILL'd after the first checkpoint, resumed
        row = rows[f"kill -9 and resume {name}"]
        assert row["resumed_from"] == first and first <= row["resumed_at"] < row["checkpoints_a"][-1]
        assert row["resume_steps_compared"] > 0
        assert row["resume_bit_identical"] and row["last"].endswith("bit-identical"), row["last"]
    assert json.loads(rows["serve.py API in-process"]["last"])["status"] == 200
    assert (
        "exact match" in rows["evaluate --exact-match"]["last"]
        and "ChatCORE" in rows["evaluate --tasks builtin"]["last"]
    )
    assert "| stage | status |" in Path(f"{out}.md").read_text() and not Path(f"{out}.logs/work").exists()


def test_a_spent_budget_skips_the_stages_it_does_not_reach(tmp_path: Path) -> None:
    out = tmp_path / "p"
    assert cli.main(["pipeline", "--cpu-smoke", "--budget", "0", "--out", str(out)]) == 0
    rows = json.loads(Path(f"{out}.json").read_text())["stages"]
    assert len(rows) == 13 and all(r["status"].startswith("skipped") for r in rows)
    # The two trainings that need no other run are refused by the budget; the rest wait on them.
    assert [r["stage"] for r in rows if r["status"] == "skipped: time budget spent"] == ["train a-to-a", "train tiny"]


def test_stages_picks_stages_and_the_trainings_they_need(tmp_path: Path) -> None:
    out = tmp_path / "p"
    args = ["pipeline", "--cpu-smoke", "--budget", "0", "--out", str(out), "--stages", "resume tiny-instruct,export"]
    assert cli.main(args) == 0
    rows = json.loads(Path(f"{out}.json").read_text())["stages"]
    # In the workflow's order; tiny-instruct needs tiny's checkpoint, so both trainings come along.
    assert [r["stage"] for r in rows] == [
        "train tiny",
        "train tiny-instruct",
        "kill -9 and resume tiny-instruct",
        "export to transformers",
    ]
    with pytest.raises(SystemExit, match="--stages nonesuch names no stage"):
        cli.main(["pipeline", "--cpu-smoke", "--budget", "0", "--out", str(out), "--stages", "nonesuch"])
