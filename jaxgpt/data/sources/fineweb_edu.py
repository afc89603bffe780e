"""FineWeb-Edu as text (nanochat's parquet shards), tokenized here with any tokenizer, resumably.

karpathy/fineweb-edu-100b-shuffle holds shard_00000.parquet .. shard_01822.parquet (a string
column "text"); as in nanochat, the last is the validation split and train shards are taken in
order from shard_00000, until their tokens reach `train_tokens` or exactly `train_shards` of them.
Each file is read from --from <folder> in place, else from <data>/downloads/fineweb-edu/, else
fetched there with huggingface_hub.

prepare() tokenizes one shard at a time into a staged shard (<dataset>.staging/shard_NNNNN/,
written atomically), then hard-links the staged shards into the dataset. A killed preparation
resumes from its finished staged shards, and the dataset is byte-identical whether or not it was
interrupted: docs/fineweb-edu.md "Tokenizing shard by shard, resuming after a kill".

tokenizer_files/capped_documents give the text a tokenizer is trained on (bpe.py): the first train
files' documents, each cut to a number of characters, up to a total; no file past those is opened.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from jaxgpt.data.encode import encode_documents
from jaxgpt.data.errors import DataError
from jaxgpt.data.sources.fineweb import hub_download
from jaxgpt.data.sources.parquet import open_parquet, parquet_documents
from jaxgpt.data.storage.shards import Dataset, DatasetWriter, open_dataset, write_dataset
from jaxgpt.data.tokenizer import Tokenizer

SOURCE = "fineweb-edu"
REPO_ID = "karpathy/fineweb-edu-100b-shuffle"
N_FILES = 1823  # shard_00000 .. shard_01822 (nanochat's MAX_SHARD = 1822)
N_TRAIN_FILES = N_FILES - 1
TEXT_COLUMN = "text"
_STAGED_SOURCE = f"{SOURCE}-staged"  # the source field of a staged shard's own manifest


def shard_file(index: int) -> str:
    """Name of parquet shard `index` (0-based, as published)."""
    return f"shard_{index:05d}.parquet"


VAL_FILE = shard_file(N_FILES - 1)


def staging_dir(dataset_dir: Path) -> Path:
    """Where the tokenized parquet shards of a dataset folder are kept (beside it, same file system)."""
    return dataset_dir.with_name(f"{dataset_dir.name}.staging")


# ----------------------------------------------------------------------------- fetching


def locate(name: str, *, from_dir: Path | None, downloads: Path, log: Callable[[str], None]) -> Path:
    """A readable local copy of `name`: in from_dir, else in downloads, else fetched into downloads."""
    if from_dir is not None and (Path(from_dir) / name).is_file():
        path = Path(from_dir) / name
        open_parquet(path, TEXT_COLUMN)  # a bad file the user pointed at is an error, not something to replace
        return path
    local = downloads / name
    if local.is_file():
        try:
            open_parquet(local, TEXT_COLUMN)
            return local  # the published files never change: a readable local copy is up to date
        except DataError as exc:
            log(f"{exc}; fetching it again")
            local.unlink()
    log(f"fetching {name} from {REPO_ID} into {downloads}")
    downloads.mkdir(parents=True, exist_ok=True)
    path = hub_download(name, downloads, repo_id=REPO_ID, kind=".parquet")
    open_parquet(path, TEXT_COLUMN)
    return path


def _check_from(from_dir: Path | None) -> None:
    if from_dir is not None and not Path(from_dir).is_dir():
        raise DataError(f"{from_dir}: --from folder not found (it should hold shard_NNNNN.parquet files)")


# ----------------------------------------------------------------------------- staged shards


def _fingerprint(name: str) -> str:
    return f"hf:{REPO_ID}/{name}"


def _remove_unfinished(staging: Path, log: Callable[[str], None]) -> None:
    """Delete the temporary folders of staged shards whose writer was killed. Called under the
    dataset's lock, which every writer of this staging folder holds: none of them is still in use."""
    for leftover in sorted(staging.glob("*.tmp-*")) + sorted(staging.glob("*.old-*")):
        log(f"removing {leftover} (left unfinished by an interrupted preparation)")
        shutil.rmtree(leftover)


