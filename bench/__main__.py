"""`uv run -m bench <benchmark> ...` (or `python3 -m bench` where there is no uv): bench/cli.py."""

import fast_malloc
from bench.cli import main

if __name__ == "__main__":
    fast_malloc.reexec()  # restarts once with huge-page malloc where that helps (fast_malloc.py)
    raise SystemExit(main())
