"""FineWeb-10B, pre-tokenized with GPT-2, as published for llm.c / modded-nanogpt: fetch and convert.

kjj0/fineweb10B-gpt2 holds fineweb_val_000000.bin and fineweb_train_000001.bin .. 000103.bin,
100M tokens each, in llm.c's format:

    256 little-endian int32 header: [20240520 (magic), 1 (version), n_tokens, 0, ...]
    n_tokens little-endian uint16 GPT-2 token ids (each document starts with <|endoftext|>)

prepare() takes as many train files as the run's length needs, from --from <folder> or the
downloads folder, else fetched with huggingface_hub, and converts each into one safetensors shard;
an earlier preparation's shards are reused by hard link. No tiktoken needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.storage.shards import DatasetWriter, open_dataset
from jaxgpt.data.tokenizer import GPT2_EOT_ID, GPT2_N_VOCAB

SOURCE = "fineweb10B-gpt2"
REPO_ID = "kjj0/fineweb10B-gpt2"
VAL_FILE = "fineweb_val_000000.bin"
N_TRAIN_FILES = 103
MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4


def train_file(index: int) -> str:
    """Name of train file `index` (1-based, as published)."""
    return f"fineweb_train_{index:06d}.bin"


# ----------------------------------------------------------------------------- the .bin format


def write_bin(path: Path, tokens: np.ndarray) -> None:
    """Write tokens in llm.c's .bin format (what the published files hold; used by tests and converters)."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_bin(path: Path) -> np.memmap:
    """The uint16 tokens of an llm.c .bin file, memory-mapped; DataError naming the file if it is not one."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(f"{path}: truncated .bin file ({size} bytes, shorter than its {HEADER_BYTES}-byte header)")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise DataError(f"{path}: not an llm.c token file (magic {header[0]}, expected {MAGIC})")
    if header[1] != VERSION:
        raise DataError(f"{path}: .bin version {header[1]} is not supported (expected {VERSION}: uint16 tokens)")
    n = int(header[2])
    if size != HEADER_BYTES + 2 * n:
        raise DataError(
            f"{path}: truncated or padded .bin file ({size:,} bytes; its header says {n:,} tokens, "
            f"{HEADER_BYTES + 2 * n:,} bytes)"
        )
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n,))


# ----------------------------------------------------------------------------- fetching


def hub_download(name: str, downloads: Path, *, repo_id: str = REPO_ID, kind: str = ".bin") -> Path:
    """File `name` of the Hugging Face dataset repo `repo_id`, fetched into `downloads`; a one-line
    DataError saying where to put it by hand (or which --from folder of `kind` files to pass) if it cannot."""
    from huggingface_hub import hf_hub_download  # imported here: only this path needs it
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    # Read at call time (huggingface_hub reads it once, at import).
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    try:
        return Path(hf_hub_download(repo_id, name, repo_type="dataset", local_dir=downloads, local_files_only=offline))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        first_line = str(exc).splitlines()[0][:100] if str(exc) else ""
        why = "offline: HF_HUB_OFFLINE is set" if offline else f"{type(exc).__name__}: {first_line}"
        raise DataError(
            f"cannot fetch {name} from https://huggingface.co/datasets/{repo_id} ({why}); download it "
            f"where there is network access and put it in {downloads}, or pass --from <folder with the "
            f"{kind} files> to download_dataset.py"
        ) from None


def locate(name: str, *, from_dir: Path | None, downloads: Path, log: Callable[[str], None]) -> Path:
    """A valid local copy of `name`: in from_dir, else in downloads, else fetched into downloads."""
    if from_dir is not None and (Path(from_dir) / name).is_file():
        read_bin(Path(from_dir) / name)  # a bad file the user pointed at is an error, not something to replace
        return Path(from_dir) / name
    local = downloads / name
    if local.is_file():
        try:
            read_bin(local)
            return local  # the published files never change: a complete local copy is up to date
        except DataError as exc:
            log(f"{exc}; fetching it again")
            local.unlink()
    log(f"fetching {name} from {REPO_ID} into {downloads}")
    path = hub_download(name, downloads)
    read_bin(path)
    return path


# ----------------------------------------------------------------------------- converting


def _previous_manifest(path: Path) -> dict | None:
    """The manifest of an earlier, intact FineWeb preparation at `path` (its shards can be reused), else None."""
    try:
        manifest = open_dataset(path).manifest  # the cheap checks: every shard present, right size
    except DataError:
        return None
    return manifest if manifest.get("source") == SOURCE else None


def _by_source_file(manifest: dict | None, path: Path) -> dict[str, tuple[Path, dict]]:
    if manifest is None:
        return {}
    return {
        entry["source_file"]: (path / entry["file"], entry)
        for meta in manifest["splits"].values()
        for entry in meta["shards"]
        if "source_file" in entry
    }


def _source_files(manifest: dict) -> dict[str, list[str]]:
    return {split: [entry.get("source_file") for entry in meta["shards"]] for split, meta in manifest["splits"].items()}


def _choose_train_files(
    train_shards: int | None,
    train_tokens: int | None,
    previous: dict,
    *,
    from_dir: Path | None,
    downloads: Path,
    log: Callable[[str], None],
) -> dict[str, Path | None]:
    """The first train files that hold train_tokens (or exactly train_shards); a Path when fetched now."""
    chosen: dict[str, Path | None] = {}
    total = 0
    for index in range(1, N_TRAIN_FILES + 1):
        if (len(chosen) >= train_shards) if train_shards is not None else total >= (train_tokens or 1):
            break
        name = train_file(index)
        if name in previous:
            chosen[name], n = None, previous[name][1]["tokens"]
        else:
            chosen[name] = locate(name, from_dir=from_dir, downloads=downloads, log=log)
            n = int(read_bin(chosen[name]).size)
        total += n
    if train_shards is None and train_tokens and total < train_tokens:
        log(
            f"note: the run needs {train_tokens:,} tokens, all {N_TRAIN_FILES} train files hold {total:,}; "
            "it will see the data more than once"
        )
    return chosen


def prepare(
    path: Path,
    options: dict,
    *,
    train_tokens: int | None,
    from_dir: Path | None,
    downloads: Path,
    log: Callable[[str], None] = print,
) -> Path:
    """Make `path` hold the val file and the first train files the run needs; reuse what is already there."""
    old = _previous_manifest(path)
    previous = _by_source_file(old, path)
    chosen = _choose_train_files(
        options["train_shards"], train_tokens, previous, from_dir=from_dir, downloads=downloads, log=log
    )
    names = {"train": list(chosen), "val": [VAL_FILE]}
    if old is not None and _source_files(old) == names and old.get("options") == options:
        log(f"reusing dataset {path} ({len(chosen)} train file(s), manifest matches)")
        return path
    if VAL_FILE not in previous:  # fetch everything before converting anything
        chosen[VAL_FILE] = locate(VAL_FILE, from_dir=from_dir, downloads=downloads, log=log)
    fingerprint = f"hf:{REPO_ID} train_files={len(names['train'])}"
    log(
        f"preparing dataset {path}: {len(names['train'])} train file(s) + {VAL_FILE}"
        + (
            f" (reusing {sum(n in previous for files in names.values() for n in files)} converted shard(s))"
            if previous
            else ""
        )
    )
    with DatasetWriter(
        path,
        source=SOURCE,
        options=options,
        fingerprint=fingerprint,
        tokenizer="gpt2",
        vocab_size=GPT2_N_VOCAB,
        eot_id=GPT2_EOT_ID,
    ) as writer:
        for split, files in names.items():
            for name in files:
                _add(writer, split, name, previous, chosen.get(name))
        manifest = writer.commit()
    log(
        f"wrote {path}: "
        + ", ".join(
            f"{split} {meta['tokens']:,} tokens / {len(meta['shards'])} shard(s)"
            for split, meta in manifest["splits"].items()
        )
    )
    return path


def _add(writer: DatasetWriter, split: str, name: str, previous: dict, local: Path | None) -> None:
    """Add file `name` to the dataset: its earlier shard by hard link, else converted from the local .bin."""
    if name in previous:
        shard, entry = previous[name]
        writer.link_shard(split, shard, entry)
        return
    assert local is not None, name
    tokens = read_bin(local)
    documents = int(np.count_nonzero(tokens == GPT2_EOT_ID))  # each document starts with one
    writer.add_shard(split, tokens, documents=documents, where=local, source_file=name)
