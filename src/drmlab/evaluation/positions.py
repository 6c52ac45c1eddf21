"""Loss by position: cross-entropy per log-spaced bucket of positions, with a 95% band over windows.

**Position** of a target: the inputs its prediction has read since the state was fresh, less one (0: the
prediction after the first input of a window or document). **Buckets** (:func:`bucket_edges`): ``[0, 1)``,
``[1, 2)``, ``[2, 4)``, ``[4, 8)``, ... -- each doubles, ``[2^k, 2^(k+1))`` -- the last one cut at the
longest position, so a bucket past the training window holds only positions the model never trained at
when the window is a power of two (and the bucket that straddles it says so by its bounds).

**CE** of a bucket: the token-weighted mean of its targets' negative log-likelihoods (nats per token).
**Band**: a 95% normal interval ``ce +- 1.96 se`` whose standard error treats *windows* (or documents)
as the independent units, since neighbouring tokens of one window are correlated: the cluster-robust
(linearised ratio) variance ``G / (G - 1) * sum_g (S_g - ce n_g)^2 / (sum_g n_g)^2`` over the G groups
that have targets in the bucket, ``S_g`` and ``n_g`` their sum of nats and count. With equal counts per
window it is the usual interval over per-window bucket means. Fewer than 2 groups: no band (null).

Positions the model cannot read (past a learned position table) are reported as ``"ce": "n/a"`` with the
reason, not scored. The token counts of the buckets add up to the targets scored.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
BUCKET_RULE = (
    "log2 buckets of the position (inputs read since a fresh state, less one): [0,1), [1,2), [2,4), [4,8), ..."
)
BAND_RULE = (
    "95% normal interval ce +- 1.96 se, se cluster-robust over windows (documents when the state is carried): "
    "G/(G-1) * sum_g (S_g - ce*n_g)^2 / (sum_g n_g)^2; none with fewer than 2"
)


def bucket_edges(length: int) -> list[tuple[int, int]]:
    """``[(0, 1), (1, 2), (2, 4), ...]`` up to ``length`` positions, the last bucket cut at ``length``."""
    if length < 1:
        raise ValueError(f"a window must hold at least one position, got {length}")
    edges, lo, hi = [(0, 1)], 1, 2
    while lo < length:
        edges.append((lo, min(hi, length)))
        lo, hi = hi, 2 * hi
    return edges


def _band(nll: np.ndarray, groups: np.ndarray) -> tuple[float, float | None, int]:
    """(ce, the 95% half-width or None, the number of groups) of one bucket's targets."""
    keys, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=nll)
    counts = np.bincount(inverse).astype(np.float64)
    total = counts.sum()
    ce = float(sums.sum() / total)
    if len(keys) < 2:
        return ce, None, len(keys)
    var = len(keys) / (len(keys) - 1) * float(((sums - ce * counts) ** 2).sum()) / total**2
    return ce, Z95 * math.sqrt(var), len(keys)


def by_position(scores, length: int, limit: int | None = None, reason: str | None = None) -> list[dict]:
    """One row per bucket of :func:`bucket_edges` (``length``): ``lo``, ``hi``, ``tokens``, ``ce``, ``low``,
    ``high`` (the band), ``groups``; a bucket at or past ``limit`` (the positions a model can read) has
    ``"ce": "n/a"`` and ``reason``; a bucket that no target reached has ``tokens`` 0 and ``ce`` None."""
    scored = scores.scored
    position, nll, group = scores.position[scored], scores.nll[scored], scores.group[scored]
    rows = []
    for lo, hi in bucket_edges(length):
        row = {"lo": lo, "hi": hi}
        if limit is not None and lo >= limit:
            rows.append({**row, "tokens": 0, "ce": "n/a", "low": None, "high": None, "groups": 0, "reason": reason})
            continue
        mask = (position >= lo) & (position < hi)
        if not mask.any():
            rows.append({**row, "tokens": 0, "ce": None, "low": None, "high": None, "groups": 0})
            continue
        ce, half, n_groups = _band(nll[mask], group[mask])
        row.update(tokens=int(mask.sum()), ce=ce, groups=n_groups)
        row.update(low=None if half is None else ce - half, high=None if half is None else ce + half)
        if limit is not None and hi > limit:
            row["note"] = f"positions {limit} to {hi - 1} n/a: {reason}"
        rows.append(row)
    return rows
