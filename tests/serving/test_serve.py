"""serve.py, the command: a non-local host without a key and a malformed model.json refused in one line
(exit 2) before anything is served; and as a real process, what only a process shows: the "Serving" line
once connections are accepted, SIGTERM at any time exits 0 (with an answer in flight, which finishes,
and a request waiting, answered 503; when the grace runs out, the stream cut with an error event and
[DONE]; while loading). The API itself, in-process: test_serving_api.py."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from conftest import ROOT, SLOW, write_run

import serve

KEY = "test-key"
SHORT = {"name": "short", "user": "Q: {content}\n", "assistant": "A: {content}", "end": "<|endoftext|>"}
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 1}


@dataclass
class Server:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log: Path
    name: str

    def client(self, key: str | None = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=120)

    def post(self, path: str, body: dict | str, key: str | None = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, str) else json.dumps(body)
        return httpx.post(
            self.url + path, content=content, headers=headers | {"Content-Type": "application/json"}, timeout=120
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


def start_server(run: Path, log: Path, *flags: str, first_try: bool = False) -> Server:
    """serve.py on a free port (--port 0: the port it bound is in its first line), ready when /health answers
    (first_try: at the first attempt after the "Serving" line, which comes once connections are accepted)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "serve.py"), str(run), "--port", "0", *flags],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = re.search(r"Serving '([^']+)' .* at (http://\S+)/v1", log.read_text())
        if found:
            server = Server(proc, found.group(2), log, found.group(1))
            if first_try:
                assert httpx.get(server.url + "/health", timeout=30).status_code == 200
                return server
            with contextlib.suppress(httpx.ConnectError):
                if httpx.get(server.url + "/health", timeout=30).status_code == 200:
                    return server
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"serve.py did not start: {log.read_text()}")


