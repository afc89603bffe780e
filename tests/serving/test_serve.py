"""serve.py: a real server process driven by the openai client and plain HTTP. Completions (a string,
strings, ids, lists of ids), greedy text equal to test_generation.py's, echo + logprobs equal to the
model's own per-token losses (evaluate.py's scoring program), streaming equal to whole answers, stop
strings, seeds, 16 clients at once equal to one at a time, chat through a fine-tuned checkpoint's
template (a base model refused), every error in OpenAI's shape, the API key, the non-local host
refusal, the full queue's 503, SIGTERM's exit 0. Each starts a server process: they are in the whole
suite, the fast tier keeps the start-up refusal only."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from conftest import ROOT, SLOW, write_run

import serve
import test_generation
from jaxgpt.conversations.assistant import Assistant
from jaxgpt.generation.sampling import SamplingParams

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


def random_run(folder: Path, model: dict, template: dict | None = None) -> Path:
    """A run whose one checkpoint holds random weights and, as fine-tuning writes it, a chat template
    (the server reads only the file: what the weights learnt does not matter here)."""
    from jaxgpt.checkpoints import store as ckpt
    from jaxgpt.config import ModelConfig
    from jaxgpt.conversations.template import TEMPLATE_FILE, ChatTemplate
    from jaxgpt.model.gpt import build_model

    run = write_run(folder / "run", model, {"tokenizer": "bytes", "microbatch_size": 2, "train_steps": 1})
    checkpoint = run / "checkpoints" / "20260101T000000Z-step-1"
    checkpoint.mkdir(parents=True)
    ckpt.save_weights(build_model(ModelConfig(**model), seed=1), checkpoint / ckpt.WEIGHTS)
    (checkpoint / ckpt.META).write_text(json.dumps({"step": 1}))
    if template is not None:
        (checkpoint / TEMPLATE_FILE).write_text(json.dumps(ChatTemplate.from_dict(template).to_dict(), indent=2))
    return run


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_run(tmp_path_factory.mktemp("tuned"), MODEL, SHORT)


@pytest.fixture(scope="module")
def server(tuned: Path, tmp_path_factory: pytest.TempPathFactory):
    s = start_server(tuned, tmp_path_factory.mktemp("log") / "serve.log", "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base model (no chat template) whose context leaves room for long answers."""
    return random_run(tmp_path_factory.mktemp("base"), {**MODEL, "context_length": 512})


@pytest.fixture(scope="module")
def small_server(base: Path, tmp_path_factory: pytest.TempPathFactory):
    """One row and room for one waiting request: the queue's limit is easy to reach."""
    s = start_server(
        base,
        tmp_path_factory.mktemp("log") / "serve.log",
        "--max-batch",
        "1",
        "--max-queue",
        "1",
        "--model-name",
        "base",
    )
    yield s
    s.stop()


def complete(server: Server, **kw) -> openai.types.Completion:
    return server.client().completions.create(model=server.name, **kw)


# ----------------------------------------------------------------------------- completions


@SLOW  # a server subprocess
def test_models_and_health(server: Server) -> None:
    assert [m.id for m in server.client().models.list()] == [server.name] and server.name == "run"
    health = httpx.get(server.url + "/health").json()  # no key needed
    assert health["status"] == "ok" and health["rows"] == 16


@SLOW  # a server subprocess
def test_a_prompt_as_a_string_strings_ids_or_lists_of_ids_gives_the_same_greedy_text(server: Server) -> None:
    ids = list(b"Reverse the letters: abc")
    one = complete(server, prompt="Reverse the letters: abc", max_tokens=12, temperature=0)
    assert one.choices[0].finish_reason in ("stop", "length") and one.usage.prompt_tokens == len(ids)
    text = one.choices[0].text
    assert complete(server, prompt=ids, max_tokens=12, temperature=0).choices[0].text == text
    both = complete(server, prompt=["Reverse the letters: abc", "Add 1 and 2."], max_tokens=12, temperature=0)
    assert [c.index for c in both.choices] == [0, 1] and both.choices[0].text == text
    lists = complete(server, prompt=[ids, list(b"Add 1 and 2.")], max_tokens=12, temperature=0)
    assert [c.text for c in lists.choices] == [c.text for c in both.choices]