def _staged(folder: Path, name: str, tok: Tokenizer, log: Callable[[str], None]) -> Dataset | None:
    """The finished staged shard of parquet file `name` for this tokenizer, or None (then it is made anew)."""
    if not folder.exists():
        return None
    try:
        staged = open_dataset(folder)  # cheap checks: manifest, every shard's header and exact size
    except DataError as exc:
        log(f"{exc}; tokenizing {name} again")
        return None
    m = staged.manifest
    if (m.get("fingerprint"), staged.tokenizer, staged.vocab_size, staged.eot_id, m.get("tokenizer_sha256")) != (
        _fingerprint(name),
        tok.name,
        tok.n_vocab,
        tok.eot_id,
        getattr(tok, "sha256", None),
    ):
        log(f"{folder}: made from another file or tokenizer; tokenizing {name} again")
        return None
    return staged


def _stage(
    name: str,
    staging: Path,
    tok: Tokenizer,
    *,
    from_dir: Path | None,
    downloads: Path,
    shard_tokens: int,
    log: Callable[[str], None],
) -> tuple[Dataset, bool]:
    """(the staged shard of parquet file `name`, whether it was there already): the finished one if
    there is one, else tokenized now."""
    folder = staging / Path(name).stem
    staged = _staged(folder, name, tok, log)
    if staged is not None:
        return staged, True
    local = locate(name, from_dir=from_dir, downloads=downloads, log=log)
    started = time.perf_counter()
    write_dataset(
        folder,
        source=_STAGED_SOURCE,
        options={"source_file": name},
        fingerprint=_fingerprint(name),
        tokenizer=tok,
        shard_tokens=shard_tokens,
        splits={"train": encode_documents(tok, parquet_documents(local, TEXT_COLUMN)), "val": []},
    )
    staged = open_dataset(folder)
    log(
        f"tokenized {local}: {staged.manifest['splits']['train']['documents']:,} documents, "
        f"{staged.train.n_tokens:,} tokens, {time.perf_counter() - started:.1f} s"
    )
    return staged, False


def _listing(names: list[str]) -> str:
    """A few names, the rest elided: one line however many shards a run takes."""
    return ", ".join(names if len(names) <= 6 else [*names[:3], "...", *names[-2:]])


# ----------------------------------------------------------------------------- the dataset


def _choose_train_files(
    train_shards: int | None,
    train_tokens: int | None,
    stage: Callable[[str], Dataset],
    log: Callable[[str], None],
    n_train_files: int,
) -> dict[str, Dataset]:
    """The first train files that hold train_tokens (or exactly train_shards), each staged; at most
    all n_train_files of them."""
    chosen: dict[str, Dataset] = {}
    total = 0
    for index in range(n_train_files):
        if (len(chosen) >= train_shards) if train_shards is not None else total >= (train_tokens or 1):
            break
        name = shard_file(index)
        chosen[name] = stage(name)
        total += chosen[name].train.n_tokens
    if train_shards is None and train_tokens and total < train_tokens:
        log(
            f"note: the run needs {train_tokens:,} tokens, all {n_train_files} train files hold {total:,}; "
            "it will see the data more than once"
        )
    return chosen


def _entries(staged: dict[str, Dataset]) -> list[tuple[str, Path, np.memmap, dict]]:
    """(source file, staged shard path, its tokens, its manifest entry) of every shard, in order."""
    return [
        (name, ds.train.files[k], ds.train.shards[k], entry)
        for name, ds in staged.items()
        for k, entry in enumerate(ds.manifest["splits"]["train"]["shards"])
    ]


def _matches(path: Path, options: dict, tok: Tokenizer, splits: dict[str, dict[str, Dataset]]) -> bool:
    """Whether the dataset at `path` already holds exactly these staged shards (by content hash)."""
    try:
        old = open_dataset(path).manifest  # the cheap checks: every shard present, right size
    except DataError:
        return False
    if (
        old.get("source"),
        old.get("options"),
        old.get("tokenizer"),
        old.get("vocab_size"),
        old.get("tokenizer_sha256"),
    ) != (SOURCE, options, tok.name, tok.n_vocab, getattr(tok, "sha256", None)):
        return False
    return all(
        [(e.get("source_file"), e.get("sha256")) for e in old["splits"][split]["shards"]]
        == [(name, entry["sha256"]) for name, _, _, entry in _entries(staged)]
        for split, staged in splits.items()
    )


