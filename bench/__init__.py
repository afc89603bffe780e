"""The benchmarks: `uv run -m bench --help` (bench/cli.py).

What each measures: docs/performance.md "Performance"; the figures: docs/log.md "Measurement log".
"""
