"""serve.py's chat page (GET /, jaxgpt/serving/chat_page.html) in headless Chromium: the system's chromium and
chromedriver driven by selenium (nothing downloaded), against a tiny model served by uvicorn on a free port of
127.0.0.1 as serve.py serves it (api.load, the engine started, create_app, an API key). The page asks for the
key and shows a wrong one refused; two turns stream the server's own answers; stop mid-answer cancels the
request (the engine frees its row: /health's `cancelled`) and the next turn carries what was drawn; a prompt
over the context shows the server's message; a base model gets the completion page; a server gone away is
said so. Without Chromium every test here is skipped with one line (.ci/run installs it where it can). The
page without a browser: test_serving_api.py.

Screenshots mid-answer, wide and narrow, go to tmp_path, or to the folder $JAXGPT_SCREENSHOTS names:
`JAXGPT_SCREENSHOTS=docs uv run pytest tests/serving/test_chat_page.py` remakes docs/chat-page*.png."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from conftest import SLOW
from safetensors.numpy import load_file, save_file
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait
from test_serve import KEY, MODEL, SHORT, random_run

from jaxgpt.checkpoints.layout import WEIGHTS
from jaxgpt.generation.engine import Engine
from jaxgpt.serving import api

pytestmark = SLOW  # a browser, two servers

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container has no sandbox to give it
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WIDE, NARROW = (1000, 720), (390, 720)
WAIT_S = 300  # a deadline for what a loaded machine may be slow at, not a timing
CONTEXT = 512
GATE_STEPS = 4  # turns the engine runs before the stop test holds it mid-answer


def printable_run(folder: Path, template: dict | None) -> Path:
    """random_run's model writing printable ASCII only: the output head's columns of every other token are
    zeroed, so greedy decoding never draws them (text the DOM keeps as it is, a readable screenshot, no end of
    text: every answer runs to its maximum length)."""
    run = random_run(folder, {**MODEL, "context_length": CONTEXT}, template)
    (checkpoint,) = (run / "checkpoints").iterdir()
    tensors = load_file(checkpoint / WEIGHTS)
    keep = np.zeros(MODEL["vocab_size"], np.float32)
    keep[32:127] = 1.0
    tensors["head.kernel"] = tensors["head.kernel"] * keep  # (C, V)
    save_file(tensors, checkpoint / WEIGHTS)
    return run


@dataclass
class Site:
    url: str
    served: api.Served

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=60).json()

    def greedy(self, path: str, body: dict) -> str:
        """The server's own answer (temperature 0), through the API rather than the page."""
        r = httpx.post(
            self.url + path,
            json={"model": self.served.name, "temperature": 0, **body},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=WAIT_S,
        )
        choice = r.raise_for_status().json()["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"]


@contextlib.contextmanager
def serving(run: Path, *, api_key: str | None, name: str) -> Iterator[Site]:
    """The app as serve.py builds it, run by uvicorn on a thread on a free port until the block ends."""
    served = api.load(run, model_name=name, max_batch=2, max_queue=4)
    served.worker.start()
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(api.create_app(served, api_key=api_key), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield Site(f"http://127.0.0.1:{sock.getsockname()[1]}", served)
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@dataclass
class Page:
    """The page in the browser, read and driven as a user would."""

    driver: webdriver.Chrome
    site: Site

    def open(self) -> None:
        self.driver.get(self.site.url + "/")
        self.wait(lambda: self.find("model").text == self.site.served.name, "the page names the model")

    def find(self, element_id: str):
        return self.driver.find_element(By.ID, element_id)

    def wait(self, condition: Callable[[], object], what: str) -> None:
        WebDriverWait(self.driver, WAIT_S, poll_frequency=0.05).until(lambda _: condition(), message=what)

    def set(self, element_id: str, value: object) -> None:
        field = self.find(element_id)
        field.clear()
        field.send_keys(str(value))

    def say(self, text: str) -> None:
        """Type a message and press Enter."""
        self.find("input").send_keys(text, Keys.ENTER)

    def idle(self) -> bool:
        return self.find("send").is_displayed() and not self.find("stop").is_displayed()

    def answers(self) -> list[str]:
        """Each answer's text as the page shows it (without its note: stopped, cut at the maximum length)."""
        return self.driver.execute_script(
            "return [...document.querySelectorAll('.assistant')]"
            ".map(d => d.firstChild && d.firstChild.nodeType === 3 ? d.firstChild.nodeValue : '')"
        )

    def notes(self) -> list[str]:
        return [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, ".assistant .note")]

    def errors(self) -> list[str]:
        return [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, ".error")]

    def turn(self, text: str, answers: int) -> str:
        """Say `text` and wait for its whole answer (the page's `answers`-th)."""
        self.say(text)
        self.wait(lambda: len(self.answers()) == answers and self.idle(), f"the answer to {text!r}")
        return self.answers()[-1]

    def screenshot(self, folder: Path, name: str) -> None:
        """The page as it is now, at both widths."""
        folder.mkdir(parents=True, exist_ok=True)
        for size, path in ((WIDE, folder / f"{name}.png"), (NARROW, folder / f"{name}-narrow.png")):
            self.driver.set_window_size(*size)
            self.driver.save_screenshot(str(path))
            assert path.stat().st_size > 10_000, path
        self.driver.set_window_size(*WIDE)