def prepare(
    path: Path,
    options: dict,
    *,
    tokenizer: Tokenizer,
    train_tokens: int | None,
    from_dir: Path | None,
    downloads: Path,
    shard_tokens: int,
    log: Callable[[str], None] = print,
    n_train_files: int = N_TRAIN_FILES,
) -> Path:
    """Make `path` hold the validation shard and the first train shards the run needs, tokenized with
    `tokenizer`; reuse every shard already tokenized (also one finished before a kill). n_train_files:
    the train shards published (a run longer than all of them takes every one)."""
    _check_from(from_dir)
    staging = staging_dir(Path(path))
    staging.mkdir(parents=True, exist_ok=True)
    _remove_unfinished(staging, log)

    reused: list[str] = []

    def stage(name: str) -> Dataset:
        staged, was_there = _stage(
            name, staging, tokenizer, from_dir=from_dir, downloads=downloads, shard_tokens=shard_tokens, log=log
        )
        reused.extend([name] if was_there else [])
        return staged

    splits = {"val": {VAL_FILE: stage(VAL_FILE)}}  # fixed, and needed by every run: first
    if splits["val"][VAL_FILE].train.n_tokens == 0:
        raise DataError(
            f"{VAL_FILE}: its column {TEXT_COLUMN!r} holds no text (tokenized into "
            f"{splits['val'][VAL_FILE].path}); the validation split would be empty"
        )
    splits["train"] = _choose_train_files(options["train_shards"], train_tokens, stage, log, n_train_files)
    if reused:
        log(f"reused {len(reused)} tokenized shard(s) from {staging}: {_listing(reused)}")
    if _matches(path, options, tokenizer, splits):
        log(f"reusing dataset {path} ({len(splits['train'])} train file(s), manifest matches)")
        return path
    _link_dataset(path, options, tokenizer, splits, log)
    return path


def _link_dataset(
    path: Path,
    options: dict,
    tokenizer: Tokenizer,
    splits: dict[str, dict[str, Dataset]],
    log: Callable[[str], None],
) -> None:
    """Write `path` from the staged shards (hard links where it can: no second copy on disk), each with
    its document count, and log what each split holds."""
    fingerprint = f"hf:{REPO_ID} train_files={len(splits['train'])}"
    with DatasetWriter.for_tokenizer(
        path, tokenizer, source=SOURCE, options=options, fingerprint=fingerprint
    ) as writer:
        for split in ("train", "val"):
            for name, shard, tokens, entry in _entries(splits[split]):
                # Each document ends with one end-of-text id, which ordinary text never encodes to.
                documents = int(np.count_nonzero(tokens == tokenizer.eot_id))
                writer.link_shard(split, shard, {**entry, "source_file": name, "documents": documents})
        manifest = writer.commit()
    log(
        f"wrote {path}: "
        + ", ".join(
            f"{split} {meta['tokens']:,} tokens / {meta['documents']:,} documents / {len(meta['shards'])} shard(s)"
            for split, meta in manifest["splits"].items()
        )
    )


# ----------------------------------------------------------------------------- text for a tokenizer


def _capped_chars(path: Path, doc_cap: int) -> int:
    """Characters of the documents of one parquet file, each cut to doc_cap (one row group at a time)."""
    return sum(min(len(doc), doc_cap) for doc in parquet_documents(path, TEXT_COLUMN))


def tokenizer_files(
    max_chars: int, doc_cap: int, *, from_dir: Path | None, downloads: Path, log: Callable[[str], None]
) -> list[Path]:
    """The train files, from shard_00000 in order, that capped_documents reads: each located (or
    fetched) only once the ones before it hold no more than max_chars characters (documents cut to
    doc_cap), so no file is touched that the training will not read. Never the validation file."""
    _check_from(from_dir)
    paths: list[Path] = []
    total = 0
    for index in range(N_TRAIN_FILES):
        if total > max_chars:
            break
        paths.append(locate(shard_file(index), from_dir=from_dir, downloads=downloads, log=log))
        total += _capped_chars(paths[-1], doc_cap)
    return paths


def capped_documents(paths: list[Path], max_chars: int, doc_cap: int) -> Iterator[str]:
    """nanochat's scripts/tok_train.py text_iterator: the documents of `paths` in order, each cut to
    doc_cap characters, ending with the one that takes the count past max_chars."""
    chars = 0
    for path in paths:
        for doc in parquet_documents(path, TEXT_COLUMN):
            doc = doc[:doc_cap]
            chars += len(doc)
            yield doc
            if chars > max_chars:
                return
