"""serve.py's API in-process: the app over the engine's worker thread (api.load, worker.start, create_app)
driven through FastAPI's TestClient (no socket) by the openai client and plain HTTP. Completions (a
string, strings, ids, lists of ids), greedy text equal to test_generation.py's, echo + logprobs equal to
the model's own per-token losses (evaluate.py's scoring program), streaming equal to whole answers, stop
strings, seeds, 16 clients at once equal to one at a time, chat through a fine-tuned checkpoint's
template (a base model refused), the chat page served (in a browser: test_chat_page.py), every error in
OpenAI's shape, the API key and the Bearer scheme in any case, the answer limit named, the request-size
limit, tokenizing off the event loop (/health answers while a long prompt is tokenized), a client that
goes away, the full queue's 503. serve.py as a process (start-up, SIGTERM): test_serve.py."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from conftest import SLOW
from fastapi.testclient import TestClient
from test_serve import KEY, MODEL, SHORT, random_run

import test_generation
from jaxgpt.conversations.assistant import Assistant
from jaxgpt.generation.sampling import SamplingParams
from jaxgpt.serving import api


@dataclass
class App:
    """An app over a started engine, reached in-process: the openai client and plain HTTP."""

    http: TestClient
    name: str

    def client(self, key: str | None = KEY) -> openai.OpenAI:
        return openai.OpenAI(
            base_url="http://testserver/v1", api_key=key or "none", http_client=self.http, max_retries=0
        )

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def post(self, path: str, body: dict | str | bytes, auth: str | None = f"Bearer {KEY}") -> httpx.Response:
        headers = {"Authorization": auth} if auth else {}
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return self.http.post(path, content=content, headers=headers | {"Content-Type": "application/json"})


@contextlib.contextmanager
def serving(
    run: Path, *, api_key: str | None = KEY, max_request_bytes: int = api.MAX_REQUEST_BYTES, **load
) -> Iterator[App]:
    """The app as serve.py builds it (api.load, the engine started, create_app); TestClient's lifespan stops
    the engine at the end."""
    served = api.load(run, **load)
    served.worker.start()
    with TestClient(api.create_app(served, api_key=api_key, max_request_bytes=max_request_bytes)) as http:
        yield App(http, served.name)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_run(tmp_path_factory.mktemp("tuned"), MODEL, SHORT)


@pytest.fixture(scope="module")
def server(tuned: Path) -> Iterator[App]:
    """serve.py's defaults: the run's name, 16 rows, 64 waiting requests; an API key."""
    with serving(tuned, model_name=None, max_batch=16, max_queue=64) as app:
        yield app


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """A base model (no chat template) whose context leaves room for long answers, on one row with room for
    one waiting request (the queue's limit is easy to reach); no API key."""
    base = random_run(tmp_path_factory.mktemp("base"), {**MODEL, "context_length": 512})
    with serving(base, api_key=None, model_name="base", max_batch=1, max_queue=1) as app:
        yield app


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """Requests of at most 4,096 bytes."""
    run = random_run(tmp_path_factory.mktemp("api"), MODEL)
    with serving(run, max_request_bytes=4096, model_name="m", max_batch=4, max_queue=8) as app:
        yield app


def complete(server: App, **kw) -> openai.types.Completion:
    return server.client().completions.create(model=server.name, **kw)


# ----------------------------------------------------------------------------- completions


def test_models_and_health(server: App) -> None:
    assert [m.id for m in server.client().models.list()] == [server.name] and server.name == "run"
    health = server.get("/health").json()  # no key needed
    assert health["status"] == "ok" and health["rows"] == 16


def test_a_prompt_as_a_string_strings_ids_or_lists_of_ids_gives_the_same_greedy_text(server: App) -> None:
    ids = list(b"Reverse the letters: abc")
    one = complete(server, prompt="Reverse the letters: abc", max_tokens=12, temperature=0)
    assert one.choices[0].finish_reason in ("stop", "length") and one.usage.prompt_tokens == len(ids)
    text = one.choices[0].text
    assert complete(server, prompt=ids, max_tokens=12, temperature=0).choices[0].text == text
    both = complete(server, prompt=["Reverse the letters: abc", "Add 1 and 2."], max_tokens=12, temperature=0)
    assert [c.index for c in both.choices] == [0, 1] and both.choices[0].text == text
    lists = complete(server, prompt=[ids, list(b"Add 1 and 2.")], max_tokens=12, temperature=0)
    assert [c.text for c in lists.choices] == [c.text for c in both.choices]


def test_greedy_text_equals_test_generations_continuation(server: App, tuned: Path, capsys) -> None:
    prompt = "Every effort moves you"
    assert test_generation.main([str(tuned), "--prompt", prompt, "--max-new-tokens", "30"]) == 0
    # "Checkpoint: ...", prompt + continuation, a blank line, the speed: the random model's text holds any byte.
    printed = capsys.readouterr().out.split("\n", 1)[1].rsplit("\n\n[", 1)[0]
    got = complete(server, prompt=prompt, max_tokens=30, temperature=0).choices[0].text
    assert prompt + got == printed


def test_echo_logprobs_are_the_models_per_token_losses(server: App, tuned: Path) -> None:
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


def test_streamed_chunks_make_the_whole_answer(server: App) -> None:
    kw = {"prompt": "Sort the letters of: dcba", "max_tokens": 40, "temperature": 1.0, "seed": 7}
    response = complete(server, **kw)
    whole = response.choices[0]
    chunks = list(complete(server, stream=True, **kw))
    assert len(chunks) > 2 and "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    with_usage = list(complete(server, stream=True, stream_options={"include_usage": True}, **kw))
    assert with_usage[-1].choices == [] and with_usage[-1].usage == response.usage


def test_a_stop_string_cuts_the_text_before_it_streamed_or_not(server: App) -> None:
    kw = {"prompt": "Add 1 and 2.", "max_tokens": 40, "temperature": 1.0, "seed": 3}
    text = complete(server, **kw).choices[0].text
    assert len(text) > 8
    stop = next(
        text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].isascii() and text[i : i + 2].isprintable()
    )
    cut = complete(server, stop=[stop, "never appears"], **kw).choices[0]
    assert cut.text == text[: text.index(stop)] and cut.finish_reason == "stop"
    assert "".join(c.choices[0].text for c in complete(server, stop=stop, stream=True, **kw)) == cut.text


