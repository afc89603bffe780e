"""Conversation datasets (jaxgpt/conversations/files.py, chat_prepare.py, instructions.py): Alpaca
JSON/JSONL/parquet and chat JSONL/parquet files prepared into token shards with a loss mask that
matches the template, whole conversations held out, and one-line errors naming file:line."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import download_dataset as dd
from jaxgpt.conversations.instructions import TASKS, instruction_splits
from jaxgpt.conversations.prepare import VAL_FILE
from jaxgpt.conversations.template import BUILTIN
from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import open_dataset
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.preparation.prepare import prepare_dataset

ALPACA = [
    {"instruction": f"Say the number {i}.", "input": "" if i % 3 else f"n={i}", "output": f"It is {i}."}
    for i in range(40)
]
CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Hi {i}"},
            {"role": "assistant", "content": f"Hello {i}."},
            {"role": "user", "content": "Again"},
            {"role": "assistant", "content": f"Hello again {i}."},
        ]
    }
    for i in range(40)
]


def conversations_of(split, tok) -> list[tuple[str, str]]:
    """(whole text, trained text) of every conversation of a split, read back from its shards."""
    starts = np.append(split.conversation_starts, split.n_tokens)
    out = []
    for a, b in itertools.pairwise(starts):
        ids, mask = split.read(int(a), int(b - a)), np.empty(int(b - a), np.uint8)
        split.read_mask_into(int(a), mask)
        out.append((tok.decode(ids), tok.decode(ids[mask == 1])))
    return out


def prepare(tmp_path: Path, paths: list[Path], tokenizer: str = "bytes", **options) -> Path:
    return prepare_dataset(
        "conversations",
        tokenizer,
        tmp_path / "data",
        log=lambda _m: None,
        options={"paths": [str(p) for p in paths], **options},
    )


def test_alpaca_json_and_chat_jsonl_prepare_with_masks_on_the_answers(tmp_path: Path) -> None:
    (tmp_path / "alpaca.json").write_text(json.dumps(ALPACA))  # the book's instruction-data.json: one array
    (tmp_path / "chats.jsonl").write_text("\n".join(json.dumps(c) for c in CHATS) + "\n\n")
    ds = open_dataset(prepare(tmp_path, [tmp_path / "alpaca.json", tmp_path / "chats.jsonl"], validation_fraction=0.1))
    tok = get_tokenizer("bytes")
    assert ds.manifest["kind"] == "conversations" and ds.manifest["template"] == BUILTIN["alpaca"].to_dict()
    got = conversations_of(ds.train, tok) + conversations_of(ds.val, tok)
    assert len(got) == 80 and ds.manifest["conversations"]["val"]["conversations"] == 8
    for text, trained in got:
        if "Say the number" in text:
            i = int(text.split("Say the number ")[1].split(".")[0])
            assert trained == f"It is {i}."  # bytes decodes end-of-text to nothing; its mask is 1 (below)
            assert ("### Input:\nn=" in text) == (i % 3 == 0)
        else:
            i = int(text.split("Hi ")[1].split("\n")[0])
            assert text.startswith("Be brief.\n\n### Instruction:\nHi ")
            assert trained == f"Hello {i}.Hello again {i}."
    # Each conversation's trained tokens end with end-of-text (the answer's end), and none else is trained.
    mask = np.concatenate([np.asarray(m) for m in ds.train.masks])
    tokens = ds.train.read(0, ds.train.n_tokens)
    assert (tokens[mask == 1] == tok.eot_id).sum() == 36 + 2 * 36  # one per answer: alpaca 1, chats 2
    # Held-out conversations are whole ones, and val.jsonl holds them as messages.
    held = [json.loads(line)["messages"] for line in (ds.path / VAL_FILE).read_text().splitlines()]
    val_texts = {t for t, _ in conversations_of(ds.val, tok)}
    assert len(held) == 8 and {tok.decode(BUILTIN["alpaca"].render(tok, m)[0]) for m in held} == val_texts
    assert not val_texts & {t for t, _ in conversations_of(ds.train, tok)}


def test_parquet_chat_and_alpaca_columns(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"messages": [c["messages"] for c in CHATS], "source": ["x"] * 40}),
        tmp_path / "s.parquet",
        row_group_size=7,
    )  # smoltalk's layout: a list of structs per row, several row groups
    pq.write_table(
        pa.table({k: [r[k] for r in ALPACA] for k in ("instruction", "input", "output")}), tmp_path / "a.parquet"
    )
    ds = open_dataset(prepare(tmp_path, [tmp_path], validation_fraction=0.1))
    assert (
        ds.manifest["conversations"]["train"]["conversations"] + ds.manifest["conversations"]["val"]["conversations"]
        == 80
    )


def test_a_gpt2_dataset_masks_the_end_token_too(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ALPACA))
    ds = open_dataset(prepare(tmp_path, [tmp_path / "a.jsonl"], tokenizer="gpt2", validation_fraction=0.1))
    tok = get_tokenizer("gpt2")
    for _text, trained in conversations_of(ds.train, tok):
        assert trained.endswith(".<|endoftext|>") and trained.startswith("It is")


def test_a_users_template_from_the_options(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ALPACA))
    template = {"name": "qa", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "\n<|endoftext|>"}
    ds = open_dataset(prepare(tmp_path, [tmp_path / "a.jsonl"], validation_fraction=0.1, template=template))
    text, trained = conversations_of(ds.train, get_tokenizer("bytes"))[0]
    assert text.startswith("Q: Say the number") and "\nA: It is" in text and trained.endswith(".\n")
    assert ds.manifest["template"]["name"] == "qa"


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"instruction": "a", "input": ""}'], "a.jsonl:1: Alpaca record needs a string 'output'"),
        (
            ['{"instruction": "a", "output": "b"}', '{"instruction": "a", "output": "  "}'],
            "a.jsonl:2: message 1 is an empty answer",
        ),
        (['{"messages": [{"role": "assistant", "content": "b"}]}'], "a.jsonl:1: message 0: expected a user message"),
        (
            ['{"messages": [{"role": "user", "content": "b"}]}'],
            "a.jsonl:1: the conversation must end with an assistant",
        ),
        (
            ['{"instruction": "a", "output": "b"}', '{"instruction": "a", '],
            "a.jsonl:2: malformed JSON: the line is cut off after column 20",
        ),
        (['{"instruction": "a", "output": "bc'], "a.jsonl:1: malformed JSON: the line is cut off after column 34"),
        (['{"instruction": "a" "output": "b"}'], "a.jsonl:1: malformed JSON (Expecting ',' delimiter at column 21)"),
        (['{"text": "plain"}'], "a.jsonl:1: neither an Alpaca record"),
        (["[1, 2]"], "a.jsonl:1: expected a JSON object"),
    ],
)
def test_bad_records_name_the_file_and_line_in_one_line(tmp_path: Path, lines: list[str], message: str) -> None:
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        prepare(tmp_path, [tmp_path / "a.jsonl"])
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "data" / "conversations-a-jsonl-bytes").exists()  # nothing written


def test_bad_options_and_files_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    for options, message in [
        ({"paths": [str(tmp_path / "a.txt")]}, "unsupported file type '.txt'"),
        ({"paths": [str(tmp_path / "none.json")]}, "none.json: no such file"),
        ({"paths": ["x.json"], "too_long": "wrap"}, "option 'too_long' must be one of"),
        ({"paths": ["x.json"], "template": "chatml"}, "unknown template 'chatml'"),
    ]:
        with pytest.raises(DataError) as e:
            prepare_dataset("conversations", "bytes", tmp_path / "data", options=options, log=lambda _m: None)
        assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="nanochat.*uses the special token <\\|user_start\\|>, which the bytes"):
        prepare_dataset(
            "instructions", "bytes", tmp_path / "data", options={"template": "nanochat"}, log=lambda _m: None
        )


def test_a_prepared_conversation_dataset_is_reused_and_rebuilt_when_its_template_changes(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ALPACA))
    lines: list[str] = []
    path = prepare_dataset(
        "conversations",
        "bytes",
        tmp_path / "data",
        log=lines.append,
        options={"paths": [str(tmp_path / "a.jsonl")], "validation_fraction": 0.1},
    )
    prepare_dataset(
        "conversations",
        "bytes",
        tmp_path / "data",
        log=lines.append,
        options={"paths": [str(tmp_path / "a.jsonl")], "validation_fraction": 0.1},
    )
    assert lines[-1].startswith("reusing dataset")
    prepare_dataset(
        "conversations",
        "bytes",
        tmp_path / "data",
        log=lines.append,
        options={
            "paths": [str(tmp_path / "a.jsonl")],
            "validation_fraction": 0.1,
            "template": {"user": "Q {content}", "assistant": "A {content}", "end": "<|endoftext|>"},
        },
    )
    assert any(line.startswith(f"preparing dataset {path}: options changed") for line in lines)


def test_the_instruction_set_is_deterministic_and_never_asks_a_validation_question_in_training() -> None:
    train, val = instruction_splits(3000, 200, seed=0)
    again, val_again = instruction_splits(3000, 200, seed=0)
    assert (train, val) == (again, val_again) and instruction_splits(3000, 200, seed=1)[1] != val
    asked = {c[0]["content"] for c in train}
    assert len(asked) == 3000 and not asked & {c[0]["content"] for c in val}
    for conversation in train[:50] + val[:50]:  # each answer is the task's own function of its input
        (user, answer) = (conversation[0]["content"], conversation[1]["content"])
        if user.startswith("Reverse the letters: "):
            assert answer == user.split(": ")[1][::-1]
        elif user.startswith("Add "):
            a, b = user[4:-1].split(" and ")
            assert answer == str(int(a) + int(b))
        elif user.startswith("Which is larger"):
            a, b = user.split(", ")[1].rstrip("?").split(" or ")
            assert answer == str(max(int(a), int(b)))
    assert {c[0]["content"].split()[0] for c in val} == {"Reverse", "Spell", "Sort", "Write", "Add", "Which"}
    assert len(TASKS) == 6


def test_download_dataset_prepares_the_instruction_set(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        dd.main(["instructions", "--examples", "300", "--validation-examples", "20", "--data-dir", str(tmp_path)]) == 0
    )
    ds = open_dataset(tmp_path / "instructions-bytes")
    assert ds.manifest["conversations"]["val"]["conversations"] == 20 and "template 'alpaca'" in capsys.readouterr().out


def test_a_dataset_of_older_ids_is_prepared_again(tmp_path: Path) -> None:
    """A dataset rendered before the ids became transformers' (its fingerprint lacks RENDERING) is
    rebuilt, never reused: its shards hold other ids for the same conversations."""
    from jaxgpt.conversations.prepare import RENDERING

    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ALPACA))
    path = prepare(tmp_path, [tmp_path / "a.jsonl"], validation_fraction=0.1)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["fingerprint"].endswith(RENDERING)
    manifest["fingerprint"] = manifest["fingerprint"].removesuffix(RENDERING)  # what an older version wrote
    (path / "manifest.json").write_text(json.dumps(manifest))
    lines: list[str] = []
    options = {"paths": [str(tmp_path / "a.jsonl")], "validation_fraction": 0.1}
    prepare_dataset("conversations", "bytes", tmp_path / "data", log=lines.append, options=options)
    assert lines[0].startswith(f"preparing dataset {path}: fingerprint changed")
    assert json.loads((path / "manifest.json").read_text())["fingerprint"].endswith(RENDERING)


def test_a_json_file_of_one_object_or_cut_off_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text(json.dumps(ALPACA[0]))  # one record: not a data set
    with pytest.raises(DataError) as e:
        prepare(tmp_path, [tmp_path / "one.json"])
    assert str(e.value).startswith(f"{tmp_path / 'one.json'}: holds one JSON dict, expected a list of records")
    assert "validation_fraction" not in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "cut.json").write_text(json.dumps(ALPACA, indent=1)[:300])
    with pytest.raises(DataError, match=r"cut.json:\d+: malformed JSON: the file is cut off after column \d+"):
        prepare(tmp_path, [tmp_path / "cut.json"])


def test_chat_jsonl_and_chat_parquet_prepare_into_two_folders(tmp_path: Path) -> None:
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in ALPACA))
    pq.write_table(pa.Table.from_pylist(ALPACA[:20] * 2), tmp_path / "chat.parquet")
    a = prepare(tmp_path, [tmp_path / "chat.jsonl"], validation_fraction=0.1)
    b = prepare(tmp_path, [tmp_path / "chat.parquet"], validation_fraction=0.1)
    assert (a.name, b.name) == ("conversations-chat-jsonl-bytes", "conversations-chat-parquet-bytes")
    assert open_dataset(a).manifest["fingerprint"] != open_dataset(b).manifest["fingerprint"]  # neither overwrote
