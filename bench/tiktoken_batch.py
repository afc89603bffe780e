"""The reference side of `uv run -m bench tokenize`: tiktoken's own encode_ordinary_batch, timed.

    python bench/tiktoken_batch.py corpus.jsonl [--threads N]   # prints one JSON object

Reads every document of a JSONL file (its "text" field; empty ones skipped, as download_dataset.py
reads them) into memory first, then times only `encode_ordinary_batch(docs, num_threads=N)` with
the gpt2 encoding, N = every core by default: what tiktoken itself does over the same documents
with nothing written. Imports nothing of the project (a fresh process of tiktoken alone).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", help='a JSONL file of {"text": ...} records')
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="default: os.cpu_count()")
    args = parser.parse_args()
    import tiktoken

    with open(args.corpus, "rb") as f:
        docs = [text for line in f if line.strip() and (text := json.loads(line)["text"])]
    enc = tiktoken.get_encoding("gpt2")
    cpu0, t0 = time.process_time(), time.perf_counter()
    ids = enc.encode_ordinary_batch(docs, num_threads=args.threads)
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_s": cpu_s,
                "documents": len(docs),
                "tokens": sum(map(len, ids)),
                "threads": args.threads,
                "tiktoken": tiktoken.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