def test_a_seed_gives_each_choice_its_own_generator(server: App) -> None:
    kw = {"prompt": "Spell the word: ab", "max_tokens": 20, "temperature": 1.0, "n": 3, "seed": 11}
    first = [c.text for c in complete(server, **kw).choices]
    assert [c.text for c in complete(server, **kw).choices] == first and len(set(first)) == 3
    # Choice i draws from seed + i: the first choice of seed 12 is the second of seed 11.
    assert complete(server, **{**kw, "n": 1, "seed": 12}).choices[0].text == first[1]
    assert (
        complete(server, **{**kw, "n": 1, "extra_body": {"top_k": 1}}).choices[0].text
        == complete(server, **{**kw, "n": 1, "temperature": 0}).choices[0].text
    )  # top_k 1 is greedy


def test_sixteen_clients_at_once_get_what_each_gets_alone(server: App) -> None:
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


def test_max_tokens_stops_where_the_context_is_full(server: App) -> None:
    prompt = "x" * 60  # the context is 64 tokens
    r = complete(server, prompt=prompt, max_tokens=50, temperature=0)
    assert r.usage.completion_tokens <= 4 and r.choices[0].finish_reason in ("length", "stop")


# ----------------------------------------------------------------------------- chat


def test_chat_answers_through_the_checkpoints_template(server: App, tuned: Path) -> None:
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


def test_chat_logprobs_list_each_answer_token_with_its_bytes(server: App) -> None:
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


def test_a_base_model_refuses_chat(small: App) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        small.client().chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert "base is a base model (no chat template" in str(e.value) and "/v1/completions" in str(e.value)


# ----------------------------------------------------------------------------- the chat page


def page_facts(html: str) -> dict:
    """What the server wrote into the page: the model's name, chat or not, its context, whether a key is needed."""
    return json.loads(re.search(r'<script id="config" type="application/json">(.*?)</script>', html).group(1))


def test_the_chat_page_is_open_self_contained_and_names_the_model(server: App, small: App) -> None:
    """GET / needs no key (its requests carry the key typed in it) and fetches nothing from elsewhere: no
    URL, no src or href, no @import; a base model's page is the completion page. In a browser: test_chat_page.py."""
    r = server.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?:|//[\w.-]+\.\w|\b(src|href)\s*=|@import|url\(", r.text, re.I)
    assert page_facts(r.text) == {"model": "run", "chat": True, "context": 64, "key": True}
    assert "/v1/chat/completions" in r.text and "/v1/completions" in r.text and "Bearer" in r.text
    assert page_facts(small.get("/").text) == {"model": "base", "chat": False, "context": 512, "key": False}


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


@pytest.mark.parametrize("path, body, status, param, words", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_request_is_an_openai_error_naming_the_parameter(server: App, path, body, status, param, words) -> None:
    if isinstance(body, dict) and body.get("model") == "M":
        body = {**body, "model": server.name}
    r = server.post(path, body)
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}, r.text
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error


def test_the_api_key_is_required_except_for_health(server: App) -> None:
    body = {"model": server.name, "prompt": "x", "max_tokens": 1}
    for key, words in ((None, "No API key provided"), ("wrong", "Incorrect API key")):
        r = server.post("/v1/completions", body, auth=key and f"Bearer {key}")
        assert r.status_code == 401 and words in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").models.list()
    assert server.get("/v1/models").status_code == 401 and server.get("/healthz").is_success