@SLOW  # a server subprocess
def test_greedy_text_equals_test_generations_continuation(server: Server, tuned: Path, capsys) -> None:
    prompt = "Every effort moves you"
    assert test_generation.main([str(tuned), "--prompt", prompt, "--max-new-tokens", "30"]) == 0
    # "Checkpoint: ...", prompt + continuation, a blank line, the speed: the random model's text holds any byte.
    printed = capsys.readouterr().out.split("\n", 1)[1].rsplit("\n\n[", 1)[0]
    got = complete(server, prompt=prompt, max_tokens=30, temperature=0).choices[0].text
    assert prompt + got == printed


@SLOW  # a server subprocess
def test_echo_logprobs_are_the_models_per_token_losses(server: Server, tuned: Path) -> None:
    """The prompt's token logprobs equal minus evaluate.py's per-token losses (scoring.ending_losses:
    the model's forward pass and cross-entropy), as lm-eval's local-completions asks for them."""
    import jax.numpy as jnp

    from jaxgpt.checkpoints.store import load_model
    from jaxgpt.evaluation.scoring import ending_losses

    text = "Spell the word: abcd"
    ids = list(text.encode())
    # lm-eval's loglikelihood request: ids, max_tokens 1, echo, logprobs 1, temperature 0.
    r = server.post(
        "/v1/completions",
        {"model": server.name, "prompt": [ids], "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0},
    ).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"][: len(ids)]) == text and r["choices"][0]["text"].startswith(text)
    assert lp["text_offset"][: len(ids)] == list(range(len(ids)))
    model, *_ = load_model(tuned)
    tokens, mask = np.array([ids]), np.zeros((len(ids), len(ids)), np.float32)
    for t in range(1, len(ids)):
        mask[t, t] = 1.0  # row t scores token t alone
    losses, _ = ending_losses(model, jnp.asarray(np.repeat(tokens, len(ids), 0)), jnp.asarray(mask))
    np.testing.assert_allclose(lp["token_logprobs"][1 : len(ids)], -np.asarray(losses)[1:], rtol=1e-5, atol=1e-5)
    for got, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert len(top) == 1 and max(top.values()) >= got - 1e-6
    # max_tokens 0: the prompt alone, scored the same way.
    r0 = complete(server, prompt=text, max_tokens=0, echo=True, logprobs=0)
    assert r0.choices[0].text == text and r0.choices[0].logprobs.token_logprobs == lp["token_logprobs"][: len(ids)]


@SLOW  # a server subprocess
def test_streamed_chunks_make_the_whole_answer(server: Server) -> None:
    kw = {"prompt": "Sort the letters of: dcba", "max_tokens": 40, "temperature": 1.0, "seed": 7}
    response = complete(server, **kw)
    whole = response.choices[0]
    chunks = list(complete(server, stream=True, **kw))
    assert len(chunks) > 2 and "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    with_usage = list(complete(server, stream=True, stream_options={"include_usage": True}, **kw))
    assert with_usage[-1].choices == [] and with_usage[-1].usage == response.usage


@SLOW  # a server subprocess
def test_a_stop_string_cuts_the_text_before_it_streamed_or_not(server: Server) -> None:
    kw = {"prompt": "Add 1 and 2.", "max_tokens": 40, "temperature": 1.0, "seed": 3}
    text = complete(server, **kw).choices[0].text
    assert len(text) > 8
    stop = next(
        text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].isascii() and text[i : i + 2].isprintable()
    )
    cut = complete(server, stop=[stop, "never appears"], **kw).choices[0]
    assert cut.text == text[: text.index(stop)] and cut.finish_reason == "stop"
    assert "".join(c.choices[0].text for c in complete(server, stop=stop, stream=True, **kw)) == cut.text


