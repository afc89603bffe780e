"""Token datasets on disk: the shard format, writing a dataset atomically, reading it memory-mapped.

A dataset is a folder holding manifest.json and <split>-<NNNNN>.safetensors shards (split is
"train" or "val"); each shard has one 1-D tensor "tokens" (uint16 when the vocabulary fits,
else uint32). Shards are memory-mapped, never read whole into RAM, so a dataset may be far
larger than memory.

    ds = open_dataset(Path("data/builtin-bytes"))   # ds.train, ds.val: TokenSplit (batches.py samples them)

Pure numpy: nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxgpt.data.errors import DataError
from jaxgpt.data.tokenizer import Tokenizer
from jaxgpt.files import fsync, sha256, write_tensors

FORMAT_VERSION = 1
SPLITS = ("train", "val")
MANIFEST = "manifest.json"
# safetensors' dtype names for the two token dtypes we write.
_ST_DTYPES = {"uint16": "U16", "uint32": "U32", "uint8": "U8", "int64": "I64"}
_TOKEN_DTYPES = ("uint16", "uint32")
KIND_CONVERSATIONS = "conversations"  # manifest "kind" of a conversation dataset (chat_prepare.py); absent: text
LOSS_MASK, STARTS = "loss_mask", "conversation_starts"  # its shards' two other tensors
_MAX_HEADER = 1 << 20  # our headers are ~100 bytes; a huge value means a corrupt file


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds ids 0..vocab_size-1 (uint16 for both of our tokenizers)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ----------------------------------------------------------------------------- writing


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _remove_stale(dataset_dir: Path) -> None:
    """Delete `<dir>.tmp-<pid>` / `<dir>.old-<pid>` folders left by writers that were killed (SIGKILL, power cut)."""
    for sibling in dataset_dir.parent.glob(f"{dataset_dir.name}.*-*"):
        kind, _, pid = sibling.name[len(dataset_dir.name) + 1 :].partition("-")
        if kind in ("tmp", "old") and pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(sibling, ignore_errors=True)


@contextlib.contextmanager
def dataset_lock(dataset_dir: Path, log: Callable[[str], None] = print) -> Iterator[None]:
    """Hold an exclusive lock on a dataset folder while checking or (re)building it.

    Two runs started together on a missing dataset would otherwise both build it and race on the
    final rename; with the lock the second one waits and then reuses the first one's work.
    """
    dataset_dir = Path(dataset_dir)
    dataset_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(dataset_dir.parent / f".{dataset_dir.name}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process preparing {dataset_dir} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases the lock, also when the process dies


class DatasetWriter:
    """Builds a dataset folder atomically: use as a context manager, add shards, then commit().

    Shards go into a sibling `<dir>.tmp-<pid>`; commit() writes manifest.json last and renames the
    folder into place (an existing folder is moved aside and removed only afterwards), so a
    killed write never looks like a dataset. Leaving the block without commit() removes the
    temporary folder.
    """

    @classmethod
    def for_tokenizer(
        cls, dataset_dir: Path, tokenizer: Tokenizer, *, source: str, options: dict, fingerprint: str
    ) -> DatasetWriter:
        """A writer whose manifest records `tokenizer` (name, vocabulary, end-of-text id, file hash)."""
        return cls(
            dataset_dir,
            source=source,
            options=options,
            fingerprint=fingerprint,
            tokenizer=tokenizer.name,
            vocab_size=tokenizer.n_vocab,
            eot_id=tokenizer.eot_id,
            tokenizer_sha256=getattr(tokenizer, "sha256", None),
        )

    def __init__(
        self,
        dataset_dir: Path,
        *,
        source: str,
        options: dict,
        fingerprint: str,
        tokenizer: str,
        vocab_size: int,
        eot_id: int,
        tokenizer_sha256: str | None = None,
    ) -> None:
        self.path = Path(dataset_dir)
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self.tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        self.manifest: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "source": source,
            "options": options,
            "fingerprint": fingerprint,
            "tokenizer": tokenizer,
            "vocab_size": int(vocab_size),
            "eot_id": int(eot_id),
            "dtype": self.dtype.name,
            "splits": {split: {"tokens": 0, "documents": 0, "shards": []} for split in SPLITS},
        }
        if tokenizer_sha256 is not None:  # a trained tokenizer: its file, so a retrained one of that name is noticed
            self.manifest["tokenizer_sha256"] = tokenizer_sha256
        self._committed = False

    def __enter__(self) -> DatasetWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(self.path)
        self.tmp.mkdir()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._committed:
            shutil.rmtree(self.tmp, ignore_errors=True)  # never leave a half-built folder behind

    def _next_name(self, split: str) -> str:
        return f"{split}-{len(self.manifest['splits'][split]['shards']):05d}.safetensors"

    def _record(self, split: str, entry: dict[str, Any], documents: int) -> dict[str, Any]:
        meta = self.manifest["splits"][split]
        meta["shards"].append(entry)
        meta["tokens"] += entry["tokens"]
        meta["documents"] += documents
        return entry

    def add_shard(
        self,
        split: str,
        tokens: np.ndarray,
        *,
        documents: int | None = None,
        where: Path | str = "",
        tensors: dict[str, np.ndarray] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Write one 1-D shard; ids outside the vocabulary are a DataError naming `where` (the data's origin).

        `documents`, when known, is recorded in the shard's entry too; `extra` keys go into the entry;
        `tensors` are written into the same file beside "tokens" (a conversation dataset's loss mask
        and conversation starts: jaxgpt/conversations/prepare.py).
        """
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.size == 0:
            raise DataError(f"{where or self.path}: empty {split} shard")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.vocab_size:  # checked before the cast, which would silently wrap
            raise DataError(f"{where or self.path}: token id {lo if lo < 0 else hi} outside 0..{self.vocab_size - 1}")
        name = self._next_name(split)
        path = self.tmp / name
        write_tensors({"tokens": tokens.astype(self.dtype, copy=False), **(tensors or {})}, path)
        os.chmod(path, 0o644)  # safetensors creates files owner-only; datasets are meant to be shared read-only
        fsync(path)
        entry = {"file": name, "tokens": int(tokens.size), "max_token_id": hi, "sha256": sha256(path), **extra}
        if documents is not None:
            entry["documents"] = documents
        return self._record(split, entry, documents or 0)

    def link_shard(self, split: str, source: Path, entry: dict[str, Any]) -> dict[str, Any]:
        """Reuse a shard of an existing dataset (its manifest entry): a hard link, so no copy and no extra disk."""
        name = self._next_name(split)
        try:
            os.link(source, self.tmp / name)
        except OSError:  # another file system, or links not supported
            shutil.copy2(source, self.tmp / name)
        return self._record(split, {**entry, "file": name}, entry.get("documents", 0))

    def add_file(self, name: str, data: bytes) -> None:
        """Another file of the dataset (a conversation dataset's held-out conversations), its sha256
        recorded in the manifest's "files"."""
        path = self.tmp / name
        path.write_bytes(data)
        os.chmod(path, 0o644)
        fsync(path)
        self.manifest.setdefault("files", {})[name] = {"bytes": len(data), "sha256": sha256(path)}

    def commit(self) -> dict[str, Any]:
        manifest_path = self.tmp / MANIFEST
        manifest_path.write_text(json.dumps(self.manifest, indent=2) + "\n")
        fsync(manifest_path)
        fsync(self.tmp)
        old = None
        if self.path.exists():
            old = self.path.with_name(f"{self.path.name}.old-{os.getpid()}")
            os.replace(self.path, old)
        os.replace(self.tmp, self.path)
        self._committed = True
        if old is not None:
            shutil.rmtree(old)
        return self.manifest


