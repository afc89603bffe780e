"""The benchmarks: `uv run -m bench --help` (bench/cli.py). Figures go to docs/performance.md "Performance"."""
