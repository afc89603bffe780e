"""`uv run -m bench serve`: serve.py's throughput and time to first token with 1, 4 and 16 clients at once.

    uv run -m bench serve                                  # runs/tiny's shape, random weights
    uv run -m bench serve runs/shakespeare-char --clients 1,8 --requests 2 --max-tokens 128 --json serve.json

The model is a run's model.json (default runs/tiny) with random weights, written to a temporary
checkpoint with the bytes tokenizer (no training). serve.py runs it in a process of its own
(--max-batch rows); for each number of clients, that many threads each stream --requests
completions one after another (fixed prompts, --max-tokens each, temperature 1 with a seed per
request: the same text in every run; an answer that draws end-of-text stops early and is counted
as it is). Figures per level: generated tokens per second over the level's wall time (the
server's usage counts), and the time to the first streamed text of each request (p50, p99).
The target: 16 clients at least 4x the tokens per second of one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.compare import cpu_line
from bench.train_step import BenchError
from jaxgpt.config import ModelConfig, load_run_configs, to_dict

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN = ROOT / "runs" / "tiny"
PROMPTS = (
    "Every effort moves you",
    "Once upon a time, there",
    "The quick brown fox jumps",
    "In the beginning the",
    "To be or not to be, that",
    "It was the best of times",
)
TARGET = 4.0  # tokens/s with 16 clients over tokens/s with 1


def write_checkpoint(cfg: ModelConfig, folder: Path) -> Path:
    """A run folder whose one checkpoint holds `cfg`'s model with random weights, bytes tokenizer."""
    from jaxgpt.checkpoints import store
    from jaxgpt.model.gpt import build_model

    run = folder / "bench-serve"
    checkpoint = run / "checkpoints" / "20260101T000000Z-step-0"
    checkpoint.mkdir(parents=True)
    (run / "model.json").write_text(json.dumps(to_dict(cfg)))
    (run / "train.json").write_text(json.dumps({"tokenizer": "bytes", "microbatch_size": 1, "train_steps": 1}))
    store.save_weights(build_model(cfg), checkpoint / store.WEIGHTS)
    (checkpoint / store.META).write_text(json.dumps({"step": 0}))
    return run


def start(run: Path, log: Path, max_batch: int, timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """serve.py on a free port; returns the process and its base URL once /health answers."""
    import httpx

    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "serve.py"),
                str(run),
                "--port",
                "0",
                "--max-batch",
                str(max_batch),
                "--max-queue",
                "256",
                "--model-name",
                "bench",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"serve.py exited with code {proc.returncode}: {log.read_text()[-2000:]}")
        found = re.search(r" at (http://\S+)/v1", log.read_text())
        if found:
            try:
                if httpx.get(found.group(1) + "/health", timeout=30).status_code == 200:
                    return proc, found.group(1)
            except httpx.ConnectError:  # the line comes just before uvicorn listens
                pass
        time.sleep(0.1)
    proc.kill()
    raise BenchError(f"serve.py did not start within {timeout:.0f} s: {log.read_text()[-2000:]}")