def test_the_bearer_scheme_is_case_insensitive_and_the_key_exact(limited: App) -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 2, "temperature": 0}
    for auth in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY}"):
        assert limited.post("/v1/completions", body, auth).status_code == 200, auth
    for auth in (f"Basic {KEY}", "Bearer wrong", KEY, None):
        r = limited.post("/v1/completions", body, auth)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", auth


def test_a_parameter_of_the_wrong_type_is_named(limited: App) -> None:
    r = limited.post("/v1/completions", {"model": "m", "prompt": "hi", "stream": "yes"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "stream" and error["message"].startswith("stream: ")


def test_too_many_answers_names_the_limit_and_the_parameter(limited: App) -> None:
    r = limited.post("/v1/completions", {"model": "m", "prompt": ["a"] * 200, "max_tokens": 1})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt" and "at most 128" in error["message"]
    assert "200 prompts x n=1 = 200 answers" in error["message"] and "--batch_size 128" in error["message"]
    r = limited.post("/v1/completions", {"model": "m", "prompt": ["a"] * 2, "n": 100, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_request_over_the_size_limit_is_refused_before_it_is_read(limited: App) -> None:
    big = {"model": "m", "prompt": "x" * 5000}
    r = limited.post("/v1/completions", big)  # with its Content-Length
    error = r.json()["error"]
    assert r.status_code == 413 and error["code"] == "request_too_large" and "at most 4,096" in error["message"]

    def body() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000

    chunked = limited.http.post("/v1/completions", content=body(), headers={"Authorization": f"Bearer {KEY}"})
    assert chunked.status_code == 413


@SLOW  # a GPT-2-sized vocabulary and a 12 MB prompt
def test_health_answers_while_a_long_prompt_is_tokenized(tmp_path: Path) -> None:
    """A 12 MB prompt of random words takes the GPT-2 tokenizer a second or more: /health, asked 0.1 s after
    it, answers first (tokenizing runs off the event loop; on it, /health would wait for it)."""
    run = random_run(tmp_path, {**MODEL, "vocab_size": 50257}, tokenizer="gpt2")
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz     "))
    prompt = "".join(np.random.default_rng(0).choice(letters, 12_000_000))
    done: list[str] = []
    limits = {"max_request_bytes": 16 * 1024 * 1024, "max_batch": 4, "max_queue": 8}
    with serving(run, api_key=None, model_name="m", **limits) as app:

        def big() -> httpx.Response:
            r = app.http.post("/v1/completions", json={"model": "m", "prompt": prompt})
            done.append("completion")
            return r

        with ThreadPoolExecutor(1) as pool:
            completion = pool.submit(big)
            time.sleep(0.1)  # the completion is being read and tokenized by now
            assert app.get("/health").status_code == 200
            done.append("health")
            r = completion.result()
        assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    assert done == ["health", "completion"]


# ----------------------------------------------------------------------------- the queue


def test_a_client_that_goes_away_frees_its_rows(small: App) -> None:
    def health() -> dict:
        return small.get("/health").json()

    before = health()
    body = {"model": "base", "prompt": "Once", "max_tokens": 495, "n": 6, "stream": True, "seed": 2}
    with small.http.stream("POST", "/v1/completions", json=body) as r:
        next(r.iter_lines())  # decoding has begun; then the connection closes
    deadline = time.monotonic() + 60
    while health()["busy_rows"] or health()["waiting_choices"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    after = health()  # one row: the six answers one after another, the later ones never started
    assert after["prefills"] - before["prefills"] < 6 and after["tokens"] - before["tokens"] < 6 * 495


def test_a_full_queue_answers_503_with_retry_after(small: App) -> None:
    """One row, one waiting request allowed: a long request decodes, a second waits, a third is told to retry;
    the long one finishes and the second is answered."""
    base = {"model": "base", "prompt": "Once upon a time", "temperature": 1.0, "seed": 1}
    long = small.client().completions.create(**base, max_tokens=495, n=6, stream=True)
    first = next(iter(long))  # decoding: the first choice holds the row, the others wait inside the request
    results: dict[str, httpx.Response] = {}
    waiting = threading.Thread(
        target=lambda: results.update(second=small.post("/v1/completions", {**base, "max_tokens": 5}))
    )
    waiting.start()
    deadline = time.monotonic() + 60
    while small.get("/health").json()["waiting_requests"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    full = small.post("/v1/completions", {**base, "max_tokens": 5})
    assert full.status_code == 503 and full.headers["Retry-After"] == "1"
    assert (
        set(full.json()["error"]) == {"message", "type", "param", "code"}
        and full.json()["error"]["code"] == "overloaded"
    )
    rest = "".join(c.choices[0].text for c in long if c.choices)
    waiting.join(120)
    assert len(first.choices[0].text + rest) > 495
    assert results["second"].status_code == 200
