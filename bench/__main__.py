"""`uv run -m bench <benchmark> ...` (or `python3 -m bench` where there is no uv): bench/cli.py."""

from bench.cli import main
from jaxgpt import backend

if __name__ == "__main__":
    backend.prepare_process()  # on the CPU: restarts once with huge-page malloc where that helps
    raise SystemExit(main())