def random_run(folder: Path, model: dict, template: dict | None = None, tokenizer: str = "bytes") -> Path:
    """A run whose one checkpoint holds random weights and, as fine-tuning writes it, a chat template
    (the server reads only the file: what the weights learnt does not matter here)."""
    from jaxgpt.checkpoints import store as ckpt
    from jaxgpt.config import ModelConfig
    from jaxgpt.conversations.template import TEMPLATE_FILE, ChatTemplate
    from jaxgpt.model.gpt import build_model

    run = write_run(folder / "run", model, {"tokenizer": tokenizer, "microbatch_size": 2, "train_steps": 1})
    checkpoint = run / "checkpoints" / "20260101T000000Z-step-1"
    checkpoint.mkdir(parents=True)
    ckpt.save_weights(build_model(ModelConfig(**model), seed=1), checkpoint / ckpt.WEIGHTS)
    (checkpoint / ckpt.META).write_text(json.dumps({"step": 1}))
    if template is not None:
        (checkpoint / TEMPLATE_FILE).write_text(json.dumps(ChatTemplate.from_dict(template).to_dict(), indent=2))
    return run


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base model (no chat template) whose context leaves room for long answers."""
    return random_run(tmp_path_factory.mktemp("base"), {**MODEL, "context_length": 512})


# ----------------------------------------------------------------------------- refused at start-up


def test_another_host_without_a_key_is_refused_at_start_up(capsys) -> None:
    assert serve.main(["runs/does-not-matter", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --host 0.0.0.0 serves beyond this machine: give --api-key") and err.count("\n") == 1


def test_a_malformed_model_json_in_the_checkpoint_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    run = random_run(tmp_path, MODEL)
    (checkpoint,) = (run / "checkpoints").iterdir()
    (run / "model.json").unlink()  # the checkpoint's own copy is what is read
    (checkpoint / "model.json").write_text("{bad")
    assert serve.main([str(run), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {checkpoint / 'model.json'}: malformed JSON") and err.count("\n") == 1


# ----------------------------------------------------------------------------- a real process: SIGTERM


@SLOW  # three serve.py processes
def test_the_serving_line_comes_when_connections_are_accepted_and_sigterm_at_any_time_exits_0(
    base: Path, tmp_path: Path
) -> None:
    """What needs a real process (the socket, uvicorn's shutdown on a signal), in three processes:
    - the "Serving" line comes once connections are accepted (/health answers at the first try);
      one row and room for one waiting request: SIGTERM while a long answer streams and a second request
      waits: the answer in flight finishes, the waiting request is answered 503, the server exits 0;
    - --shutdown-grace 2 (no more than the margin kept to end them): at SIGTERM the answer being drawn ends
      at once with an error event and [DONE]; the requests still waiting, streamed or not, are answered 503;
    - SIGTERM while the model is being loaded: exit 0, nothing served."""
    _in_flight_finishes(base, tmp_path / "serve.log")
    _grace_runs_out(base, tmp_path / "grace.log")
    _sigterm_while_loading(base, tmp_path / "early.log")


def _in_flight_finishes(run: Path, log: Path) -> None:
    server = start_server(run, log, "--max-batch", "1", "--max-queue", "1", "--model-name", "base", first_try=True)
    try:
        base = {"model": "base", "prompt": "Once upon a time", "temperature": 1.0, "seed": 1}
        long = server.client().completions.create(**base, max_tokens=495, n=6, stream=True)
        first = next(iter(long))  # decoding: the first choice holds the row, the others wait inside the request
        results: dict[str, httpx.Response] = {}
        waiting = threading.Thread(
            target=lambda: results.update(second=server.post("/v1/completions", {**base, "max_tokens": 5}))
        )
        waiting.start()
        _wait_for(server, waiting_requests=1)
        server.proc.send_signal(signal.SIGTERM)
        rest = "".join(c.choices[0].text for c in long if c.choices)
        waiting.join(120)
        assert server.proc.wait(timeout=120) == 0
        assert len(first.choices[0].text + rest) > 495
        second = results["second"]
        assert second.status_code == 503 and second.json()["error"]["code"] == "shutting_down"
        assert "Finished server process" in log.read_text() and "Traceback" not in log.read_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def _grace_runs_out(run: Path, log: Path) -> None:
    server = start_server(run, log, "--max-batch", "1", "--shutdown-grace", "2")
    try:
        body = {"model": server.name, "prompt": "Once", "max_tokens": 500, "temperature": 1.0, "seed": 3}
        lines: list[str] = []
        long = {**body, "stream": True, "n": 6}  # six answers on one row: drawing for seconds
        with httpx.stream("POST", server.url + "/v1/completions", json=long, timeout=120) as running:
            stream = running.iter_lines()
            lines.append(next(stream))  # drawing
            results: dict[str, httpx.Response] = {}
            waiting = [
                threading.Thread(
                    target=lambda k=k: results.update(
                        {
                            k: httpx.post(
                                server.url + "/v1/completions", json={**body, "stream": k == "stream"}, timeout=120
                            )
                        }
                    )
                )
                for k in ("stream", "whole")
            ]
            for t in waiting:
                t.start()
            _wait_for(server, waiting_requests=2)
            server.proc.send_signal(signal.SIGTERM)
            lines += list(stream)
        for t in waiting:
            t.join(120)
        assert server.proc.wait(timeout=120) == 0
        events = [line for line in lines if line]
        assert events[-1] == "data: [DONE]" and "shutting down" in json.loads(events[-2][6:])["error"]["message"]
        for k in ("stream", "whole"):
            assert results[k].status_code == 503 and results[k].json()["error"]["code"] == "shutting_down", k
        assert "Traceback" not in log.read_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def _sigterm_while_loading(run: Path, log: Path) -> None:
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "serve.py"), str(run), "--port", "0"], cwd=ROOT, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 120
        while "Loading" not in log.read_text():  # the model is being loaded: SIGTERM now
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        assert "Serving" not in log.read_text() and "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def _wait_for(server: Server, waiting_requests: int) -> None:
    """Until /health counts `waiting_requests` requests waiting for a row."""
    deadline = time.monotonic() + 60
    while httpx.get(server.url + "/health").json()["waiting_requests"] < waiting_requests:
        assert time.monotonic() < deadline
        time.sleep(0.01)