class _SplitShards:
    """Cuts one split's documents, added one at a time, into shards of exactly shard_tokens tokens
    (the last one shorter, written by close())."""

    def __init__(self, writer: DatasetWriter, split: str, shard_tokens: int) -> None:
        self.writer, self.split, self.shard_tokens = writer, split, shard_tokens
        self.pending: list[np.ndarray] = []  # documents not yet written, at most ~one shard's worth
        self.n_pending = self.n_docs = 0

    def add(self, doc: np.ndarray) -> None:
        writer, split, shard_tokens = self.writer, self.split, self.shard_tokens
        doc = np.asarray(doc).reshape(-1)
        self.n_docs += 1
        if doc.size == 0:
            return
        if not np.issubdtype(doc.dtype, np.integer):
            raise DataError(
                f"{writer.path}: {split} document {self.n_docs - 1} has dtype {doc.dtype}, expected integers"
            )
        lo, hi = int(doc.min()), int(doc.max())
        if lo < 0 or hi >= writer.vocab_size:  # checked before the cast, which would silently wrap
            raise DataError(
                f"{writer.path}: {split} document {self.n_docs - 1} has token id {lo if lo < 0 else hi} "
                f"outside 0..{writer.vocab_size - 1}"
            )
        self.pending.append(doc.astype(writer.dtype, copy=False))
        self.n_pending += doc.size
        if self.n_pending >= shard_tokens:
            # Concatenate once and cut every full shard from it: a long document may fill several.
            flat = np.concatenate(self.pending)
            n_full = flat.size // shard_tokens
            for i in range(n_full):
                writer.add_shard(split, flat[i * shard_tokens : (i + 1) * shard_tokens])
            rest = flat[n_full * shard_tokens :]
            self.pending, self.n_pending = ([rest] if rest.size else []), int(rest.size)

    def close(self) -> None:
        if self.n_pending:
            self.writer.add_shard(self.split, np.concatenate(self.pending))
        self.writer.manifest["splits"][self.split]["documents"] = self.n_docs


