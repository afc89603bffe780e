"""Draw a run's training charts into <run>/charts, or compare runs on one chart.

Usage:
    uv run charts.py runs/<name> [runs/<other> ...] [--log-y]
    uv run charts.py runs/a runs/b [...] --compare out.png [--log-x] [--log-y] [--target 1.71]

The first form writes loss.png, lr.png, grad_norm.png, throughput.png and (when the run scores
HellaSwag) hellaswag.png for each run (jaxgpt/tracking/charts.py); the second draws validation
loss against tokens seen for each run (jaxgpt/tracking/compare.py). Both read the run's records
(docs/watching.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxgpt.tracking.charts import draw_charts
from jaxgpt.tracking.compare import draw_compare
from jaxgpt.tracking.figures import FORMATS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw a run's loss, learning-rate, gradient-norm and throughput charts into <run>/charts, "
        "or, with --compare, the validation loss of several runs against tokens seen on one chart."
    )
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir", help="run folder, e.g. runs/<name>")
    parser.add_argument("--log-y", action="store_true", help="use a logarithmic loss axis")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="OUT",
        help=f"draw the runs on one chart into OUT ({', '.join('.' + f for f in FORMATS)})",
    )
    parser.add_argument("--log-x", action="store_true", help="with --compare: a logarithmic tokens axis")
    parser.add_argument(
        "--target",
        type=float,
        metavar="LOSS",
        help="with --compare: draw this validation loss as a line and say when each run reached it",
    )
    args = parser.parse_args(argv)
    if args.compare is None and (args.log_x or args.target is not None):
        parser.error("--log-x and --target apply to --compare OUT")
    try:
        if args.compare is not None:
            paths = [draw_compare(args.run_dirs, args.compare, log_x=args.log_x, log_y=args.log_y, target=args.target)]
        else:
            paths = [p for run_dir in args.run_dirs for p in draw_charts(run_dir, log_y=args.log_y)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
