"""Datasets on disk and the batch sampler: round trips, shard boundaries, determinism, coverage, errors."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from jaxgpt.data.errors import DataError
from jaxgpt.data.samplers.windows import BatchSampler
from jaxgpt.data.storage.shards import DatasetWriter, dataset_lock, open_dataset, write_dataset
from jaxgpt.data.tokenizer import BytesTokenizer

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))  # ~3.3 kB ASCII


@dataclass
class CountingTokenizer:
    """A stand-in with a vocabulary too big for uint16, so token i can simply be the integer i."""

    name: str = "counting"
    n_vocab: int = 100_000
    eot_id: int = 99_999


def with_eot(text: str, eot: int = 256) -> np.ndarray:
    return np.append(np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint16), np.uint16(eot))


def write_text(path: Path, train_docs: list[str], val_docs: list[str] | None = None, shard_tokens: int = 2**27) -> dict:
    val_docs = ["validation text.\n" * 20] if val_docs is None else val_docs
    return write_dataset(
        path,
        source="test",
        options={"n": 1},
        fingerprint="fp",
        tokenizer=BytesTokenizer(),
        splits={"train": [with_eot(d) for d in train_docs], "val": [with_eot(d) for d in val_docs]},
        shard_tokens=shard_tokens,
    )


def write_counting(path: Path, n_train: int, shard_tokens: int = 2**27) -> None:
    """Train tokens 0..n_train-1 split over documents of uneven length: tokens name their own position."""
    cuts = [0, 7, 500, 501, 1234, n_train]
    docs = [np.arange(a, b, dtype=np.int64) for a, b in zip(cuts, cuts[1:])]
    write_dataset(
        path,
        source="test",
        options={},
        fingerprint="fp",
        tokenizer=CountingTokenizer(),
        splits={"train": docs, "val": [np.arange(100)]},
        shard_tokens=shard_tokens,
    )


# ----------------------------------------------------------------------------- writing and reading


def test_manifest_and_shards(tmp_path: Path) -> None:
    manifest = write_text(tmp_path / "ds", [TEXT, "second doc"], shard_tokens=1000)
    on_disk = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert on_disk == manifest
    header = {key: manifest[key] for key in ("format", "tokenizer", "vocab_size", "eot_id", "dtype")}
    assert header == {"format": 1, "tokenizer": "bytes", "vocab_size": 257, "eot_id": 256, "dtype": "uint16"}
    train = manifest["splits"]["train"]
    n = len(TEXT) + 1 + len("second doc") + 1
    assert (train["tokens"], train["documents"]) == (n, 2)
    assert [s["tokens"] for s in train["shards"]] == [1000] * (n // 1000) + [n % 1000]
    assert [s["file"] for s in train["shards"]][:2] == ["train-00000.safetensors", "train-00001.safetensors"]
    assert all(s["max_token_id"] == 256 for s in train["shards"][-1:])  # the last shard ends with eot
    # Nothing but the dataset itself is left in the parent folder (no tmp or old folders).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_round_trip_text_to_batches_across_shards(tmp_path: Path) -> None:
    write_text(tmp_path / "ds", [TEXT], shard_tokens=97)  # windows of 64 keep crossing shard boundaries
    ds = open_dataset(tmp_path / "ds", verify=True)
    assert len(ds.train.shards) > 30 and all(isinstance(s, np.memmap) for s in ds.train.shards)  # zero-copy
    assert (ds.tokenizer, ds.vocab_size, ds.eot_id, ds.max_token_id) == ("bytes", 257, 256, 256)
    tok = BytesTokenizer()
    assert tok.decode(ds.train.read(0, ds.train.n_tokens)) == TEXT  # eot dropped
    T, B = 64, 4
    sampler = BatchSampler(ds.train, microbatch_size=B, seq_len=T, seed=0, shuffle=False)
    assert sampler.n_windows == (len(TEXT) + 1 - 1) // T
    for index in range(sampler.n_windows // B):
        x, y = sampler.microbatch(index)[:2]
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == np.int32
        for b in range(B):
            w = index * B + b
            assert tok.decode(x[b]) == TEXT[w * T : (w + 1) * T]
            assert tok.decode(y[b]) == (TEXT + "\0")[w * T + 1 : (w + 1) * T + 1].rstrip("\0")


def test_read_matches_concatenation(tmp_path: Path) -> None:
    write_counting(tmp_path / "ds", 3000, shard_tokens=128)
    split = open_dataset(tmp_path / "ds").train
    assert split.n_tokens == 3000 and len(split.shards) == 24
    rng = np.random.default_rng(0)
    cases = [(0, 0), (0, 3000), (127, 2), (128, 128), (100, 700), (2999, 1), (3000, 0)]
    cases += [(int(a), int(rng.integers(0, 3000 - a + 1))) for a in rng.integers(0, 3000, 50)]
    for start, length in cases:
        got = split.read(start, length)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.arange(start, start + length))
    for start, length in [(-1, 2), (2999, 2), (3001, 0)]:
        with pytest.raises(DataError, match="train split"):
            split.read(start, length)


def test_write_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="outside 0..256"):
        write_dataset(
            tmp_path / "ds",
            source="t",
            options={},
            fingerprint="f",
            tokenizer=BytesTokenizer(),
            splits={"train": [np.array([1, 257])], "val": [np.array([1])]},
        )
    with pytest.raises(DataError, match="outside 0..256"):
        write_dataset(
            tmp_path / "ds",
            source="t",
            options={},
            fingerprint="f",
            tokenizer=BytesTokenizer(),
            splits={"train": [np.array([-1, 5])], "val": [np.array([1])]},
        )
    with pytest.raises(DataError, match="splits must be exactly"):
        write_dataset(
            tmp_path / "ds",
            source="t",
            options={},
            fingerprint="f",
            tokenizer=BytesTokenizer(),
            splits={"train": [np.array([1])]},
        )
    assert list(tmp_path.iterdir()) == []  # failed writes leave nothing behind


def test_interleaved_splits_write_the_same_shards(tmp_path: Path) -> None:
    """write_dataset's one-stream form ((split, tokens) pairs in any interleaving) writes byte for
    byte what the mapping form writes, shard cuts and manifest included."""
    rng = np.random.default_rng(0)
    docs = [(("val" if rng.random() < 0.3 else "train"), rng.integers(0, 257, rng.integers(1, 40))) for _ in range(200)]
    common = dict(source="t", options={}, fingerprint="f", tokenizer=BytesTokenizer(), shard_tokens=300)
    write_dataset(
        tmp_path / "mapping", splits={s: [d for split, d in docs if split == s] for s in ("train", "val")}, **common
    )
    write_dataset(tmp_path / "stream", splits=iter(docs), **common)
    files = sorted(p.name for p in (tmp_path / "mapping").iterdir())
    assert len(files) > 10 and files == sorted(p.name for p in (tmp_path / "stream").iterdir())
    for name in files:
        assert (tmp_path / "mapping" / name).read_bytes() == (tmp_path / "stream" / name).read_bytes(), name
    with pytest.raises(DataError, match="unknown split 'test'"):
        write_dataset(tmp_path / "bad", splits=[("train", np.array([1])), ("test", np.array([2]))], **common)
    assert not (tmp_path / "bad").exists()


def test_overwrite_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    write_text(path, ["old text " * 100])
    old = open_dataset(path).train.read(0, 9)

    def failing_docs():
        yield with_eot("new text " * 100)
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed"):
        write_dataset(
            path,
            source="t",
            options={},
            fingerprint="f",
            tokenizer=BytesTokenizer(),
            splits={"train": failing_docs(), "val": [with_eot("v")]},
        )
    np.testing.assert_array_equal(open_dataset(path).train.read(0, 9), old)  # old dataset intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    write_text(path, ["new text " * 100])
    assert BytesTokenizer().decode(open_dataset(path).train.read(0, 9)) == "new text "
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_uint32_tokens(tmp_path: Path) -> None:
    write_counting(tmp_path / "ds", 70_000)
    ds = open_dataset(tmp_path / "ds", verify=True)
    assert ds.manifest["dtype"] == "uint32" and ds.max_token_id == 69_999
    np.testing.assert_array_equal(ds.train.read(65_530, 10), np.arange(65_530, 65_540))


# ----------------------------------------------------------------------------- errors on open


@pytest.fixture
def small_ds(tmp_path: Path) -> Path:
    write_text(tmp_path / "ds", [TEXT], shard_tokens=1000)
    return tmp_path / "ds"


def test_missing_manifest(tmp_path: Path, small_ds: Path) -> None:
    (small_ds / "manifest.json").unlink()  # what a killed copy or a stray folder looks like
    with pytest.raises(DataError, match=r"manifest\.json: missing"):
        open_dataset(small_ds)
    with pytest.raises(DataError, match="missing"):
        open_dataset(tmp_path / "nowhere")


def test_malformed_manifest(small_ds: Path) -> None:
    manifest = small_ds / "manifest.json"
    manifest.write_text('{"format": 1, "splits": ')
    with pytest.raises(DataError, match=r"manifest\.json: malformed JSON"):
        open_dataset(small_ds)
    manifest.write_text(json.dumps({"format": 1, "vocab_size": 257}))
    with pytest.raises(DataError, match="eot_id"):
        open_dataset(small_ds)
    manifest.write_text("[1, 2]")
    with pytest.raises(DataError, match="JSON object"):
        open_dataset(small_ds)


def test_missing_shard(small_ds: Path) -> None:
    (small_ds / "train-00001.safetensors").unlink()
    with pytest.raises(DataError, match=r"train-00001\.safetensors: shard listed in manifest\.json is missing"):
        open_dataset(small_ds)


@pytest.mark.parametrize("keep", [0, 5, 50, -1])
def test_truncated_shard(small_ds: Path, keep: int) -> None:
    shard = small_ds / "train-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(DataError, match=r"train-00002\.safetensors: truncated"):
        open_dataset(small_ds)


def test_sha_mismatch_only_with_verify(small_ds: Path) -> None:
    shard = small_ds / "val-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # same size, different token: only the hash can tell
    shard.write_bytes(bytes(data))
    open_dataset(small_ds)  # the cheap checks pass
    with pytest.raises(DataError, match=r"val-00000\.safetensors: sha256 mismatch"):
        open_dataset(small_ds, verify=True)


def test_dataset_too_small(small_ds: Path) -> None:
    ds = open_dataset(small_ds)
    n_windows = (ds.train.n_tokens - 1) // 512
    with pytest.raises(DataError, match="dataset too small"):
        BatchSampler(ds.train, microbatch_size=n_windows + 1, seq_len=512, seed=0)
    BatchSampler(ds.train, microbatch_size=n_windows, seq_len=512, seed=0)  # exactly enough is fine
    with pytest.raises(DataError, match="targets"):
        BatchSampler(ds.train, microbatch_size=1, seq_len=8, seed=0, targets="prev")


# ----------------------------------------------------------------------------- sampling


@pytest.fixture
def counting(tmp_path: Path):
    write_counting(tmp_path / "ds", 2 * 1000 + 1, shard_tokens=300)  # 2001 tokens -> 200 windows of 10
    return open_dataset(tmp_path / "ds").train


def window_ids(x: np.ndarray, seq_len: int) -> np.ndarray:
    return x[..., 0].reshape(-1) // seq_len  # token value == position, so the first token names the window


def test_targets_next_and_same(counting) -> None:
    T = 10
    x, y = BatchSampler(counting, microbatch_size=4, seq_len=T, seed=3, targets="next").microbatch(7)[:2]
    np.testing.assert_array_equal(y, x + 1)  # next token of a counting sequence
    np.testing.assert_array_equal(x[:, 0] % T, 0)  # windows start at multiples of T
    np.testing.assert_array_equal(x, x[:, :1] + np.arange(T))
    xs, ys = BatchSampler(counting, microbatch_size=4, seq_len=T, seed=3, targets="same").microbatch(7)[:2]
    np.testing.assert_array_equal(xs, x)  # same windows whatever the targets
    np.testing.assert_array_equal(ys, xs)
    assert ys is not xs


def test_every_window_once_per_epoch(counting) -> None:
    T, B = 10, 7  # 200 windows: epochs end in the middle of a microbatch
    sampler = BatchSampler(counting, microbatch_size=B, seq_len=T, seed=1)
    assert sampler.n_windows == 200
    seen = np.concatenate([window_ids(sampler.microbatch(i)[0], T) for i in range(3 * 200 // B + 1)])
    epochs = [seen[e * 200 : (e + 1) * 200] for e in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(200))
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled each epoch
    assert not np.array_equal(epochs[0], np.arange(200))
    assert [sampler.epoch_of(step, 2) for step in (0, 14, 15, 28, 29)] == [0, 0, 1, 1, 2]  # 14 seqs per step
    plain = BatchSampler(counting, microbatch_size=B, seq_len=T, seed=1, shuffle=False)
    in_order = np.concatenate([window_ids(plain.microbatch(i)[0], T) for i in range(60)])
    np.testing.assert_array_equal(in_order, np.arange(420) % 200)


def test_deterministic_in_seed_and_index(counting) -> None:
    def make(seed: int) -> BatchSampler:
        return BatchSampler(counting, microbatch_size=5, seq_len=10, seed=seed)

    a, b, c = make(0), make(0), make(1)
    for step in (0, 3, 100, 41, 3):  # out of order: batches depend on the index only, not on history
        xa, ya = a.batch(step, 4)[:2]
        xb, yb = b.batch(step, 4)[:2]
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a.batch(0, 4)[0], c.batch(0, 4)[0])
    fresh = make(0)  # a resumed run starts straight at a late step
    np.testing.assert_array_equal(fresh.batch(100, 4)[0], a.batch(100, 4)[0])


@pytest.mark.parametrize("targets", ["next", "same"])
def test_batch_equals_microbatches(counting, targets: str) -> None:
    sampler = BatchSampler(counting, microbatch_size=3, seq_len=10, seed=5, targets=targets)
    k = 4
    for step in (0, 1, 16, 17, 50):  # 17*12 = 204 > 200: this step crosses an epoch boundary
        x, y = sampler.batch(step, k)[:2]
        assert x.shape == y.shape == (k, 3, 10) and x.dtype == np.int32
        for j in range(k):
            mx, my = sampler.microbatch(step * k + j)[:2]
            np.testing.assert_array_equal(x[j], mx)
            np.testing.assert_array_equal(y[j], my)


def test_no_leftovers_and_readonly_shards(small_ds: Path) -> None:
    ds = open_dataset(small_ds)
    with pytest.raises(ValueError):  # memmaps are opened read-only: training can never corrupt a dataset
        ds.train.shards[0][0] = 1
    assert all(os.stat(small_ds / s["file"]).st_mode & 0o044 for s in ds.manifest["splits"]["train"]["shards"])


# ----------------------------------------------------------------------------- resume, integrity, atomicity


def test_resume_continues_across_shard_and_epoch_boundaries(tmp_path: Path) -> None:
    """A sampler built from scratch at step s (what a resumed run does) yields exactly what an
    uninterrupted one yields at step s, whatever shard or epoch boundaries lie around s."""
    write_counting(tmp_path / "ds", 2001, shard_tokens=97)  # 21 shards, 200 windows of 10
    T, B, k = 10, 3, 2  # 6 sequences per step: epoch boundaries fall inside steps 33, 66, ...
    uninterrupted = BatchSampler(open_dataset(tmp_path / "ds").train, microbatch_size=B, seq_len=T, seed=7)
    reference = [uninterrupted.batch(step, k) for step in range(70)]
    seen = np.concatenate([window_ids(b.inputs, T) for b in reference])
    assert sorted(seen[:200].tolist()) == list(range(200))  # the first epoch: every window once
    for resume_at in (1, 16, 33, 34, 66):
        resumed = BatchSampler(open_dataset(tmp_path / "ds").train, microbatch_size=B, seq_len=T, seed=7)
        for step in range(resume_at, resume_at + 4):
            x, y = resumed.batch(step, k)[:2]
            np.testing.assert_array_equal(x, reference[step][0])
            np.testing.assert_array_equal(y, reference[step][1])
            np.testing.assert_array_equal(x, x[..., :1] + np.arange(T))  # windows read across shard ends intact
    crossing = [w for w in range(200) if (w * T) // 97 != (w * T + T) // 97]
    assert crossing and set(crossing) <= set(seen.tolist())


def test_changed_shard_is_caught_in_the_batch(tmp_path: Path) -> None:
    write_text(tmp_path / "ds", [TEXT], shard_tokens=1000)
    shard = tmp_path / "ds" / "train-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-20:-18] = (300).to_bytes(2, "little")  # id 300 >= 257, same size: only sha256 would notice
    shard.write_bytes(bytes(data))
    ds = open_dataset(tmp_path / "ds")  # the cheap checks pass
    sampler = BatchSampler(ds.train, microbatch_size=ds.train.n_tokens // 100 - 1, seq_len=100, seed=0, shuffle=False)
    with pytest.raises(
        DataError,
        match=r"train-00001\.safetensors: token id 300 at offset 990 exceeds the "
        r"manifest's max_token_id 256",
    ):
        sampler.microbatch(0)


def test_killed_writers_leave_nothing_that_survives(tmp_path: Path) -> None:
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process
    for name in (f"ds.tmp-{dead_pid}", f"ds.old-{dead_pid}", f"ds.tmp-{os.getppid()}", "ds.tmp-notapid"):
        (tmp_path / name).mkdir()
    write_text(tmp_path / "ds", ["text"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", f"ds.tmp-{os.getppid()}", "ds.tmp-notapid"]


def test_dataset_lock_serialises_preparations(tmp_path: Path) -> None:
    events: list[str] = []
    with dataset_lock(tmp_path / "ds", log=events.append):
        waiter = threading.Thread(target=lambda: dataset_lock_and_note(tmp_path / "ds", events))
        waiter.start()
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            time.sleep(0.01)
        events.append("first releases")
    waiter.join(10)
    assert events[0].startswith("waiting for another process preparing") and events[1:] == [
        "first releases",
        "second holds it",
    ]


def dataset_lock_and_note(path: Path, events: list[str]) -> None:
    with dataset_lock(path, log=events.append):
        events.append("second holds it")


def test_writer_links_existing_shards(tmp_path: Path) -> None:
    write_text(tmp_path / "old", [TEXT], shard_tokens=1000)
    old = open_dataset(tmp_path / "old").manifest
    with DatasetWriter(
        tmp_path / "new", source="t", options={}, fingerprint="f", tokenizer="bytes", vocab_size=257, eot_id=256
    ) as writer:
        for entry in old["splits"]["train"]["shards"][1:]:
            writer.link_shard("train", tmp_path / "old" / entry["file"], entry)
        writer.add_shard("val", np.array([1, 2, 256]), documents=1)
        writer.commit()
    new = open_dataset(tmp_path / "new", verify=True)
    assert new.train.n_tokens == old["splits"]["train"]["tokens"] - 1000
    assert (
        os.stat(tmp_path / "new" / "train-00000.safetensors").st_ino
        == os.stat(tmp_path / "old" / "train-00001.safetensors").st_ino
    )  # a hard link, no copy
    assert new.manifest["splits"]["val"] == {
        "tokens": 3,
        "documents": 1,
        "shards": [{**new.manifest["splits"]["val"]["shards"][0], "documents": 1}],
    }
    with pytest.raises(DataError, match="token id 257 outside 0..256"):
        with DatasetWriter(
            tmp_path / "bad", source="t", options={}, fingerprint="f", tokenizer="bytes", vocab_size=257, eot_id=256
        ) as writer:
            writer.add_shard("train", np.array([257]))
    assert not list(tmp_path.glob("bad*"))  # left without commit: nothing remains