def write_dataset(
    dataset_dir: Path,
    *,
    source: str,
    options: dict,
    fingerprint: str,
    tokenizer: Tokenizer,
    splits: Mapping[str, Iterable[np.ndarray]] | Iterable[tuple[str, np.ndarray]],
    shard_tokens: int = 2**27,
) -> dict:
    """Write a dataset atomically (see DatasetWriter) and return its manifest.

    `splits` maps "train" and "val" to iterables of 1-D token arrays, one per document, each ending
    with its end-of-text token, concatenated in order and cut into shards of `shard_tokens` tokens
    (2**27 by default). Or it is one stream of (split, array) pairs, the splits interleaved in any
    way: each split's shards are the same as from the mapping.
    """
    dataset_dir = Path(dataset_dir)
    if isinstance(splits, Mapping) and sorted(splits) != sorted(SPLITS):
        raise DataError(f"{dataset_dir}: splits must be exactly {list(SPLITS)}, got {sorted(splits)}")
    if shard_tokens < 1:
        raise DataError(f"{dataset_dir}: shard_tokens must be >= 1, got {shard_tokens}")
    with DatasetWriter.for_tokenizer(
        dataset_dir, tokenizer, source=source, options=options, fingerprint=fingerprint
    ) as writer:
        shards = {split: _SplitShards(writer, split, shard_tokens) for split in SPLITS}
        if isinstance(splits, Mapping):
            for split in SPLITS:
                for doc in splits[split]:
                    shards[split].add(doc)
                shards[split].close()  # one split's pending tokens in memory at a time
        else:
            for split, doc in splits:  # each split holds up to a shard's worth pending
                if split not in shards:
                    raise DataError(f"{dataset_dir}: unknown split {split!r} (expected one of {list(SPLITS)})")
                shards[split].add(doc)
            for split in SPLITS:
                shards[split].close()
        return writer.commit()


# ----------------------------------------------------------------------------- reading


def read_manifest(dataset_dir: Path) -> dict:
    """The parsed manifest.json of a dataset folder; DataError if missing or not valid JSON."""
    path = Path(dataset_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: missing (no complete dataset here; run download_dataset.py to prepare it)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: malformed JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    return manifest


def _field(manifest: dict, key: str, kind: type | tuple[type, ...], where: Path) -> Any:
    value = manifest.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):  # JSON true is not a count
        raise DataError(f"{where}: field {key!r} is missing or has the wrong type (got {value!r})")
    return value


