"""jaxgpt/tasks: the readers of every public format (fixtures under tests/fixtures/tasks/), the reward
rules, nanochat's render_mc, pass@k and ChatCORE, the task arguments, the downloads (local copies
only), and that the package never loads JAX."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

import download_dataset
from jaxgpt.conversations.instructions import instruction_splits
from jaxgpt.tasks import (
    ExactMatch,
    LastNumber,
    Regex,
    RewardError,
    Task,
    TaskError,
    builtin_tasks,
    chat_core,
    download,
    load_task,
    load_tasks,
    parse_task_args,
    pass_at_k,
    read_arc,
    read_gsm8k,
    read_jsonl,
    read_mmlu,
    render_mc,
    report_lines,
    reward_rule,
)

FIXTURES = ROOT / "tests" / "fixtures" / "tasks"
GSM8K = FIXTURES / "gsm8k-test.jsonl"


def nanochat_render_mc(question, letters, choices):  # nanochat's tasks/common.py, verbatim but the docstring
    query = f"Multiple Choice question: {question}\n"
    query += "".join([f"- {choice}={letter}\n" for letter, choice in zip(letters, choices)])
    query += "\nRespond only with the letter of the correct answer."
    return query


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        ("1,234", "1234", 1.0),
        ("It costs $1,234.", "1,234", 1.0),
        ("-3", "-3", 1.0),
        ("-3", "3", 0.0),
        ("3.0", "3", 1.0),
        ("3.5", "3", 0.0),
        ("no number here", "3", 0.0),
        ("", "0", 0.0),
        ("first 4, then 12, finally 7 apples", "7", 1.0),
        ("first 4, then 12, finally 7 apples", "12", 0.0),
        ("5-3 makes 2", "2", 1.0),
        ("5-3", "3", 1.0),  # a minus after a digit is subtraction, not a sign
        ("x = -3", "-3", 1.0),
        ("#### 18", "18", 1.0),  # nanochat's form scores as there
        ("1,234,567 people", "1234567", 1.0),
        ("+5", "5", 1.0),
    ],
)
def test_last_number(answer: str, reference: str, expected: float) -> None:
    assert LastNumber()(answer, reference) == expected


def test_last_number_refuses_a_reference_that_is_not_a_number() -> None:
    with pytest.raises(ValueError, match="reference 'eighteen' is not a number"):
        LastNumber().check("eighteen")
    with pytest.raises(ValueError, match="is not a number"):
        LastNumber()("18", "eighteen")


def test_exact_match_normalises_white_space_and_optionally_case() -> None:
    assert ExactMatch()("  q-m-v-x \n", "q-m-v-x") == 1.0
    assert ExactMatch()("Paris\t is   nice", "Paris is nice") == 1.0
    assert ExactMatch()("paris", "Paris") == 0.0
    assert ExactMatch(case_sensitive=False)(" PARIS ", "paris") == 1.0
    assert ExactMatch()("7 2", "72") == 0.0


def test_regex_with_and_without_a_group() -> None:
    with_group = Regex(r"answer is (\w+)")
    assert with_group("I think the answer is Paris.", "Paris") == 1.0
    assert Regex(r"answer:(.*)")("answer:   New \t York  ", "New York") == 1.0  # normalised as exact match
    assert with_group("the answer is Rome; the answer is Paris", "Paris") == 0.0  # the first match
    assert with_group("no answer given", "Paris") == 0.0
    whole = Regex(r"[A-D]\b")
    assert whole("xyz C because", "C") == 1.0
    assert Regex(r"(x)?y")("y", "x") == 0.0  # group 1 did not take part: no answer
    assert "group 1" in with_group.describe() and "whole match" in whole.describe()


def test_a_bad_regex_is_one_line_naming_it() -> None:
    with pytest.raises(RewardError) as exc:
        Regex("(unclosed")
    assert "'(unclosed'" in one_line(exc) and "missing )" in str(exc.value)
    with pytest.raises(RewardError) as exc:
        reward_rule({"rule": "regex", "pattern": "a[b"}, "train.json: reward")
    assert one_line(exc).startswith("train.json: reward: bad regular expression 'a[b'")


def test_reward_rule_reads_each_config_form() -> None:
    assert reward_rule("exact", "w") == ExactMatch()
    assert reward_rule("exact_nocase", "w") == ExactMatch(case_sensitive=False)
    assert reward_rule({"rule": "last_number"}, "w") == LastNumber()
    assert reward_rule({"rule": "regex", "pattern": r"(\d+)"}, "w") == Regex(r"(\d+)")
    for rule in (ExactMatch(), ExactMatch(False), LastNumber(), Regex("x")):
        assert "\n" not in rule.describe() and rule.describe()


@pytest.mark.parametrize(
    "spec",
    ["exact_match", "", 3, None, {"rule": "regex"}, {"rule": "regex", "pattern": ""}, {"rule": "exact", "x": 1}],
)
def test_an_unknown_reward_rule_is_one_line_naming_where_and_the_value(spec: object) -> None:
    with pytest.raises(RewardError) as exc:
        reward_rule(spec, "rl.json: reward")  # type: ignore[arg-type]
    text = one_line(exc)
    assert text.startswith("rl.json: reward: ") and (repr(spec) in text or "pattern" in text)
    assert isinstance(exc.value, (TaskError, ValueError))


# ----------------------------------------------------------------------------- the public formats


def test_render_mc_is_nanochats() -> None:
    cases = [("Q?", ["A", "B", "C", "D"], ["w", "x", "y", "z"]), ("2+2 =", ["1", "2", "3"], ["3", "4", "5"])]
    for question, letters, choices in cases:
        assert render_mc(question, letters, choices) == nanochat_render_mc(question, letters, choices)
    assert render_mc("Q?", "AB", ["yes", "no"]) == (
        "Multiple Choice question: Q?\n- yes=A\n- no=B\n\nRespond only with the letter of the correct answer."
    )


def test_gsm8k_reads_the_public_jsonl() -> None:
    task = read_gsm8k(GSM8K, shuffle=False)
    assert (task.name, task.kind, task.baseline, task.rule) == ("gsm8k", "generative", 0.0, LastNumber())
    assert [ex.reference for ex in task.examples] == ["18", "3", "70000", "540", "20"]
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    assert task.examples[0].messages == ({"role": "user", "content": rows[0]["question"]},)
    assert task.reward("She makes 9 * 2 = $18 every day.", task.examples[0]) == 1.0
    assert task.reward("#### 70,000", task.examples[2]) == 1.0


def test_public_sets_come_in_nanochats_order_then_the_limit() -> None:
    in_file = read_gsm8k(GSM8K, shuffle=False).examples
    order = np.random.default_rng(42).permutation(len(in_file))  # nanochat's HubDataset.shuffle(seed=42)
    assert read_gsm8k(GSM8K).examples == tuple(in_file[i] for i in order)
    assert read_gsm8k(GSM8K, limit=2).examples == tuple(in_file[i] for i in order[:2])
    assert read_gsm8k(GSM8K, limit=99).examples == read_gsm8k(GSM8K).examples


def test_arc_reads_allenai_and_hugging_face_forms_alike() -> None:
    forms = ["arc-easy-allenai.jsonl", "arc-easy-hf.jsonl", "arc-easy-hf.parquet"]
    tasks = [read_arc(FIXTURES / name, shuffle=False) for name in forms]
    assert tasks[0] == tasks[1] == tasks[2]
    task = tasks[0]
    assert (task.name, task.kind, task.rule) == ("arc-easy", "multiple_choice", ExactMatch())
    assert [ex.reference for ex in task.examples] == ["C", "2", "A", "E"]
    assert task.examples[1].letters == ("1", "2", "3", "4")  # labels as they stand, as nanochat's tasks/arc.py
    assert task.examples[2].letters == ("A", "B", "C") and len(task.examples[3].letters) == 5
    assert task.baseline == pytest.approx((1 / 4 + 1 / 4 + 1 / 3 + 1 / 5) / 4)
    record = json.loads((FIXTURES / "arc-easy-hf.jsonl").read_text().splitlines()[0])
    expected = nanochat_render_mc(record["question"], record["choices"]["label"], record["choices"]["text"])
    assert task.examples[0].messages == ({"role": "user", "content": expected},)
    assert read_arc(FIXTURES / "arc-easy-hf.parquet", name="arc-challenge").name == "arc-challenge"


def test_mmlu_reads_hugging_face_rows_and_the_original_csvs_alike() -> None:
    forms = ["mmlu-hf.jsonl", "mmlu-hf.parquet", "mmlu-csv"]
    tasks = [read_mmlu(FIXTURES / name, shuffle=False) for name in forms]
    assert tasks[0] == tasks[1] == tasks[2]
    task = tasks[0]
    assert [ex.reference for ex in task.examples] == ["B", "B", "C", "A"]
    assert all(ex.letters == ("A", "B", "C", "D") for ex in task.examples) and task.baseline == 0.25
    assert "- Mercury=C\n" in task.examples[2].messages[0]["content"]
    assert len(read_mmlu(FIXTURES / "mmlu-csv" / "astronomy_test.csv").examples) == 2


def test_builtin_tasks_are_instruction_splits_validation_side() -> None:
    tasks = builtin_tasks(14, seed=3)
    _train, val = instruction_splits(100, 14, 3)  # the validation side does not depend on the training count
    assert [t.name for t in tasks] == [f"builtin-{n}" for n in ("reverse", "spell", "sort", "upper", "add", "larger")]
    assert sum(len(t.examples) for t in tasks) == len(val) == 14
    for i, conversation in enumerate(val):  # the tasks in turn, as instruction_splits draws them
        example = tasks[i % 6].examples[i // 6]
        assert (list(example.messages), example.reference) == (conversation[:-1], conversation[-1]["content"])
    add = next(t for t in tasks if t.name == "builtin-add")
    assert all(ex.messages[0]["content"].startswith("Add ") for ex in add.examples) and add.rule == ExactMatch()
    assert add.reward(f" {add.examples[0].reference}\n", add.examples[0]) == 1.0


def test_builtin_tasks_train_side_and_a_chosen_set() -> None:
    tasks = builtin_tasks(10, 0, ("add", "upper"), split="train", validation_examples=5)
    train, _val = instruction_splits(10, 5, 0, ("add", "upper"))
    by_name = {t.name: t for t in tasks}
    assert sorted(by_name) == ["builtin-add", "builtin-upper"]
    assert sorted(ex.reference for t in tasks for ex in t.examples) == sorted(c[-1]["content"] for c in train)
    assert all(ex.messages[0]["content"].startswith("Add ") for ex in by_name["builtin-add"].examples)
    with pytest.raises(TaskError, match="builtin tasks: .*'tasks'"):
        builtin_tasks(10, 0, ("add", "nope"))
    with pytest.raises(TaskError, match="examples must be a whole number >= 1, got 0"):
        builtin_tasks(0, 0)


def test_a_users_jsonl_with_a_system_message_and_a_rule() -> None:
    task = read_jsonl(FIXTURES / "prompts.jsonl", "exact_nocase")
    assert (task.name, task.kind, task.baseline) == ("jsonl:prompts", "generative", 0.0)
    assert task.examples[1].messages == (
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name the capital of France."},
    )
    assert task.reward("PARIS", task.examples[1]) == 1.0
    assert len(read_jsonl(FIXTURES / "prompts.jsonl", LastNumber(), limit=1).examples) == 1


# ----------------------------------------------------------------------------- bad input


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD_ARC = '{"question": {"stem": "Q", "choices": [{"text": "x", "label": "A"}, {"text": "y", "label": "B"}]}, '


@pytest.mark.parametrize(
    ("reader", "name", "text", "message"),
    [
        (
            read_gsm8k,
            "g.jsonl",
            '{"question": "q", "answer": "#### 1"}\n{"question": "q",\n',
            r"g.jsonl:2: malformed JSON",
        ),
        (
            read_gsm8k,
            "g.jsonl",
            '{"question": "q", "answer": "#### 1"}\n\n{"answer": "#### 2"}\n',
            r"g.jsonl:3: missing field 'question'",
        ),
        (
            read_gsm8k,
            "g.jsonl",
            '{"question": "q", "answer": "it is 4"}\n',
            r"g.jsonl:1: 'answer' does not end in '#### N'",
        ),
        (
            read_gsm8k,
            "g.jsonl",
            '{"question": "q", "answer": "#### four"}\n',
            r"g.jsonl:1: the answer after '####': reference 'four'",
        ),
        (read_gsm8k, "g.jsonl", '["question"]\n', r"g.jsonl:1: expected an object with a 'question' field, got list"),
        (read_gsm8k, "g.jsonl", "", r"g.jsonl: no gsm8k examples \(the file is empty\)"),
        (
            read_arc,
            "a.jsonl",
            GOOD_ARC + '"answerKey": "C"}\n',
            r"a.jsonl:1: answer 'C' is not among the choices' labels \['A', 'B'\]",
        ),
        (
            read_arc,
            "a.jsonl",
            GOOD_ARC + '"answerKey": 1}\n',
            r"a.jsonl:1: field 'answerKey' must be a non-empty string, got 1",
        ),
        (
            read_arc,
            "a.jsonl",
            '{"question": "Q", "choices": {"text": ["x"], "label": ["A", "B"]}, "answerKey": "A"}\n',
            r"a.jsonl:1: 1 choices with 2 labels",
        ),
        (
            read_mmlu,
            "m_test.csv",
            "q,a,b,c,d,A\nq,a,b,c,d,E\n",
            r"m_test.csv:2: answer 'E' is not among the choices' labels",
        ),
        (read_mmlu, "m_test.csv", 'q,a,b,c,d,A\n"q\nstill q",a,b,c,A\n', r"m_test.csv:2: expected 6 columns"),
        (
            read_mmlu,
            "m.jsonl",
            '{"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}\n',
            r"m.jsonl:1: answer 4 is not among the choices \(0-3 or A-D\)",
        ),
        (
            read_mmlu,
            "m.jsonl",
            '{"question": "q", "choices": ["a", "b"], "answer": 0}\n',
            r"m.jsonl:1: 'choices' must hold 4 texts, got 2",
        ),
        (read_mmlu, "m.txt", "q,a,b,c,d,A\n", r"m.txt: unsupported file type '.txt'"),
        (read_mmlu, "m.parquet", "not parquet", r"m.parquet: not a readable parquet file"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_line(
    tmp_path: Path, reader: object, name: str, text: str, message: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TaskError, match=message) as exc:
        reader(path)  # type: ignore[operator]
    assert one_line(exc).startswith(str(path))


@pytest.mark.parametrize(
    ("text", "rule", "message"),
    [
        ('{"prompt": "p", "reference": "r", "answer": "x"}\n', "exact", r":1: unknown field\(s\) 'answer'"),
        ('{"prompt": "p"}\n', "exact", r":1: missing field 'reference'"),
        ('{"prompt": "p", "reference": "r", "system": 3}\n', "exact", r":1: field 'system' must be a non-empty"),
        ('{"prompt": "p", "reference": "1"}\n{"prompt": "p", "reference": "x"}\n', "last_number", r":2: reference 'x'"),
        ("\n\n", "exact", r": no prompts \(the file is empty\)"),
    ],
)
def test_a_bad_users_jsonl_is_one_line(tmp_path: Path, text: str, rule: str, message: str) -> None:
    path = write(tmp_path, "mine.jsonl", text)
    with pytest.raises(TaskError, match=message) as exc:
        read_jsonl(path, rule)
    assert one_line(exc).startswith(str(path))


def test_missing_files_and_mixed_split_folders_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"nope.jsonl: gsm8k file not found$"):
        read_gsm8k(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match=r"nope.jsonl: file not found$"):
        read_jsonl(tmp_path / "nope.jsonl", "exact")
    with pytest.raises(TaskError, match=r": folder holds no .jsonl/.parquet/.csv files for mmlu$"):
        read_mmlu(tmp_path)
    for name in ("a_test.csv", "a_dev.csv"):
        shutil.copy(FIXTURES / "mmlu-csv" / "astronomy_test.csv", tmp_path / name)
    with pytest.raises(TaskError, match=r"folder holds files of several splits \(dev, test\); name one file"):
        read_mmlu(tmp_path)


def test_a_task_checks_its_examples() -> None:
    ok = read_arc(FIXTURES / "arc-easy-hf.jsonl").examples[0]
    with pytest.raises(TaskError, match="has letters .* in a generative task"):
        Task("x", "generative", (ok,), ExactMatch(), 0.0)
    with pytest.raises(TaskError, match="no examples"):
        Task("x", "generative", (), ExactMatch(), 0.0)
    with pytest.raises(TaskError, match="kind must be one of"):
        Task("x", "open", (ok,), ExactMatch(), 0.0)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- tasks by name


def test_parse_task_args_reads_a_command_line() -> None:
    args = ["gsm8k=data/test.jsonl", "arc-easy=ARC-Easy-Test.jsonl", "mmlu=data/test/", "builtin", "jsonl=a.jsonl"]
    assert parse_task_args(args) == [
        ("gsm8k", Path("data/test.jsonl")),
        ("arc-easy", Path("ARC-Easy-Test.jsonl")),
        ("mmlu", Path("data/test")),
        ("builtin", None),
        ("jsonl", Path("a.jsonl")),
    ]
    assert parse_task_args(["jsonl=a.jsonl", "jsonl=b.jsonl"]) == [
        ("jsonl", Path("a.jsonl")),
        ("jsonl", Path("b.jsonl")),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], r"--tasks: no tasks given"),
        (["hellaswag=x.jsonl"], r"--tasks: unknown task 'hellaswag' in 'hellaswag=x.jsonl' \(known: gsm8k, "),
        (["gsm8k"], r"--tasks: gsm8k needs its file or folder, as gsm8k=PATH; got 'gsm8k'"),
        (["mmlu="], r"--tasks: mmlu needs its file or folder"),
        (["builtin=x"], r"--tasks: builtin takes no file, got 'builtin=x'"),
        (["gsm8k=a", "gsm8k=b"], r"--tasks: task gsm8k is given twice \(in 'gsm8k=b'\)"),
        (["jsonl=x/a.jsonl", "jsonl=y/a.jsonl"], r"--tasks: task jsonl:a is given twice"),
    ],
)
def test_bad_task_args_are_one_line(args: list[str], message: str) -> None:
    with pytest.raises(TaskError, match=message) as exc:
        parse_task_args(args)
    one_line(exc)


def test_load_tasks_reads_every_format_by_name() -> None:
    f = FIXTURES
    args = [f"gsm8k={f / 'gsm8k-test.jsonl'}", f"arc-easy={f / 'arc-easy-allenai.jsonl'}"]
    args += [
        f"arc-challenge={f / 'arc-easy-hf.parquet'}",
        f"mmlu={f / 'mmlu-csv'}",
        "builtin",
        f"jsonl={f / 'prompts.jsonl'}",
    ]
    tasks = load_tasks(args, limit=3, builtin_examples=60, rule="exact_nocase")
    names = [t.name for t in tasks]
    assert names[:4] == ["gsm8k", "arc-easy", "arc-challenge", "mmlu"] and names[-1] == "jsonl:prompts"
    assert len(names) == 11 and all(len(t.examples) == 3 for t in tasks)
    assert tasks[-1].rule == ExactMatch(case_sensitive=False)
    assert load_task("mmlu", f / "mmlu-hf.parquet")[0] == read_mmlu(f / "mmlu-hf.parquet")
    with pytest.raises(TaskError, match="builtin takes no file"):
        load_task("builtin", f / "prompts.jsonl")


# ----------------------------------------------------------------------------- scores


def test_pass_at_k_by_hand() -> None:
    outcomes = [[True, False, False, False], [False, False, False, False], [True, True, True, True]]
    assert pass_at_k(outcomes) == {"examples": 3, "k": 4, "pass@1": 5 / 12, "pass@k": 2 / 3}
    assert pass_at_k([[True], [False]]) == {"examples": 2, "k": 1, "pass@1": 0.5, "pass@k": 0.5}
    with pytest.raises(ValueError, match=r"the same number \(>= 1\) of samples, got \[1, 2\]"):
        pass_at_k([[True], [True, False]])
    with pytest.raises(ValueError, match="no examples"):
        pass_at_k([])


def test_chat_core_centres_each_task_on_its_baseline() -> None:
    # nanochat's scripts/chat_eval.py: mean of (acc - baseline) / (1 - baseline)
    results = {"arc-easy": (0.55, 0.25), "mmlu": (0.25, 0.25), "gsm8k": (0.10, 0.0)}
    assert chat_core(results) == pytest.approx((0.4 + 0.0 + 0.1) / 3)
    assert chat_core({"mmlu": (0.0, 0.25)}) == pytest.approx(-1 / 3)  # below chance is negative
    with pytest.raises(ValueError, match="no tasks"):
        chat_core({})


def test_report_lines_table() -> None:
    lines = report_lines({"gsm8k": ([[True, False], [False, False]], 0.0), "mmlu": ([[True], [False]], 0.25)})
    assert lines[0].split() == ["task", "examples", "pass@1", "k", "pass@k", "centred"]
    assert lines[1].split() == ["gsm8k", "2", "0.2500", "2", "0.5000", "0.2500"]
    assert lines[2].split() == ["mmlu", "2", "0.5000", "1", "-", "0.3333"]
    assert lines[3].split() == ["ChatCORE", f"{(0.25 + 1 / 3) / 2:.4f}"]
    assert len({len(line) for line in lines}) == 1  # aligned columns
    single = report_lines({"builtin-add": ([[True], [True], [False], [True]], 0.0)})
    assert single[0].split() == ["task", "examples", "pass@1", "centred"] and single[-1].split()[-1] == "0.7500"


# ----------------------------------------------------------------------------- downloads and imports


def test_download_is_atomic_counted_and_checksummed(tmp_path: Path) -> None:
    downloads = tmp_path / "downloads"
    quiet = {"log": lambda _m: None}
    with pytest.raises(TaskError, match="5 examples downloaded, expected 6; the address may have changed"):
        download.fetch_public("gsm8k", downloads, url=GSM8K.as_uri(), examples=6, **quiet)
    assert list((downloads / "tasks").iterdir()) == []  # refused: nothing renamed into place
    path = download.fetch_public("gsm8k", downloads, url=GSM8K.as_uri(), examples=5, **quiet)
    assert path == downloads / "tasks" / "gsm8k-test.jsonl" and path.read_bytes() == GSM8K.read_bytes()
    recorded = (downloads / "tasks" / "gsm8k-test.jsonl.sha256").read_text().split()[0]
    assert recorded == hashlib.sha256(GSM8K.read_bytes()).hexdigest()
    closed = "http://127.0.0.1:9/x"  # a closed port
    assert download.fetch_public("gsm8k", downloads, url=closed) == path  # once: no network the second time
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(TaskError, match="sha256 differs from the one recorded"):
        download.fetch_public("gsm8k", downloads, url=closed)
    parquet = FIXTURES / "arc-easy-hf.parquet"
    arc = download.fetch_public("arc-challenge", downloads, url=parquet.as_uri(), examples=4, **quiet)
    assert read_arc(arc, name="arc-challenge") == read_arc(parquet, name="arc-challenge")


def test_public_addresses_and_counts() -> None:
    assert set(download.PUBLIC) == {"gsm8k", "gsm8k-train", "arc-easy", "arc-challenge", "mmlu"}
    assert download.PUBLIC["gsm8k"].url.startswith("https://raw.githubusercontent.com/openai/grade-school-math/")
    assert download.PUBLIC["mmlu"].url.endswith("/cais/mmlu/resolve/main/all/test-00000-of-00001.parquet")
    assert [download.PUBLIC[n].examples for n in download.DEFAULT] == [1319, 2376, 1172, 14042]


def test_download_command_offline_is_one_line(tmp_path: Path, no_network: None, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "data"
    assert download_dataset.main(["tasks", "gsm8k", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot download {download.PUBLIC['gsm8k'].url} (" in err
    assert str(data / "downloads" / "tasks" / "gsm8k-test.jsonl") in err and "--tasks gsm8k=<file>" in err
    assert list((data / "downloads" / "tasks").iterdir()) == []


def test_download_command_reuses_files_in_place(
    tmp_path: Path, no_network: None, capsys: pytest.CaptureFixture
) -> None:
    data = tmp_path / "data"
    (data / "downloads" / "tasks").mkdir(parents=True)
    shutil.copy(GSM8K, data / "downloads" / "tasks" / "gsm8k-test.jsonl")  # put there by hand
    shutil.copy(FIXTURES / "mmlu-hf.parquet", data / "downloads" / "tasks" / "mmlu-test.parquet")
    assert download_dataset.main(["tasks", "gsm8k", "mmlu", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    tasks = data / "downloads" / "tasks"
    words = f"gsm8k={tasks / 'gsm8k-test.jsonl'} mmlu={tasks / 'mmlu-test.parquet'}"
    assert words in out
    assert [t.name for t in load_tasks(words.split())] == ["gsm8k", "mmlu"]


def test_the_package_never_loads_jax(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "import jaxgpt.tasks, jaxgpt.tasks.download\n"
        "from jaxgpt.tasks import load_tasks\n"
        f"load_tasks(['builtin', 'mmlu={FIXTURES / 'mmlu-hf.parquet'}'], builtin_examples=12)\n"
        "heavy = ('jax', 'jaxlib', 'flax', 'optax', 'orbax')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
