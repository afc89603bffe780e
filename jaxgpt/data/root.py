"""The data root: where datasets, downloads and trained tokenizers live unless a command is told otherwise.

Its own module because both prepare.py (datasets) and tokenizer.py (trained tokenizers, which
prepare.py imports) need it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def default_data_root() -> Path:
    """$JAXGPT_DATA_DIR if set, else the repository's git-ignored data/ folder."""
    env = os.environ.get("JAXGPT_DATA_DIR")
    return Path(env) if env else REPOSITORY / "data"
