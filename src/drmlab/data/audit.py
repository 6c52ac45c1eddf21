"""The document-level split and the train/validation contamination audit.

Split. A document goes to validation iff the first 64 bits (big-endian) of a SHA-256 of its UTF-8
text are below ``val_fraction * 2**64``. With ``seed == 0`` the hash is SHA-256 of the text itself,
which is the reference study's rule (``docs/drm.md`` section A.7); any other seed hashes ``b"drmlab-split:<seed>:" + text``.

Audit. The reference counts exact matches between the 512-byte windows taken at stride 256 in each
stream. That grid check only sees a shared passage when it happens to sit at the same offset modulo
256 in both streams, so it misses most shared boilerplate. We report it (``overlaps``) and also
compare every validation window, at every offset, against the training windows at stride 256
(``overlaps_any_offset``); this finds every passage of at least 512 + 255 = 767 bytes that occurs
in both streams. Windows are compared through a 64-bit rolling hash (vectorised in numpy) and each
hash match is confirmed byte for byte, so the counts are exact, the same as comparing SHA-256s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

WINDOW = 512
STRIDE = 256
_CHUNK_BYTES = 1 << 22  # bytes hashed per numpy pass (bounds memory to ~100 MB)

_MASK = (1 << 64) - 1
_P = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)
# Random-looking per-byte values (fixed) so that the polynomial hash is not on raw bytes.
_BYTE_TABLE = np.frombuffer(
    b"".join(hashlib.sha256(b"drmlab-audit-byte-%d" % b).digest()[:8] for b in range(256)), dtype="<u8"
).astype(np.uint64)


def split_hash(text: str, seed: int = 0) -> int:
    """The 64-bit value the split compares against ``val_fraction * 2**64``."""
    data = text.encode("utf-8")
    if seed:
        data = b"drmlab-split:%d:" % seed + data
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def is_validation(text: str, val_fraction: float, seed: int = 0) -> bool:
    return split_hash(text, seed) < int(val_fraction * 2.0**64)


def _powers(base: int, n: int) -> np.ndarray:
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


_POW_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pow_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    key = 1 << 16 if n <= 1 << 16 else max(n, _CHUNK_BYTES + 1)
    if key not in _POW_CACHE:  # keep one table (at most 2 x 32 MB)
        _POW_CACHE.clear()
        _POW_CACHE[key] = (_powers(_P, key), _powers(_P_INV, key))
    p, pinv = _POW_CACHE[key]
    return p[:n], pinv[:n]


def window_hashes(data: bytes, starts: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """64-bit hashes of ``data[s:s+window]`` for each start in the sorted array ``starts``.

    The hash is sum_k T[w_k] * P^-k mod 2**64 (T a fixed byte table), computed for all windows of a
    chunk at once from prefix sums."""
    starts = np.asarray(starts, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.uint64)
    if len(starts) == 0:
        return out
    buf = np.frombuffer(data, dtype=np.uint8)
    with np.errstate(over="ignore"):
        lo = 0
        while lo < len(starts):
            hi = int(np.searchsorted(starts, starts[lo] + max(_CHUNK_BYTES - window, 1), side="right"))
            s = starts[lo:hi]
            a, b = int(s[0]), int(s[-1]) + window
            seg = _BYTE_TABLE[buf[a:b]]
            p, pinv = _pow_tables(b - a + 1)
            prefix = np.zeros(b - a + 1, dtype=np.uint64)
            np.cumsum(seg * pinv[: b - a], dtype=np.uint64, out=prefix[1:])
            rel = s - a
            out[lo:hi] = (prefix[rel + window] - prefix[rel]) * p[rel]
            lo = hi
    return out


@dataclass
class AuditResult:
    """Counts of validation windows whose bytes also occur as a training window."""

    window: int
    stride: int
    train_windows: int  # training windows at stride `stride`
    val_windows: int  # validation windows at stride `stride` (the reference's grid)
    val_offsets: int  # validation windows at every offset
    overlaps: int  # grid validation windows equal to some training window (the reference's count)
    overlaps_any_offset: int  # validation windows at any offset equal to some training window
    matched_offsets: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))

    def as_meta(self) -> dict:
        return {
            "window": self.window,
            "stride": self.stride,
            "windows": {"train": self.train_windows, "val": self.val_windows},
            "val_offsets_checked": self.val_offsets,
            "overlaps": self.overlaps,
            "overlaps_any_offset": self.overlaps_any_offset,
        }


def audit_streams(train: bytes, val: bytes, window: int = WINDOW, stride: int = STRIDE) -> AuditResult:
    """Compare the validation stream's windows with the training stream's (see the module doc)."""
    if window <= 0 or stride <= 0:
        raise ValueError(f"window and stride must be positive, got {window}, {stride}")
    t_starts = np.arange(0, max(len(train) - window + 1, 0), stride, dtype=np.int64)
    v_starts = np.arange(0, max(len(val) - window + 1, 0), dtype=np.int64)
    n_grid = len(range(0, max(len(val) - window + 1, 0), stride))
    matched = np.zeros(0, dtype=np.int64)
    if len(t_starts) and len(v_starts):
        th = window_hashes(train, t_starts, window)
        order = np.argsort(th, kind="stable")
        th_sorted = th[order]
        vh = window_hashes(val, v_starts, window)
        pos = np.minimum(np.searchsorted(th_sorted, vh, side="left"), len(th_sorted) - 1)
        cand = np.nonzero(th_sorted[pos] == vh)[0]
        if len(cand):
            tv, vv = memoryview(train), memoryview(val)
            lefts = pos[cand]
            rights = np.searchsorted(th_sorted, vh[cand], side="right")
            hits = []
            for off, lft, rgt in zip(cand.tolist(), lefts.tolist(), rights.tolist()):
                piece = vv[off : off + window]
                for j in range(lft, rgt):
                    ts = int(t_starts[order[j]])
                    if tv[ts : ts + window] == piece:
                        hits.append(off)
                        break
            matched = np.asarray(hits, dtype=np.int64)
    return AuditResult(
        window=window,
        stride=stride,
        train_windows=len(t_starts),
        val_windows=n_grid,
        val_offsets=len(v_starts),
        overlaps=int(np.count_nonzero(matched % stride == 0)),
        overlaps_any_offset=len(matched),
        matched_offsets=matched,
    )


def documents_touched(
    offsets: np.ndarray, doc_starts: np.ndarray, doc_ends: np.ndarray, window: int = WINDOW
) -> set[int]:
    """Indices of the documents (given by their [start, end) byte spans in a stream, sorted) that
    overlap any window ``[o, o + window)`` for ``o`` in ``offsets``."""
    touched: set[int] = set()
    if len(offsets) == 0:
        return touched
    offsets = np.asarray(offsets, dtype=np.int64)
    first = np.searchsorted(doc_ends, offsets, side="right")  # first doc ending after o
    last = np.searchsorted(doc_starts, offsets + window, side="left") - 1  # last doc starting before o+window
    for f, l in zip(first.tolist(), last.tolist()):
        touched.update(range(f, l + 1))
    return touched
