"""Files that must survive a crash: fsync after a rename, content hashes (datasets, checkpoints, downloads), and
safetensors files written in the order every reader assumes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


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


def write_tensors(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of `tensors`, each in row-major (C) order.

    safetensors writes an array's memory as it lies and records only its shape, so a column-major
    array (the host copy of a device array laid out so, a transposed view) would be read back scrambled.
    Every safetensors file this project writes goes through here."""
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata)