def _read_header(path: Path) -> tuple[int, dict[str, Any], int]:
    """(header length, parsed header, file size) of a safetensors file, after cheap checks."""
    if not path.is_file():
        raise DataError(f"{path}: shard listed in {MANIFEST} is missing")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DataError(f"{path}: truncated shard ({size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > _MAX_HEADER or 8 + header_len > size:
            raise DataError(f"{path}: truncated or corrupt shard (header length {header_len}, file size {size})")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as exc:
            raise DataError(f"{path}: corrupt safetensors header ({exc!r})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: corrupt safetensors header (not an object)")
    return header_len, header, size


def _map_tensor(path: Path, header_len: int, header: dict[str, Any], name: str, dtype: np.dtype, n: int) -> np.memmap:
    """Memory-map the 1-D tensor `name` of n values of `dtype` (DataError if the header says otherwise)."""
    try:
        info = header[name]
        begin, end = (int(x) for x in info["data_offsets"])
        shape = [int(x) for x in info["shape"]]
        st_dtype = info["dtype"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: corrupt safetensors header or no tensor {name!r} ({exc!r})") from None
    if st_dtype != _ST_DTYPES[dtype.name] or shape != [n] or end - begin != n * dtype.itemsize:
        raise DataError(f"{path}: tensor {name!r} is {st_dtype}{shape}, manifest says {dtype.name}[{n}]")
    # Zero-copy: pages are read on demand and shared with the OS page cache.
    return np.memmap(path, dtype=dtype, mode="r", offset=8 + header_len + begin, shape=(n,))


def _open_shard(
    path: Path, entry: dict, dtype: np.dtype, verify: bool, extra: dict[str, tuple[np.dtype, int]] | None = None
) -> tuple[np.memmap, dict[str, np.memmap]]:
    """Memory-map the "tokens" tensor of one shard after cheap consistency checks (and the `extra`
    tensors: name -> (dtype, length))."""
    header_len, header, size = _read_header(path)
    n = int(entry["tokens"])
    try:
        end = max(int(info["data_offsets"][1]) for key, info in header.items() if key != "__metadata__")
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: corrupt safetensors header ({exc!r})") from None
    if size != 8 + header_len + end:  # before any mapping: a short file cannot back the tensors
        raise DataError(f"{path}: truncated shard ({size} bytes, expected {8 + header_len + end})")
    tokens = _map_tensor(path, header_len, header, "tokens", dtype, n)
    others = {
        name: _map_tensor(path, header_len, header, name, dt, count) for name, (dt, count) in (extra or {}).items()
    }
    if verify and sha256(path) != entry["sha256"]:
        raise DataError(f"{path}: sha256 mismatch (file changed or corrupt; delete the folder and prepare it again)")
    return tokens, others


@dataclass
class TokenSplit:
    """One split's tokens, as a virtual concatenation of its memory-mapped shards."""

    name: str
    shards: list[np.memmap]
    files: list[Path] = field(default_factory=list)  # one per shard, for error messages
    max_token_id: int | None = None  # the manifest's bound; batches above it mean a changed shard
    # A conversation dataset's (chat_prepare.py): each token's 0/1 loss mask, one array per shard,
    # and where each conversation starts (global positions, increasing, the first 0).
    masks: list[np.memmap] | None = None
    conversation_starts: np.ndarray | None = None
    n_tokens: int = field(init=False)
    _ends: np.ndarray = field(init=False, repr=False)  # cumulative end offset of each shard

    def __post_init__(self) -> None:
        self._ends = np.cumsum([s.size for s in self.shards], dtype=np.int64)
        self.n_tokens = int(self._ends[-1]) if self.shards else 0

    def locate(self, position: int) -> tuple[str, int]:
        """(shard file, offset in it) of a global token position: what error messages name."""
        k = int(np.searchsorted(self._ends, position, side="right"))
        start = int(self._ends[k - 1]) if k else 0
        return (str(self.files[k]) if k < len(self.files) else f"{self.name} shard {k}"), position - start

    def read(self, start: int, length: int) -> np.ndarray:
        """int32 copy of tokens[start:start+length]; the range may cross shard boundaries."""
        out = np.empty(length, dtype=np.int32)
        self.read_into(start, out)
        return out

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fill the 1-D `out` with tokens[start:start+len(out)] (cast on assignment, no temporary)."""
        self._read(self.shards, start, out)

    def read_mask_into(self, start: int, out: np.ndarray) -> None:
        """Fill `out` with the loss mask of tokens[start:start+len(out)] (a conversation dataset)."""
        assert self.masks is not None, f"{self.name} split holds no loss mask"
        self._read(self.masks, start, out)

    def _read(self, arrays: list[np.memmap], start: int, out: np.ndarray) -> None:
        length = out.shape[0]
        if start < 0 or length < 0 or start + length > self.n_tokens:
            raise DataError(f"{self.name} split: cannot read [{start}, {start + length}) of {self.n_tokens} tokens")
        k = int(np.searchsorted(self._ends, start, side="right"))  # shard holding `start`
        done = 0
        while done < length:
            shard_start = int(self._ends[k - 1]) if k else 0
            lo = start + done - shard_start
            take = min(length - done, arrays[k].size - lo)
            out[done : done + take] = arrays[k][lo : lo + take]
            done += take
            k += 1


def _checked_starts(path: Path, starts: np.ndarray, n_tokens: int) -> np.ndarray:
    """A shard's conversation starts as int64, checked: 0 first, increasing, inside the shard."""
    starts = np.asarray(starts, np.int64)
    if not starts.size or starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= n_tokens:
        raise DataError(
            f"{path}: tensor {STARTS!r} is not increasing from 0 within the shard's {n_tokens} tokens "
            f"(corrupt; prepare the dataset again)"
        )
    return starts


@dataclass
class Dataset:
    manifest: dict
    path: Path
    train: TokenSplit
    val: TokenSplit
    tokenizer: str
    vocab_size: int
    eot_id: int
    max_token_id: int  # over all shards: a model needs vocab_size > max_token_id


def open_dataset(dataset_dir: Path, *, verify: bool = False) -> Dataset:
    """Open a prepared dataset; DataError naming the file if anything is missing or inconsistent.

    The default checks are cheap (manifest fields, each shard's header and exact size), which
    catches truncated or half-copied shards; verify=True also checks every shard's sha256.
    """
    dataset_dir = Path(dataset_dir)
    manifest = read_manifest(dataset_dir)
    where = dataset_dir / MANIFEST
    if manifest.get("format") != FORMAT_VERSION:
        raise DataError(f"{where}: format {manifest.get('format')!r} is not {FORMAT_VERSION}; prepare it again")
    vocab_size = _field(manifest, "vocab_size", int, where)
    eot_id = _field(manifest, "eot_id", int, where)
    tokenizer = _field(manifest, "tokenizer", str, where)
    dtype_name = _field(manifest, "dtype", str, where)
    if dtype_name not in _TOKEN_DTYPES:
        raise DataError(f"{where}: dtype {dtype_name!r} is not one of {list(_TOKEN_DTYPES)}")
    dtype = np.dtype(dtype_name)
    splits_meta = _field(manifest, "splits", dict, where)
    chat = manifest.get("kind") == KIND_CONVERSATIONS
    splits: dict[str, TokenSplit] = {}
    max_token_id = -1
    for split in SPLITS:
        splits[split], split_max = _open_split(dataset_dir, split, splits_meta.get(split), dtype, chat, verify)
        max_token_id = max(max_token_id, split_max)
    if max_token_id >= vocab_size:
        raise DataError(f"{where}: max_token_id {max_token_id} >= vocab_size {vocab_size}")
    return Dataset(
        manifest=manifest,
        path=dataset_dir,
        train=splits["train"],
        val=splits["val"],
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        eot_id=eot_id,
        max_token_id=max_token_id,
    )


def _check_entry(entry: object, split: str, chat: bool, where: Path) -> dict[str, Any]:
    """A manifest's shard entry, checked before its file is opened: typed fields, a bare file name."""
    if not isinstance(entry, dict) or not {"file", "tokens", "max_token_id", "sha256"} <= entry.keys():
        raise DataError(f"{where}: malformed shard entry in split {split!r}: {entry!r}")
    if not isinstance(entry["tokens"], int) or not isinstance(entry["max_token_id"], int):
        raise DataError(f"{where}: shard {entry['file']!r} has non-integer 'tokens' or 'max_token_id'")
    if chat and not isinstance(entry.get("conversations"), int):
        raise DataError(f"{where}: shard {entry['file']!r} has no integer 'conversations'")
    # Shards live in the dataset folder itself: a manifest must not point elsewhere.
    if not isinstance(entry["file"], str) or Path(entry["file"]).name != entry["file"]:
        raise DataError(f"{where}: shard file name {entry['file']!r} must not contain a path")
    return entry


def _open_split(
    dataset_dir: Path, split: str, meta: object, dtype: np.dtype, chat: bool, verify: bool
) -> tuple[TokenSplit, int]:
    """One split's shards mapped and checked against its manifest entry; (the split, its largest token id)."""
    where = dataset_dir / MANIFEST
    if not isinstance(meta, dict) or not isinstance(meta.get("shards"), list):
        raise DataError(f"{where}: split {split!r} is missing or has no 'shards' list")
    maps, masks, starts, files, split_max = [], [], [], [], -1
    for entry in meta["shards"]:
        entry = _check_entry(entry, split, chat, where)
        files.append(dataset_dir / entry["file"])
        extra = (
            {LOSS_MASK: (np.dtype(np.uint8), entry["tokens"]), STARTS: (np.dtype(np.int64), entry["conversations"])}
            if chat
            else None
        )
        tokens, others = _open_shard(files[-1], entry, dtype, verify, extra)
        maps.append(tokens)
        if chat:
            masks.append(others[LOSS_MASK])
            # the shard's starts as positions in the whole split: after the tokens of the shards before it
            starts.append(_checked_starts(files[-1], others[STARTS], entry["tokens"]) + sum(m.size for m in maps[:-1]))
        split_max = max(split_max, int(entry["max_token_id"]))
    token_split = TokenSplit(
        split,
        maps,
        files,
        split_max,
        masks=masks if chat else None,
        conversation_starts=np.concatenate(starts) if chat and starts else None,
    )
    if token_split.n_tokens != meta.get("tokens"):
        raise DataError(
            f"{where}: split {split!r} says {meta.get('tokens')} tokens, shards hold {token_split.n_tokens}"
        )
    return token_split, split_max