class Gate:
    """The engine's turns held once `after` have run, until release(): the answer being drawn stays
    mid-stream for as long as the test needs, however fast the model draws."""

    def __init__(self, engine: Engine, after: int) -> None:
        self.engine, self.left = engine, after
        self.held, self.opened = threading.Event(), threading.Event()
        engine.step = self  # the instance's attribute, looked up before the class's method

    def __call__(self) -> list:
        if self.left == 0:
            self.held.set()
            self.opened.wait()
        self.left -= 1
        return Engine.step(self.engine)

    def release(self) -> None:
        del self.engine.step
        self.opened.set()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no Chromium: apt-get install chromium chromium-driver (.ci/run does, as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--window-size={WIDE[0]},{WIDE[1]}"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))  # no download
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(browser: webdriver.Chrome, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A chat model served with an API key."""
    run = printable_run(tmp_path_factory.mktemp("chat"), SHORT)
    with serving(run, api_key=KEY, name="tiny-chat") as site:
        yield Page(browser, site)


def test_the_page_asks_for_the_key_and_shows_a_wrong_one_refused(page: Page) -> None:
    page.open()
    assert page.find("key").is_displayed() and "chat" in page.find("kind").text
    page.say("Hello there.")
    page.wait(lambda: page.errors(), "the page asks for the key")
    assert "needs its API key" in page.errors()[0] and page.find("input").get_attribute("value") == "Hello there."
    page.set("key", "wrong")
    page.find("send").click()
    page.wait(lambda: len(page.errors()) == 2 and page.idle(), "the refusal")
    assert page.errors()[1] == "401: Incorrect API key provided" and page.answers() == []
    assert page.find("input").get_attribute("value") == "Hello there."  # given back, to send again


def test_two_turns_stream_the_servers_answers_and_stop_cancels_the_request(page: Page, tmp_path: Path) -> None:
    page.open()
    page.set("key", KEY)
    page.set("temperature", 0)
    page.set("max-tokens", 24)
    messages = [{"role": "user", "content": "Hello there."}]
    first = page.turn("Hello there.", 1)
    assert first == page.site.greedy("/v1/chat/completions", {"messages": messages, "max_tokens": 24})
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
    second = page.turn("And then?", 2)
    assert second == page.site.greedy("/v1/chat/completions", {"messages": messages, "max_tokens": 24})
    assert len(first) == len(second) == 24 and page.notes() == ["(cut at the maximum length)"] * 2

    # Stop mid-answer: the engine is held after GATE_STEPS turns; the browser drops the request; its row is freed.
    page.set("max-tokens", 400)
    engine, before = page.site.served.worker.engine, page.site.health()
    gate = Gate(engine, GATE_STEPS)
    try:
        page.say("Tell me more.")
        page.wait(gate.held.is_set, "the engine held mid-answer")
        (request,) = [r for r in engine.rows if r is not None]
        held = len(request.sampled)  # a greedy answer draws a burst of tokens a turn (Engine.burst)
        drawn = page.site.served.tok.decode(request.sampled)
        page.wait(lambda: page.answers() == [first, second, drawn], "what was drawn, shown")
        page.screenshot(Path(os.environ.get("JAXGPT_SCREENSHOTS", tmp_path)), "chat-page")
        page.find("stop").click()
        page.wait(lambda: request.cancelled, "the request cancelled")
    finally:
        gate.release()
    page.wait(lambda: page.site.health()["busy_rows"] == 0, "the row freed")
    after = page.site.health()
    assert request.finish_reason == "cancelled" and len(request.sampled) == held >= GATE_STEPS and drawn
    assert after["cancelled"] - before["cancelled"] == 1 and after["tokens"] - before["tokens"] == held
    assert page.answers()[-1] == drawn and page.notes()[-1] == "(stopped)" and page.idle()

    # The conversation goes on from what was drawn.
    page.set("max-tokens", 8)
    messages += [
        {"role": "assistant", "content": second},
        {"role": "user", "content": "Tell me more."},
        {"role": "assistant", "content": drawn},
        {"role": "user", "content": "Go on."},
    ]
    assert page.turn("Go on.", 4) == page.site.greedy("/v1/chat/completions", {"messages": messages, "max_tokens": 8})


def test_a_prompt_longer_than_the_context_shows_the_servers_message(page: Page) -> None:
    page.open()
    page.set("key", KEY)
    page.find("new").click()
    page.driver.execute_script("arguments[0].value = arguments[1]", page.find("input"), "x" * (CONTEXT + 8))
    page.find("send").click()
    page.wait(lambda: page.errors() and page.idle(), "the refusal")
    (error,) = page.errors()
    assert error.startswith("400: ") and f"the model's context is {CONTEXT} tokens" in error, error
    assert page.answers() == []


def test_a_base_model_gets_a_completion_page_and_a_server_gone_is_said(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    with serving(printable_run(tmp_path, None), api_key=None, name="tiny-base") as site:
        page = Page(browser, site)
        page.open()
        assert "base model" in page.find("kind").text and not page.find("key").is_displayed()
        page.set("temperature", 0)
        page.set("max-tokens", 16)
        text = page.turn("Once upon a time", 1)
        assert text == site.greedy("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16})
    page.say("And then?")  # the server has shut down
    page.wait(lambda: page.errors() and page.idle(), "the error")
    assert page.errors() == ["the server did not answer or went away (is serve.py still running?)"]
