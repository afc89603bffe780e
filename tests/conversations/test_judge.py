"""judge.py against a local HTTP server standing in for an OpenAI-compatible judge: scores, the raw
replies, a reply with no number, HTTP 500s retried a bounded number of times, a timeout, the key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import SLOW, write_run

import judge
import train
from jaxgpt.conversations.judge import PROBE, RUBRIC, Judge, parse_score

SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 1}
TRAIN = {
    "dataset": {"source": "instructions", "options": {"examples": 100, "validation_examples": 6, "template": SHORT}},
    "tokenizer": "bytes",
    "microbatch_size": 4,
    "train_steps": 2,
    "checkpoint_interval": 2,
    "validation_batches": 1,
}


class StandIn(BaseHTTPRequestHandler):
    """POST /v1/chat/completions answered by the server's `reply(prompt, attempt)`: a string (the
    judge's message), an int (an HTTP error status), or a float (seconds to stall, then "50")."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        prompt = body["messages"][0]["content"]
        with server.lock:
            server.requests.append((self.path, self.headers.get("Authorization"), body))
            attempt = sum(1 for _, _, b in server.requests if b["messages"][0]["content"] == prompt)
        out = server.reply(prompt, attempt)
        if isinstance(out, float):
            time.sleep(out)
            out = "50"
        if isinstance(out, int):
            self.send_response(out)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "stand-in failure", "type": "server_error"}}).encode())
            return
        data = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": out}}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[Callable[[Callable], ThreadingHTTPServer]]:
    servers = []

    def start(reply: Callable[[str, int], object]) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
        server.reply, server.requests, server.lock = reply, [], threading.Lock()
        server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("judged")
    run = write_run(tmp / "run", MODEL, TRAIN)
    assert train.main([str(run), "--data-dir", str(tmp / "data")]) == 0
    return run, tmp / "data"


def test_scores_are_the_first_whole_number_of_at_most_100() -> None:
    assert [
        parse_score(r) for r in ("85", "Score: 70/100", "I'd say 12.5 then 40", "2024 was 90", "none", "101 0")
    ] == [85, 70, 40, 90, None, 0]


def test_the_judge_gets_the_books_rubric_and_the_key(stand_in, monkeypatch) -> None:
    server = stand_in(lambda prompt, attempt: "Score: 72")
    verdict = Judge(server.url, "judge-1", "sk-test", timeout=5, retries=0).score("Add 1 and 2.", "3", "4")
    assert (verdict.score, verdict.reply, verdict.error) == (72, "Score: 72", None)
    path, auth, body = server.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and body["model"] == "judge-1"
    assert body["messages"][0]["content"] == RUBRIC.format(instruction="Add 1 and 2.", reference="3", answer="4")
    assert body["temperature"] == 0


def test_http_500_is_retried_a_bounded_number_of_times(stand_in) -> None:
    flaky = stand_in(lambda prompt, attempt: 500 if attempt < 2 else "90")  # fails once, then answers
    assert Judge(flaky.url, "j", "k", timeout=5, retries=2).score("a", "b", "c").score == 90
    broken = stand_in(lambda prompt, attempt: 500)
    verdict = Judge(broken.url, "j", "k", timeout=5, retries=2).score("a", "b", "c")
    assert verdict.score is None and verdict.reply is None and "500" in verdict.error
    assert len(broken.requests) == 3  # the request and its two retries, no more


def test_a_timeout_is_recorded_not_raised(stand_in) -> None:
    slow = stand_in(lambda prompt, attempt: 3.0)
    started = time.monotonic()
    verdict = Judge(slow.url, "j", "k", timeout=0.5, retries=1).score("a", "b", "c")
    assert verdict.score is None and "Timeout" in verdict.error
    assert len(slow.requests) == 2 and time.monotonic() - started < 10


