"""Shards: atomic writes, manifest, verified memmaps; damaged cache files are named, never read."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from drmlab.data import CorruptShardError, load_corpus
from drmlab.data.shards import dtype_for_vocab, open_shard, read_manifest, write_manifest, write_shard


def test_dtype_for_vocab():
    assert dtype_for_vocab(2) == np.uint8 and dtype_for_vocab(256) == np.uint8
    assert dtype_for_vocab(257) == np.uint16 and dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32
    with pytest.raises(ValueError):
        dtype_for_vocab(0)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_shard_roundtrip(tmp_path, dtype):
    arr = (np.arange(1000) * 7919 % np.iinfo(dtype).max).astype(dtype)
    entry = write_shard(tmp_path, "x.bin", arr)
    assert entry == {
        "file": "x.bin",
        "dtype": np.dtype(dtype).name,
        "length": 1000,
        "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]  # no temporary files left
    mm = open_shard(tmp_path, entry)
    assert isinstance(mm, np.memmap) and mm.dtype == dtype and not mm.flags.writeable
    np.testing.assert_array_equal(mm, arr)


def test_write_shard_rejects_bad_arrays(tmp_path):
    with pytest.raises(ValueError, match="1-D"):
        write_shard(tmp_path, "a.bin", np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="unsigned"):
        write_shard(tmp_path, "a.bin", np.zeros(4, np.int64))


def test_damaged_shards_are_named(tmp_path):
    arr = np.arange(4096, dtype=np.uint16)
    entry = write_shard(tmp_path, "t.bin", arr)
    path = tmp_path / "t.bin"
    raw = path.read_bytes()

    path.write_bytes(raw[:-2])  # truncated
    with pytest.raises(CorruptShardError, match=r"t\.bin.*truncated"):
        open_shard(tmp_path, entry)

    flipped = bytearray(raw)
    flipped[100] ^= 1
    path.write_bytes(bytes(flipped))  # same size, wrong content
    with pytest.raises(CorruptShardError, match=r"t\.bin: sha256"):
        open_shard(tmp_path, entry, hint="delete it")
    assert open_shard(tmp_path, entry, verify=False)[50] != arr[50]  # only verify=False reads it

    path.unlink()
    with pytest.raises(CorruptShardError, match=r"t\.bin is missing"):
        open_shard(tmp_path, entry)
    with pytest.raises(CorruptShardError, match="manifest entry"):
        open_shard(tmp_path, {"file": "t.bin"})


def test_manifest_roundtrip_and_corruption(tmp_path):
    assert read_manifest(tmp_path) is None
    manifest = {"shards": {"train": {"file": "a"}}, "meta": {"x": 1}}
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    (tmp_path / "manifest.json").write_text('{"shards": {"tra')
    with pytest.raises(CorruptShardError, match="manifest.json"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(CorruptShardError, match="shards"):
        read_manifest(tmp_path)


def _small_corpus_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"doc{i:02d}.txt").write_text(f"document {i}\n" + " ".join(f"w{i}_{j}" for j in range(60)) + "\n")
    return src


def test_corpus_cache_corruption_is_detected_and_rebuild_fixes_it(tmp_path):
    src = _small_corpus_dir(tmp_path)
    cache = tmp_path / "cache"
    c = load_corpus(src, cache_dir=cache, val_fraction=0.25)
    train = np.array(c.train)
    folder = c.cache_dir
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["shards"]) == {"train", "val"}
    assert manifest["shards"]["train"]["length"] == len(train) == c.meta["train_tokens"]
    del c

    shard = folder / "train.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CorruptShardError) as info:
        load_corpus(src, cache_dir=cache, val_fraction=0.25)
    assert str(shard) in str(info.value) and "rebuild" in str(info.value)

    c = load_corpus(src, cache_dir=cache, val_fraction=0.25, rebuild=True)
    assert not c.from_cache
    np.testing.assert_array_equal(c.train, train)
    del c

    val = folder / "val.bin"
    data = bytearray(val.read_bytes())
    data[0] ^= 0x20
    val.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=r"val\.bin: sha256"):
        load_corpus(src, cache_dir=cache, val_fraction=0.25)

    (folder / "manifest.json").write_text("not json")
    with pytest.raises(CorruptShardError, match="manifest.json"):
        load_corpus(src, cache_dir=cache, val_fraction=0.25)
    load_corpus(src, cache_dir=cache, val_fraction=0.25, rebuild=True)
    assert load_corpus(src, cache_dir=cache, val_fraction=0.25).from_cache