@SLOW  # a server subprocess
def test_a_seed_gives_each_choice_its_own_generator(server: Server) -> None:
    kw = {"prompt": "Spell the word: ab", "max_tokens": 20, "temperature": 1.0, "n": 3, "seed": 11}
    first = [c.text for c in complete(server, **kw).choices]
    assert [c.text for c in complete(server, **kw).choices] == first and len(set(first)) == 3
    # Choice i draws from seed + i: the first choice of seed 12 is the second of seed 11.
    assert complete(server, **{**kw, "n": 1, "seed": 12}).choices[0].text == first[1]
    assert (
        complete(server, **{**kw, "n": 1, "extra_body": {"top_k": 1}}).choices[0].text
        == complete(server, **{**kw, "n": 1, "temperature": 0}).choices[0].text
    )  # top_k 1 is greedy


@SLOW  # a server subprocess
def test_sixteen_clients_at_once_get_what_each_gets_alone(server: Server) -> None:
    def request(i: int) -> str:
        kw = {
            "prompt": f"Reverse the letters: {'abcdefghijklmnop'[: i + 1]}",
            "max_tokens": 10 + 3 * i,
            "temperature": 1.0,
            "top_p": 0.9,
            "seed": 100 + i,
        }
        if i % 2:
            return "".join(c.choices[0].text for c in complete(server, stream=True, **kw))
        return complete(server, **kw).choices[0].text

    alone = [request(i) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(request, range(16)))
    assert together == alone


@SLOW  # a server subprocess
def test_max_tokens_stops_where_the_context_is_full(server: Server) -> None:
    prompt = "x" * 60  # the context is 64 tokens
    r = complete(server, prompt=prompt, max_tokens=50, temperature=0)
    assert r.usage.completion_tokens <= 4 and r.choices[0].finish_reason in ("length", "stop")


# ----------------------------------------------------------------------------- chat


@SLOW  # a server subprocess
def test_chat_answers_through_the_checkpoints_template(server: Server, tuned: Path) -> None:
    messages = [{"role": "user", "content": "Reverse the letters: abc"}]
    bot = Assistant.load(tuned)
    want = bot.answer(messages, SamplingParams(24, temperature=0.0))
    chat = server.client().chat.completions.create(model=server.name, messages=messages, max_tokens=24, temperature=0)
    assert chat.choices[0].message.content == want and chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == len(bot.template.prompt(bot.tok, messages))
    kw = {
        "model": server.name,
        "messages": messages,
        "max_completion_tokens": 30,
        "temperature": 1.0,
        "seed": 5,
        "n": 2,
    }
    whole = server.client().chat.completions.create(**kw)
    pieces = ["", ""]
    for chunk in server.client().chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            pieces[c.index] += c.delta.content or ""
    assert pieces == [c.message.content for c in whole.choices]


@SLOW  # a server subprocess
def test_chat_logprobs_list_each_answer_token_with_its_bytes(server: Server) -> None:
    chat = server.client().chat.completions.create(
        model=server.name,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        messages=[{"role": "user", "content": "Hi"}],
    )
    choice = chat.choices[0]
    content = [c for c in choice.logprobs.content if c.token != "<|endoftext|>"]  # a stop token is listed too
    assert len(content) == chat.usage.completion_tokens - (choice.finish_reason == "stop")
    assert b"".join(bytes(c.bytes) for c in content).decode(errors="replace") == choice.message.content
    for c in content:  # greedy: each token is the most likely one
        assert len(c.top_logprobs) == 2 and c.logprob == c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob


