"""serve.py's API in-process (FastAPI over the engine's worker thread, no socket): the Bearer scheme in any
case, a refused parameter named, the answer limit named, the request-size limit, and tokenizing off the
event loop (/health answers while a long prompt is tokenized)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import write_run

from jaxgpt.serving import api

KEY = "k-123"
MODEL = {"architecture": "gpt2", "vocab_size": 257, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 1}


def random_run(folder: Path, model: dict, tokenizer: str = "bytes") -> Path:
    from jaxgpt.checkpoints import store as ckpt
    from jaxgpt.config import ModelConfig
    from jaxgpt.model.gpt import build_model

    run = write_run(folder / "run", model, {"tokenizer": tokenizer, "microbatch_size": 2, "train_steps": 1})
    checkpoint = run / "checkpoints" / "20260101T000000Z-step-1"
    checkpoint.mkdir(parents=True)
    ckpt.save_weights(build_model(ModelConfig(**model), seed=1), checkpoint / ckpt.WEIGHTS)
    (checkpoint / ckpt.META).write_text(json.dumps({"step": 1}))
    return run


def served(run: Path) -> api.Served:
    s = api.load(run, model_name="m", max_batch=4, max_queue=8)
    s.worker.start()
    return s


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    s = served(random_run(tmp_path_factory.mktemp("api"), MODEL))
    yield api.create_app(s, api_key=KEY, max_request_bytes=4096)
    s.worker.stop()


def post(app, path: str, body: dict | bytes, auth: str | None = f"Bearer {KEY}", **kw) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            headers = {"Authorization": auth} if auth else {}
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await client.post(
                path, content=content, headers=headers | {"Content-Type": "application/json"}, **kw
            )

    return asyncio.run(go())


def test_the_bearer_scheme_is_case_insensitive_and_the_key_exact(app) -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 2, "temperature": 0}
    for auth in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY}"):
        assert post(app, "/v1/completions", body, auth).status_code == 200, auth
    for auth in (f"Basic {KEY}", "Bearer wrong", KEY, None):
        r = post(app, "/v1/completions", body, auth)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", auth


def test_a_parameter_of_the_wrong_type_is_named(app) -> None:
    r = post(app, "/v1/completions", {"model": "m", "prompt": "hi", "stream": "yes"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "stream" and error["message"].startswith("stream: ")


def test_too_many_answers_names_the_limit_and_the_parameter(app) -> None:
    r = post(app, "/v1/completions", {"model": "m", "prompt": ["a"] * 200, "max_tokens": 1})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt" and "at most 128" in error["message"]
    assert "200 prompts x n=1 = 200 answers" in error["message"] and "--batch_size 128" in error["message"]
    r = post(app, "/v1/completions", {"model": "m", "prompt": ["a"] * 2, "n": 100, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_request_over_the_size_limit_is_refused_before_it_is_read(app) -> None:
    big = {"model": "m", "prompt": "x" * 5000}
    r = post(app, "/v1/completions", big)  # with its Content-Length
    error = r.json()["error"]
    assert r.status_code == 413 and error["code"] == "request_too_large" and "at most 4,096" in error["message"]

    async def chunked() -> httpx.Response:  # no Content-Length: counted as it arrives
        async def body():
            for _ in range(10):
                yield b" " * 1000

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post("/v1/completions", content=body(), headers={"Authorization": f"Bearer {KEY}"})

    assert asyncio.run(chunked()).status_code == 413


def test_health_answers_while_a_long_prompt_is_tokenized(tmp_path: Path) -> None:
    """A 12 MB prompt of random words takes the GPT-2 tokenizer a second or more: /health, asked 0.1 s after
    it, answers first (tokenizing runs off the event loop; on it, /health would wait for it)."""
    s = served(random_run(tmp_path, {**MODEL, "vocab_size": 50257}, tokenizer="gpt2"))
    app = api.create_app(s, max_request_bytes=16 * 1024 * 1024)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz     "))
    prompt = "".join(np.random.default_rng(0).choice(letters, 12_000_000))
    done: list[str] = []

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:

            async def big() -> None:
                r = await client.post("/v1/completions", json={"model": "m", "prompt": prompt}, timeout=300)
                assert r.status_code == 400 and "context" in r.json()["error"]["message"]
                done.append("completion")

            async def health() -> None:
                await asyncio.sleep(0.1)  # the completion is being read and tokenized by now
                assert (await client.get("/health")).status_code == 200
                done.append("health")

            await asyncio.gather(big(), health())

    try:
        asyncio.run(go())
    finally:
        s.worker.stop()
    assert done == ["health", "completion"]


def test_a_malformed_model_json_in_the_checkpoint_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    import serve

    run = random_run(tmp_path, MODEL)
    (checkpoint,) = (run / "checkpoints").iterdir()
    (run / "model.json").unlink()  # the checkpoint's own copy is what is read
    (checkpoint / "model.json").write_text("{bad")
    assert serve.main([str(run), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {checkpoint / 'model.json'}: malformed JSON") and err.count("\n") == 1