@SLOW  # a fine-tuning run first
def test_judge_command_writes_a_line_per_answer_and_the_mean(tuned, stand_in, tmp_path, monkeypatch, capsys) -> None:
    run, data = tuned
    replies = iter(["80", "no idea", 500, "60", "100", "Score: 20"])  # one each, in the order asked

    def reply(prompt: str, attempt: int) -> object:
        return "100" if prompt == PROBE else next(replies)

    server = stand_in(reply)
    monkeypatch.setenv("JUDGE_KEY", "sk-local")
    out = tmp_path / "judged.jsonl"
    assert (
        judge.main(
            [
                str(run),
                "--url",
                server.url,
                "--model",
                "m",
                "--api-key-env",
                "JUDGE_KEY",
                "--out",
                str(out),
                "--retries",
                "0",
                "--timeout",
                "5",
                "--data-dir",
                str(data),
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and [r["score"] for r in rows] == [80, None, None, 60, 100, 20]
    assert rows[1]["judge_reply"] == "no idea" and rows[1]["error"] is None  # kept, counted, never dropped
    assert rows[2]["judge_reply"] is None and "500" in rows[2]["error"]
    first = rows[0]
    assert first["instruction"].startswith("Q: ") and "A: " not in first["instruction"]
    assert set(first) == {"instruction", "reference", "answer", "score", "judge_reply", "error"}
    summary = json.loads(out.with_name("judged.jsonl.summary.json").read_text())
    assert summary == {"examples": 6, "scored": 4, "mean": 65.0, "unparseable": 1, "failed": 1}
    text = capsys.readouterr().out
    assert "mean score 65.00 over 4 of 6 answers (1 replies without a number, 1 failed requests)" in text
    assert all(auth == "Bearer sk-local" for _, auth, _ in server.requests)
    assert server.requests[0][2]["messages"][0]["content"] == PROBE  # probed before the first answer


def judge_args(run: Path, url: str, out: Path, data: Path) -> list[str]:
    return [str(run), "--url", url, "--model", "m", "--api-key-env", "NONE", "--out", str(out)] + [
        "--retries",
        "0",
        "--timeout",
        "2",
        "--data-dir",
        str(data),
        "--max-new-tokens",
        "4",
    ]


def test_the_probe_says_whether_the_endpoint_answers(stand_in) -> None:
    assert Judge(stand_in(lambda prompt, attempt: "100").url, "j", "k", timeout=5, retries=0).probe() is None
    assert Judge(stand_in(lambda prompt, attempt: "no number").url, "j", "k", timeout=5, retries=0).probe() is None
    assert "500" in Judge(stand_in(lambda prompt, attempt: 500).url, "j", "k", timeout=5, retries=0).probe()
    refused = Judge("http://127.0.0.1:9/v1", "j", "k", timeout=2, retries=0).probe()
    assert refused.startswith("APIConnectionError")


@SLOW  # a fine-tuning run first
def test_an_unreachable_judge_stops_before_any_answer_is_drawn(tuned, stand_in, tmp_path, capsys) -> None:
    run, data = tuned
    out = tmp_path / "judged.jsonl"
    for url in ("http://127.0.0.1:9/v1", stand_in(lambda prompt, attempt: 500).url):
        assert judge.main(judge_args(run, url, out, data)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: the judge at {url} did not answer a first request") and err.count("\n") == 1
        assert not out.exists()  # nothing drawn, nothing written


@SLOW  # a fine-tuning run first
def test_nothing_scored_is_a_failure(tuned, stand_in, tmp_path, capsys) -> None:
    run, data = tuned
    out = tmp_path / "judged.jsonl"
    server = stand_in(lambda prompt, attempt: "100" if prompt == PROBE else 500)  # up, then failing every time
    assert judge.main(judge_args(run, server.url, out, data)) == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["score"] is None and "500" in r["error"] for r in rows)
    assert "error: no answer was scored (6 requests failed)" in capsys.readouterr().err


@SLOW  # a fine-tuning run first
def test_a_missing_key_is_a_usage_error(tuned, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit) as e:
        judge.main(
            [
                str(tuned[0]),
                "--url",
                "http://127.0.0.1:9/v1",
                "--model",
                "m",
                "--api-key-env",
                "NO_SUCH_KEY",
                "--out",
                str(tmp_path / "x.jsonl"),
            ]
        )
    assert e.value.code == 2
