"""Matplotlib set up for files only, and the one way a chart is written to disk.

from jaxgpt.tracking.figures import SIZE, legend, plt, save
fig, ax = plt.subplots(figsize=SIZE)
legend(ax)                                     # inside the axes
save(fig, Path("runs/demo/charts/loss.png"))   # atomic; .png, .svg or .pdf by the suffix
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

# Select the file-only backend before pyplot is imported, so charts work on headless machines.
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

SIZE = (8, 4.5)  # inches; at DPI a 800 x 450 PNG, readable in a browser tab or an image viewer
DPI = 100
FORMATS = ("png", "svg", "pdf")
# Inside the axes, where the curves leave room: a figure-level legend lands on the tick labels.
LEGEND = {"loc": "best", "framealpha": 0.85, "fontsize": "small"}


def legend(ax: plt.Axes) -> None:
    """The axes' legend (LEGEND), when anything drawn has a label (a run without that series has none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**LEGEND)


def plain_log_y(ax: plt.Axes) -> None:
    """A log y axis labelled in plain numbers (2.5, not 2.5 x 10^0): 1-2-5 ticks over a decade or
    more, evenly spaced round numbers inside one (a loss between 2.1 and 2.9 gets labels at all)."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    wide = low > 0 and high / low >= 10
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)) if wide else MaxNLocator(nbins=6))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def save(fig: plt.Figure, path: Path) -> None:
    """Write the figure to path atomically, so a viewer or a killed process never sees a half-written
    file; the format is the suffix's (FORMATS)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        plt.close(fig)
        raise ValueError(f"{path}: a chart is written as {', '.join('.' + f for f in FORMATS)}, not {path.suffix!r}")
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.stem}-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format=fmt, dpi=DPI)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