def one_request(client: Any, url: str, prompt: str, max_tokens: int, seed: int) -> tuple[float, float, int]:
    """One streamed completion: (seconds to the first text, seconds in all, tokens generated)."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, tokens = None, 0
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    return (total if first is None else first), total, tokens


def level(url: str, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """`clients` threads at once, each streaming `requests` completions in turn."""
    import httpx

    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def client_thread(c: int) -> None:
        with httpx.Client() as client:
            for r in range(requests):
                out = one_request(client, url, PROMPTS[(c + r) % len(PROMPTS)], max_tokens, seed=1000 * c + r)
                with lock:
                    results.append(out)

    threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = np.array([r[0] for r in results]) * 1e3
    tokens = sum(r[2] for r in results)
    return {
        "clients": clients,
        "requests": len(results),
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "request_s_median": float(np.median([r[1] for r in results])),
    }


def bench_serve(
    cfg: ModelConfig,
    *,
    clients: list[int],
    requests: int = 8,
    max_tokens: int = 64,
    max_batch: int = 16,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Start serve.py on `cfg` (random weights), warm it, then time each number of clients."""
    from jaxgpt.cpu import kernels as cpu_kernels

    longest = max(len(p.encode()) for p in PROMPTS)
    if longest + max_tokens > cfg.context_length:
        raise BenchError(
            f"--max-tokens {max_tokens} + the longest prompt ({longest} tokens) exceeds "
            f"context_length={cfg.context_length}"
        )
    cpu = cpu_kernels.cpu_info()
    log(cpu_line(cpu) + f"; load average now {os.getloadavg()[0]:.2f}")
    log(
        f"model: {cfg.n_layers} layers, {cfg.emb_dim} dims, context {cfg.context_length}, vocab {cfg.vocab_size} "
        f"(random weights); serve.py --max-batch {max_batch}; {requests} streamed request(s) per client, "
        f"max_tokens {max_tokens}, temperature 1, seeded"
    )
    log(HEADER)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        run = write_checkpoint(cfg, Path(tmp))
        proc, url = start(run, Path(tmp) / "serve.log", max_batch)
        try:
            level(url, 1, 1, max_tokens)  # untimed: compiles what the prompts' prefill lengths need
            levels = []
            for n in clients:
                levels.append(level(url, n, requests, max_tokens))
                log(_row(levels[-1]))
        finally:
            proc.terminate()
            code = proc.wait(timeout=120)
    if code != 0:
        raise BenchError(f"serve.py exited with code {code} on SIGTERM (expected 0)")
    figures = {
        "cpu": cpu.get("model"),
        "model": to_dict(cfg),
        "max_batch": max_batch,
        "max_tokens": max_tokens,
        "requests_per_client": requests,
        "levels": levels,
    }
    by = {lv["clients"]: lv["tokens_per_s"] for lv in levels}
    if 1 in by and 16 in by:
        figures["ratio_16_over_1"] = by[16] / by[1]
        log(f"16 clients / 1 client: {figures['ratio_16_over_1']:.2f}x tokens/s (target >= {TARGET:g}x)")
    return figures


HEADER = f"{'clients':>7} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9}"


def _row(lv: dict[str, Any]) -> str:
    return (
        f"{lv['clients']:>7} {lv['requests']:>8} {lv['tokens']:>7} {lv['seconds']:>8.2f} {lv['tokens_per_s']:>9.1f} "
        f"{lv['ttft_p50_ms']:>7.1f}ms {lv['ttft_p99_ms']:>7.1f}ms"
    )


def load_cfg(run: Path | None) -> ModelConfig:
    return load_run_configs(run if run is not None else DEFAULT_RUN)[0]


MEMORY_TARGET = 1.3  # resident memory after `total` requests over that after the first `first`


def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for process {pid}")


def bench_memory(
    cfg: ModelConfig,
    *,
    clients: int = 64,
    first: int = 100,
    total: int = 2000,
    max_tokens: int = 16,
    max_batch: int = 64,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """serve.py's resident memory after its first `first` requests and after `total` (each rounded up to
    a whole number per client), `clients` at a time
    (streamed, as `level` sends them): what the server holds must not grow with the requests served."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        run = write_checkpoint(cfg, Path(tmp))
        proc, url = start(run, Path(tmp) / "serve.log", max_batch)
        try:
            each = -(-first // clients)  # every client the same count: at least `first` in all
            level(url, clients, each, max_tokens)
            after_first, done = rss_mib(proc.pid), clients * each
            each = -(-(total - done) // clients)
            level(url, clients, each, max_tokens)
            after_all, total = rss_mib(proc.pid), done + clients * each
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    ratio = after_all / after_first
    log(
        f"resident memory, --max-batch {max_batch}, {clients} clients: {after_first:,.0f} MiB after the first {done} "
        f"requests, {after_all:,.0f} MiB after {total:,}: {ratio:.2f}x (target <= {MEMORY_TARGET:g}x)"
    )
    return {
        "clients": clients,
        "max_batch": max_batch,
        "rss_first_mib": after_first,
        "rss_last_mib": after_all,
        "ratio": ratio,
        "target": MEMORY_TARGET,
        "met": ratio <= MEMORY_TARGET,
    }
