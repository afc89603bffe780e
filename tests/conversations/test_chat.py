"""Talking to a fine-tuned model: chat.py (one shot, interactive, streamed), the checkpoint's template,
base models refused unless --raw, sampling flags that mean what they say; evaluate.py --exact-match."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SLOW, write_run

import chat
import evaluate
import test_generation
import train
from jaxgpt.checkpoints.store import load_model
from jaxgpt.conversations.assistant import Assistant
from jaxgpt.conversations.template import ChatTemplate
from jaxgpt.data.tokenizer import get_tokenizer
from jaxgpt.generation.sampling import SamplingParams

SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 1}
TRAIN = {
    "dataset": {"source": "instructions", "options": {"examples": 200, "validation_examples": 20, "template": SHORT}},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "train_steps": 6,
    "learning_rate": 0.003,
    "checkpoint_interval": 6,
    "validation_batches": 1,
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run dir, data root) of a fine-tuning run of a few steps on the instruction set."""
    tmp = tmp_path_factory.mktemp("tuned")
    run = write_run(tmp / "run", MODEL, TRAIN)
    assert train.main([str(run), "--data-dir", str(tmp / "data")]) == 0
    return run, tmp / "data"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint as fine-tuning writes one (weights, configs, meta.json, chat_template.json), of a
    model with random weights: what chat.py reads, without a training run."""
    from jaxgpt.checkpoints import store as ckpt
    from jaxgpt.config import ModelConfig, to_dict
    from jaxgpt.model.gpt import build_model

    folder = tmp_path_factory.mktemp("built") / "ckpt"
    folder.mkdir()
    cfg = ModelConfig(**MODEL)
    ckpt.save_weights(build_model(cfg, seed=3), folder / ckpt.WEIGHTS)
    (folder / "model.json").write_text(json.dumps(to_dict(cfg)))
    (folder / "train.json").write_text(json.dumps({"tokenizer": "bytes"}))
    (folder / "chat_template.json").write_text(json.dumps(ChatTemplate.from_dict(SHORT).to_dict()))
    (folder / ckpt.META).write_text(json.dumps({"step": 1}))
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """A base model: trained on plain text, no chat template."""
    run = write_run(
        tmp_path_factory.mktemp("base") / "run",
        MODEL,
        {
            "dataset": {"source": "builtin"},
            "tokenizer": "bytes",
            "microbatch_size": 4,
            "train_steps": 2,
            "checkpoint_interval": 2,
            "validation_batches": 1,
        },
    )
    assert train.main([str(run), "--data-dir", str(data_root)]) == 0
    return run


def test_one_shot_prints_the_greedy_answer_of_the_checkpoints_template(built, capsys) -> None:
    run = built
    bot = Assistant.load(run)
    assert bot.template == ChatTemplate.from_dict(SHORT)  # read from the checkpoint's chat_template.json
    want = bot.answer([{"role": "user", "content": "Reverse the letters: abc"}], SamplingParams(20, temperature=0.0))
    capsys.readouterr()
    assert chat.main([str(run), "-p", "Reverse the letters: abc", "--temperature", "0", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_the_answer_streams_in_pieces_that_make_the_whole_answer(built) -> None:
    bot = Assistant.load(built)
    sampling = SamplingParams(30, temperature=1.0, seed=3)
    messages = [{"role": "user", "content": "Spell the word: abcd"}]
    pieces = list(bot.stream(messages, sampling))
    assert "".join(pieces) == bot.answer(messages, sampling) and len(pieces) > 1
    assert bot.answer(messages, sampling) == bot.answer(messages, sampling)  # the same seed, the same answer
    # Batched answers equal one-at-a-time answers (each row draws from its own seeded generator).
    many = [[{"role": "user", "content": f"Sort the letters of: {w}"}] for w in ("dcba", "zyx", "qwerty")]
    assert Assistant.load(built, rows=3).answer_all(many, sampling) == [bot.answer(m, sampling) for m in many]


def test_a_multi_token_end_is_cut_from_the_answer(built) -> None:
    end = "ab"  # two byte tokens: an answer stops once its ids end with them
    model, _cfg, tok, _path = load_model(built)
    bot2 = Assistant(model, tok, ChatTemplate.from_dict({**SHORT, "end": end}))
    assert bot2.params(SamplingParams()).end == tuple(get_tokenizer("bytes").encode(end))
    (done,) = bot2.requests([[{"role": "user", "content": "hi"}]], SamplingParams(40, temperature=2.0, seed=1))
    assert end not in done.text.text
    if done.finish_reason == "stop":  # the ids drawn end with the end's, which the text leaves out
        assert tok.decode(done.sampled).endswith(done.text.text + end)


@SLOW  # a subprocess, or a second training run
def test_interactive_conversation_streams_and_clears(tuned) -> None:
    run, _ = tuned
    script = "Reverse the letters: abc\nAdd 1 and 2.\n/clear\nSpell the word: ab\n/quit\n"
    done = subprocess.run(
        [sys.executable, str(ROOT / "chat.py"), str(run), "--max-new-tokens", "8", "--seed", "2"],
        input=script,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Assistant: ") == 3 and "(a new conversation)" in done.stdout
    assert "template 'short'" in done.stdout


@SLOW  # a subprocess, or a second training run
def test_a_base_model_is_refused_in_one_line_unless_raw(base: Path, capsys) -> None:
    assert chat.main([str(base), "-p", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "a base model (no chat template" in err and err.count("\n") == 1
    assert chat.main([str(base), "--raw", "-p", "Every effort", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Every effort")


@pytest.mark.parametrize("command", [chat.main, test_generation.main], ids=["chat", "test_generation"])
def test_top_p_or_top_k_without_a_temperature_is_an_error(command, built, capsys) -> None:
    run = built
    for flags in (["--top-p", "0.9", "--temperature", "0"], ["--top-k", "5", "--temperature", "0"]):
        extra = ["-p", "x"] if command is chat.main else []
        with pytest.raises(SystemExit) as e:
            command([str(run), *flags, *extra])
        assert e.value.code == 2
        assert "but --temperature is 0 (greedy, nothing is sampled)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        test_generation.main([str(run), "--top-p", "0.9"])  # its default temperature is 0: greedy
    assert "--top-p filters what is sampled" in capsys.readouterr().err


@SLOW  # a subprocess, or a second training run
def test_exact_match_scores_the_held_out_instructions_for_tuned_and_base_models(tuned, base, tmp_path, capsys) -> None:
    run, data = tuned
    out = tmp_path / "answers.jsonl"
    assert evaluate.main([str(run), "--exact-match", "--data-dir", str(data), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "exact match" in text and "(" in text.splitlines()[-1] and "of 20)" in text.splitlines()[-1]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and all(r["correct"] == (r["answer"].strip() == r["reference"].strip()) for r in rows)
    # A base model answers the same questions through the tuned run's template.
    assert evaluate.main([str(base), "--exact-match", str(run), "--data-dir", str(data), "--limit", "5"]) == 0
    assert "of 5)" in capsys.readouterr().out
    # A dataset of plain text has no questions.
    assert evaluate.main([str(base), "--exact-match", str(base), "--data-dir", str(data)]) == 2
    assert "not a conversation dataset" in capsys.readouterr().err


def test_a_message_too_long_for_the_context_is_refused_and_the_conversation_kept(built, capsys, monkeypatch) -> None:
    """The checkpoint's context is 64 bytes: a 200-character message cannot be answered; said in one line,
    then the chat goes on with what came before."""
    script = iter(["Reverse the letters: ab", "x" * 200, "Spell the word: ab", "/quit"])
    monkeypatch.setattr("builtins.input", lambda _prompt="": next(script))
    assert chat.main([str(built), "--max-new-tokens", "4", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("Assistant: ") == 2
    refused = [line for line in out.splitlines() if line.startswith("(not sent: ")]
    assert len(refused) == 1 and "the model's context is 64" in refused[0] and "is kept" in refused[0]


@SLOW  # a subprocess
def test_ctrl_c_at_the_prompt_keeps_the_chat_and_ctrl_d_ends_it(built) -> None:
    # A shell's background job (CI started with `&`) ignores SIGINT, and Python then installs no
    # KeyboardInterrupt handler in its children: the child installs it, as a terminal's process has it.
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['chat.py', {str(built)!r}, '--max-new-tokens', '4']; "
        "runpy.run_path('chat.py', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", start],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )

    def read_to_prompt() -> str:
        seen = ""
        while not seen.endswith("You: "):  # waiting at the prompt
            char = proc.stdout.read(1)
            assert char, proc.stderr.read()
            seen += char
        return seen

    read_to_prompt()
    proc.send_signal(signal.SIGINT)  # Ctrl-C at the prompt: a hint, and the prompt again
    assert "(Ctrl-C stops an answer; /quit or Ctrl-D ends the chat)" in read_to_prompt()
    out, err = proc.communicate("Reverse the letters: ab\n", timeout=300)  # then Ctrl-D (end of input)
    assert proc.returncode == 0, err
    assert "Assistant: " in out


@pytest.mark.parametrize(
    "command, args",
    [
        ("chat.py", ["--temperature", "-1"]),
        ("test_generation.py", ["--top-k", "0"]),
        ("judge.py", ["--url", "http://x/v1", "--model", "m", "--out", "o.jsonl", "--limit", "0"]),
        ("serve.py", ["--max-batch", "0"]),
        ("evaluate.py", ["--tasks", "builtin", "--samples", "0"]),
    ],
)
def test_usage_errors_come_before_jax_starts(command: str, args: list[str]) -> None:
    """A command-line mistake is answered without importing JAX (seconds on a busy machine)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{command!r}, 'runs/tiny', *{args!r}]\n"
        "try:\n"
        f"    runpy.run_path({command!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 2, e.code\n"
        "assert 'jax' not in sys.modules, 'jax was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
