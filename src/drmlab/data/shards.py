"""Token-stream shards on disk: atomic writes, a JSON manifest with checksums, verified memmaps.

A shard is one raw little-endian array file (uint8 for vocabularies up to 256, uint16 up to 65,536,
uint32 beyond). The manifest (``manifest.json``) records, per shard, its file name, dtype, length
and the SHA-256 of its bytes. Every file is written to a temporary name in the same folder and moved
into place with ``os.replace``; the manifest is written last, so a folder without a manifest is an
unfinished build, never a silently short one. Files are not fsync'ed: a shard cut short by a crash
fails the size or checksum check on the next load instead of being read.

``open_shard`` checks that the file exists, that its size matches the recorded length and (by
default) that its SHA-256 matches, and raises ``CorruptShardError`` naming the file otherwise.
Hashing runs at about 1 GB/s, so verifying is cheap next to training.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST_NAME = "manifest.json"
_HASH_CHUNK = 1 << 24


class CorruptShardError(ValueError):
    """A cached shard or manifest is missing, truncated or does not match its checksum."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids ``0 .. vocab_size - 1``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32 token ids")


def _atomic_write_bytes(path: Path, chunks) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_shard(directory: str | os.PathLike, name: str, tokens: np.ndarray) -> dict[str, Any]:
    """Write ``tokens`` (1-D) to ``directory/name`` atomically; return its manifest entry
    ``{"file", "dtype", "length", "sha256"}``."""
    arr = np.ascontiguousarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"a shard must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind != "u":
        raise ValueError(f"a shard must hold unsigned token ids, got dtype {arr.dtype}")
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    view = memoryview(arr).cast("B")
    digest = hashlib.sha256(view).hexdigest()
    _atomic_write_bytes(Path(directory) / name, [view])
    return {"file": name, "dtype": arr.dtype.name, "length": int(arr.shape[0]), "sha256": digest}


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` atomically (after the shards it names)."""
    path = Path(directory) / MANIFEST_NAME
    _atomic_write_bytes(path, [json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")])
    return path


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest in ``directory``, or None when there is none; CorruptShardError when it
    cannot be parsed."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptShardError(f"corrupted cache manifest {path}: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), dict):
        raise CorruptShardError(f"corrupted cache manifest {path}: no 'shards' table")
    return manifest


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def open_shard(directory: str | os.PathLike, entry: dict[str, Any], verify: bool = True, hint: str = "") -> np.memmap:
    """Memory-map the shard described by a manifest ``entry`` read-only, after checking it.

    Raises CorruptShardError naming the file when it is missing, has the wrong size, or (with
    ``verify``) the wrong SHA-256. ``hint`` is appended to the message (how to recover)."""
    suffix = f"; {hint}" if hint else ""
    try:
        path = Path(directory) / entry["file"]
        dtype = np.dtype(entry["dtype"]).newbyteorder("<")
        length = int(entry["length"])
        want = entry["sha256"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptShardError(f"corrupted manifest entry in {directory}: {entry!r} ({exc}){suffix}") from None
    if not path.is_file():
        raise CorruptShardError(f"cache shard {path} is missing{suffix}")
    size = path.stat().st_size
    if size != length * dtype.itemsize:
        raise CorruptShardError(
            f"corrupted cache shard {path}: {size} bytes, the manifest says {length} tokens of "
            f"{dtype.name} = {length * dtype.itemsize} bytes (truncated or overwritten){suffix}"
        )
    if verify:
        got = file_sha256(path)
        if got != want:
            raise CorruptShardError(f"corrupted cache shard {path}: sha256 {got}, the manifest says {want}{suffix}")
    if length == 0:
        raise CorruptShardError(f"cache shard {path} is empty (an empty stream cannot be memory-mapped){suffix}")
    return np.memmap(path, dtype=dtype, mode="r", shape=(length,))