@SLOW  # a server subprocess
def test_a_base_model_refuses_chat(small_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        small_server.client().chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert "base is a base model (no chat template" in str(e.value) and "/v1/completions" in str(e.value)


# ----------------------------------------------------------------------------- errors and auth


BAD = [  # (path, body, status, param, words in the message)
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model", "does not exist"),
    ("/v1/completions", {"model": "M", "prompt": "x", "temperature": -1}, 400, "temperature", "greater than"),
    ("/v1/completions", {"model": "M", "prompt": "x", "temperature": "hot"}, 400, "temperature", "valid number"),
    ("/v1/completions", {"model": "M", "prompt": "x", "top_p": 0}, 400, "top_p", "greater than 0"),
    ("/v1/completions", {"model": "M", "prompt": "x", "top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
    ("/v1/completions", {"model": "M", "prompt": "x", "n": 0}, 400, "n", "greater than or equal to 1"),
    ("/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 1.5}, 400, "max_tokens", "valid integer"),
    ("/v1/completions", {"model": "M", "prompt": ""}, 400, "prompt", "empty"),
    ("/v1/completions", {"model": "M", "prompt": []}, 400, "prompt", "empty"),
    ("/v1/completions", {"model": "M", "prompt": [1, 257]}, 400, "prompt", "token id 257 is out of range"),
    ("/v1/completions", {"model": "M", "prompt": "x" * 65}, 400, "prompt", "65 tokens; the model's context is 64"),
    ("/v1/completions", {"model": "M", "prompt": "x", "logprobs": 21}, 400, "logprobs", "less than or equal"),
    (
        "/v1/completions",
        {"model": "M", "prompt": "x", "presence_penalty": 0.5},
        400,
        "presence_penalty",
        "not supported",
    ),
    ("/v1/completions", {"model": "M", "prompt": "x", "colour": 1}, 400, "colour", "unknown parameter"),
    ("/v1/completions", "{not json", 400, None, "not valid JSON"),
    ("/v1/completions", {"prompt": "x"}, 400, "model", "Field required"),
    (
        "/v1/chat/completions",
        {"model": "M", "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages",
        "needs a role",
    ),
    ("/v1/chat/completions", {"model": "M", "messages": []}, 400, "messages", "at least 1"),
    (
        "/v1/chat/completions",
        {"model": "M", "messages": [{"role": "user", "content": "x" * 80}]},
        400,
        "messages",
        "the model's context is 64",
    ),
    ("/v1/nothing", {}, 404, None, "no such endpoint"),
]


@SLOW  # a server subprocess
@pytest.mark.parametrize("path, body, status, param, words", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_request_is_an_openai_error_naming_the_parameter(
    server: Server, path, body, status, param, words
) -> None:
    if isinstance(body, dict) and body.get("model") == "M":
        body = {**body, "model": server.name}
    r = server.post(path, body)
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}, r.text
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error


@SLOW  # a server subprocess
def test_the_api_key_is_required_except_for_health(server: Server) -> None:
    body = {"model": server.name, "prompt": "x", "max_tokens": 1}
    for key, words in ((None, "No API key provided"), ("wrong", "Incorrect API key")):
        r = server.post("/v1/completions", body, key=key)
        assert r.status_code == 401 and words in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").models.list()
    assert httpx.get(server.url + "/v1/models").status_code == 401 and httpx.get(server.url + "/healthz").is_success


def test_another_host_without_a_key_is_refused_at_start_up(capsys) -> None:
    assert serve.main(["runs/does-not-matter", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --host 0.0.0.0 serves beyond this machine: give --api-key") and err.count("\n") == 1


# ----------------------------------------------------------------------------- the queue, SIGTERM


@SLOW  # a server subprocess
def test_a_client_that_goes_away_frees_its_rows(small_server: Server) -> None:
    def health() -> dict:
        return httpx.get(small_server.url + "/health").json()

    before = health()
    body = {"model": "base", "prompt": "Once", "max_tokens": 495, "n": 6, "stream": True, "seed": 2}
    with httpx.stream("POST", small_server.url + "/v1/completions", json=body, timeout=60) as r:
        next(r.iter_lines())  # decoding has begun; then the connection closes
    deadline = time.monotonic() + 60
    while health()["busy_rows"] or health()["waiting_choices"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    after = health()  # one row: the six answers one after another, the later ones never started
    assert after["prefills"] - before["prefills"] < 6 and after["tokens"] - before["tokens"] < 6 * 495


@SLOW  # a server subprocess
def test_a_full_queue_answers_503_with_retry_after_and_sigterm_exits_0(small_server: Server) -> None:
    """One row, one waiting request allowed: a long request decodes, a second waits, a third is told to retry.
    Then SIGTERM: the request in flight finishes, the one still waiting is answered 503, the server exits 0."""
    base = {"model": "base", "prompt": "Once upon a time", "temperature": 1.0, "seed": 1}
    long = small_server.client().completions.create(**base, max_tokens=495, n=6, stream=True)
    first = next(iter(long))  # decoding: the first choice holds the row, the others wait inside the request
    results: dict[str, object] = {}
    waiting = threading.Thread(
        target=lambda: results.update(second=small_server.post("/v1/completions", {**base, "max_tokens": 5}))
    )
    waiting.start()
    deadline = time.monotonic() + 60
    while httpx.get(small_server.url + "/health").json()["waiting_requests"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    full = small_server.post("/v1/completions", {**base, "max_tokens": 5})
    assert full.status_code == 503 and full.headers["Retry-After"] == "1"
    assert (
        set(full.json()["error"]) == {"message", "type", "param", "code"}
        and full.json()["error"]["code"] == "overloaded"
    )
    small_server.proc.send_signal(signal.SIGTERM)
    rest = "".join(c.choices[0].text for c in long if c.choices)
    waiting.join(120)
    assert small_server.proc.wait(timeout=120) == 0
    assert len(first.choices[0].text + rest) > 495
    second = results["second"]
    assert second.status_code == 503 and second.json()["error"]["code"] == "shutting_down"
    assert "Finished server process" in small_server.log.read_text() and "Traceback" not in small_server.log.read_text()


@SLOW  # a server subprocess
def test_when_the_grace_runs_out_streams_end_with_an_error_event_and_done(base: Path, tmp_path: Path) -> None:
    """--shutdown-grace 2 (no more than the margin kept to end them): at SIGTERM the answer being drawn ends at
    once with an error event and [DONE]; the requests still waiting, streamed or not, are answered 503."""
    server = start_server(base, tmp_path / "serve.log", "--max-batch", "1", "--shutdown-grace", "2")
    try:
        _grace_runs_out(server)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def _grace_runs_out(server: Server) -> None:
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
                    {k: httpx.post(server.url + "/v1/completions", json={**body, "stream": k == "stream"}, timeout=120)}
                )
            )
            for k in ("stream", "whole")
        ]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").json()["waiting_requests"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        lines += list(stream)
    for t in waiting:
        t.join(120)
    assert server.proc.wait(timeout=120) == 0
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" and "shutting down" in json.loads(events[-2][6:])["error"]["message"]
    for k in ("stream", "whole"):
        assert results[k].status_code == 503 and results[k].json()["error"]["code"] == "shutting_down", k
    assert "Traceback" not in server.log.read_text()


@SLOW  # a server subprocess
def test_the_serving_line_comes_when_connections_are_accepted_and_sigterm_while_loading_exits_0(
    base: Path, tmp_path: Path
) -> None:
    server = start_server(base, tmp_path / "serve.log", first_try=True)  # /health answers at the first try
    assert server.stop() == 0
    log = tmp_path / "early.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "serve.py"), str(base), "--port", "0"], cwd=ROOT, stdout=out, stderr=out
        )
    deadline = time.monotonic() + 120
    while "Loading" not in log.read_text():  # the model is being loaded: SIGTERM now
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    assert "Serving" not in log.read_text() and "Traceback" not in log.read_text()
