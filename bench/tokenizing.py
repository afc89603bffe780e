"""`uv run -m bench tokenize`: preparing a text corpus against tiktoken's own batch encoding.

A synthetic JSONL corpus of about --megabytes MB (default 100) of ~8 KB English documents, built
once, deterministically and offline, from this Python's own documentation (the built-in corpus's
paragraphs, shuffled with a fixed seed and packed into documents) and kept under --corpus-dir.
Then, --rounds times, alternately, two fresh processes over that file:

  (i)  bench/tiktoken_batch.py: the documents read into memory first, then only tiktoken's
       `encode_ordinary_batch(docs, num_threads=os.cpu_count())` timed (gpt2, nothing written);
  (ii) `download_dataset.py text <file> --tokenizer gpt2 --data-dir <fresh temporary folder>`,
       timed from start to exit (interpreter start, reading, hold-out, tokenizing, writing).

Both figures are MB of the corpus file per second; the ratio is (ii) / (i) of the medians over
the rounds (the target is >= 0.8). Each round prints both figures, their CPU seconds and the
1-minute load average at its start; the header names the CPU.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.train_step import BenchError
from jaxgpt.caches import cpu_model
from jaxgpt.cpu.malloc import TUNABLE

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(__file__).with_name("tiktoken_batch.py")  # side (i)
DOWNLOAD_DATASET = ROOT / "download_dataset.py"  # side (ii)
DOCUMENT_BYTES = 8000  # a document is paragraphs up to at least this many bytes of text
TARGET_RATIO = 0.8
SEED = 0


def corpus_documents(megabytes: float) -> list[str]:
    """~8 KB documents totalling about `megabytes` MB of JSONL: the built-in corpus's paragraphs,
    reshuffled (fixed seed) each time they run out, so every document reads as prose."""
    from jaxgpt.data.sources.builtin import builtin_documents

    paragraphs = [p for doc in builtin_documents() for p in doc.split("\n\n") if p.strip()]
    rng = random.Random(SEED)
    target = int(megabytes * 1e6)
    docs: list[str] = []
    written = 0
    while written < target:
        rng.shuffle(paragraphs)
        current: list[str] = []
        size = 0
        for paragraph in paragraphs:
            current.append(paragraph)
            size += len(paragraph.encode()) + 2
            if size >= DOCUMENT_BYTES:
                docs.append("\n\n".join(current))
                written += len(json.dumps({"text": docs[-1]})) + 1
                current, size = [], 0
                if written >= target:
                    break
    return docs


def corpus_file(megabytes: float, folder: Path, log: Callable[[str], None] = print) -> Path:
    """The corpus of `megabytes` MB in `folder`, written (atomically) unless it is there already."""
    version = ".".join(map(str, sys.version_info[:2]))  # the built-in corpus is this Python's docs
    path = Path(folder) / f"tokenize-{megabytes:g}MB-python{version}.jsonl"
    if path.is_file():
        return path
    log(f"writing the benchmark corpus {path} (~{megabytes:g} MB of ~{DOCUMENT_BYTES // 1000} KB documents)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.part-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in corpus_documents(megabytes):
                f.write(json.dumps({"text": doc}) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _plain_env() -> dict[str, str]:
    """This environment without the huge-page malloc tunable `python -m bench` sets for JAX
    (jaxgpt/cpu/malloc.py): both sides run as a shell starts them, download_dataset.py without it."""
    env = dict(os.environ)
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t != f"{TUNABLE}=1"]
    env.pop("GLIBC_TUNABLES", None)
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)
    return env


def _run(command: list[str], what: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of a fresh process; BenchError with its last line if it fails."""
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=_plain_env())
    seconds, cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"{what} failed (exit {proc.returncode}): {last}")
    return seconds, cpu_s, proc.stdout


def reference_round(corpus: Path) -> dict[str, Any]:
    """Side (i): tiktoken's encode_ordinary_batch on every core, the encoding alone timed."""
    _, _, out = _run([sys.executable, str(REFERENCE), str(corpus)], REFERENCE.name)
    return json.loads(out.strip().splitlines()[-1])


