"""Files that must survive a crash: fsync after a rename, and content hashes (datasets, checkpoints, downloads)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fsync(path: Path) -> None:
    """fsync a file or a folder (a folder: its entries, i.e. the renames into it). Without it a
    power cut after a rename could leave a manifest (or a checkpoint's meta.json) pointing at
    empty files."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    """Hex sha256 of a file (shards, checkpoints, downloads)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