def prepare_round(corpus: Path, script: Path) -> dict[str, Any]:
    """Side (ii): the whole download_dataset.py, start to exit, into a fresh data folder."""
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as data_dir:
        seconds, cpu_s, out = _run(
            [sys.executable, str(script), "text", str(corpus), "--tokenizer", "gpt2", "--data-dir", data_dir],
            script.name,
        )
    return {"seconds": seconds, "cpu_s": cpu_s, "log": out.strip().splitlines()[-1:]}


def _one_round(
    rnd: int, rounds: int, corpus: Path, script: Path, size_mb: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """One round: side (i) then side (ii) on the corpus, their speeds and ratio, logged as it ends."""
    load = os.getloadavg()[0]  # noted so that a noisy machine shows in the figures
    ref = reference_round(corpus)
    ours = prepare_round(corpus, script)
    run = {
        "load_avg_at_start": load,
        "tiktoken_mb_per_s": size_mb / ref["seconds"],
        "tiktoken_seconds": ref["seconds"],
        "tiktoken_cpu_s": ref["cpu_s"],
        "prepare_mb_per_s": size_mb / ours["seconds"],
        "prepare_seconds": ours["seconds"],
        "prepare_cpu_s": ours["cpu_s"],
        "documents": ref["documents"],
        "tokens": ref["tokens"],
        "threads": ref["threads"],
    }
    run["ratio"] = run["prepare_mb_per_s"] / run["tiktoken_mb_per_s"]
    log(
        f"round {rnd + 1}/{rounds} (load {load:.2f}): tiktoken encode_ordinary_batch "
        f"{run['tiktoken_mb_per_s']:.2f} MB/s ({ref['seconds']:.2f} s, {ref['cpu_s']:.1f} CPU s, "
        f"{ref['threads']} threads) | download_dataset.py text {run['prepare_mb_per_s']:.2f} MB/s "
        f"({ours['seconds']:.2f} s, {ours['cpu_s']:.1f} CPU s) | ratio {run['ratio']:.2f}"
    )
    return run


def bench_tokenize(
    megabytes: float = 100.0,
    rounds: int = 3,
    corpus_dir: Path | None = None,
    script: Path = DOWNLOAD_DATASET,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The two sides alternated `rounds` times (see the module docstring); the figures --json writes."""
    if not megabytes > 0 or rounds < 1:
        raise BenchError(f"--megabytes must be > 0 and --rounds >= 1, got {megabytes} and {rounds}")
    if not Path(script).is_file():
        raise BenchError(f"{script}: no such file (--script)")
    if corpus_dir is None:
        from jaxgpt.preparation.prepare import default_data_root

        corpus_dir = default_data_root() / "bench"
    corpus = corpus_file(megabytes, Path(corpus_dir), log)
    size_mb = corpus.stat().st_size / 1e6
    log(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs); corpus {corpus} ({size_mb:.1f} MB)")
    runs = [_one_round(rnd, rounds, corpus, Path(script), size_mb, log) for rnd in range(rounds)]
    tiktoken = statistics.median(r["tiktoken_mb_per_s"] for r in runs)
    prepare = statistics.median(r["prepare_mb_per_s"] for r in runs)
    ratio = prepare / tiktoken
    tokens_per_s = runs[0]["tokens"] / statistics.median(r["prepare_seconds"] for r in runs)
    log(
        f"medians of {rounds} round(s): tiktoken {tiktoken:.2f} MB/s, download_dataset.py {prepare:.2f} MB/s "
        f"({tokens_per_s / 1e6:.2f}M tokens/s); ratio {ratio:.2f} (target >= {TARGET_RATIO})"
    )
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "corpus": str(corpus),
        "corpus_mb": size_mb,
        "rounds": rounds,
        "script": str(script),
        "tiktoken_mb_per_s": tiktoken,
        "prepare_mb_per_s": prepare,
        "prepare_tokens_per_s": tokens_per_s,
        "ratio": ratio,
        "meets_target": ratio >= TARGET_RATIO,
        "runs": runs,
    }
