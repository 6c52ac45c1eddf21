r"""Persistent homology of trajectories (``docs/geometry.md`` section 6), through gudhi.

gudhi is an optional dependency (``pip install 'drmlab[geometry]'``); :func:`require_gudhi` says so
in one line when it is missing.

* :func:`persistence`: the persistence diagrams of a point cloud up to ``max_dim``: the
  Vietoris-Rips filtration (any dimension; filtration value = edge length) or the alpha filtration
  (low dimension; gudhi's squared radii are returned as radii, so both are lengths).
* :func:`landmarks`: farthest-point subsampling, so the cost is set by the landmark count, not by
  the number of states.
* :func:`long_bars`: bars whose persistence (death - birth) exceeds a threshold; the betti counts
  at that threshold are what the instrument reports.
* :func:`bootstrap_persistence`: the spread of the top persistences per dimension over resamples.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "betti_at",
    "bootstrap_persistence",
    "have_gudhi",
    "landmarks",
    "long_bars",
    "persistence",
    "require_gudhi",
]


def have_gudhi() -> bool:
    try:
        import gudhi  # noqa: F401
    except ImportError:
        return False
    return True


def require_gudhi():
    try:
        import gudhi
    except ImportError:
        raise ImportError("persistent homology needs gudhi: pip install 'drmlab[geometry]'") from None
    return gudhi


def landmarks(points: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """Indices of ``count`` farthest-point landmarks of points [N, d] (all of them if N <= count)."""
    n = points.shape[0]
    if n <= count:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    chosen = [int(rng.integers(n))]
    dist = np.linalg.norm(points - points[chosen[0]], axis=1)
    for _ in range(count - 1):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(points - points[nxt], axis=1))
    return np.array(chosen)


def persistence(
    points: np.ndarray, max_dim: int = 1, method: str = "rips", max_edge: float | None = None
) -> dict[int, np.ndarray]:
    """{dimension: diagram [n, 2] of (birth, death)} for dimensions 0..max_dim (death inf for the
    essential classes). ``max_edge`` bounds the Rips filtration (default: the diameter)."""
    gudhi = require_gudhi()
    points = np.asarray(points, dtype=np.float64)
    if method == "rips":
        edge = max_edge if max_edge is not None else float(np.ptp(points, axis=0).max() * math.sqrt(points.shape[1]))
        complex_ = gudhi.RipsComplex(points=points, max_edge_length=edge)
        tree = complex_.create_simplex_tree(max_dimension=max_dim + 1)
        convert = None
    elif method == "alpha":
        tree = gudhi.AlphaComplex(points=points).create_simplex_tree()
        convert = np.sqrt
    else:
        raise ValueError(f"method must be 'rips' or 'alpha', got {method!r}")
    tree.compute_persistence(homology_coeff_field=2, min_persistence=0.0)
    out = {}
    for dim in range(max_dim + 1):
        bars = np.asarray(tree.persistence_intervals_in_dimension(dim), dtype=np.float64).reshape(-1, 2)
        out[dim] = convert(np.clip(bars, 0, None)) if convert is not None else bars
    return out


def long_bars(diagram: np.ndarray, threshold: float) -> np.ndarray:
    """The bars of a diagram whose persistence exceeds ``threshold`` (essential ones included)."""
    life = diagram[:, 1] - diagram[:, 0]
    return diagram[life > threshold]


def betti_at(diagrams: dict[int, np.ndarray], threshold: float) -> dict[int, int]:
    """{dimension: number of bars longer than threshold}."""
    return {dim: len(long_bars(d, threshold)) for dim, d in diagrams.items()}


def bootstrap_persistence(
    points: np.ndarray,
    resamples: int = 10,
    fraction: float = 0.8,
    max_dim: int = 1,
    method: str = "rips",
    top: int = 3,
    seed: int = 0,
    **kwargs,
) -> dict:
    """Mean and standard deviation, over ``resamples`` subsamples of ``fraction`` of the points, of
    the ``top`` largest finite persistences in each dimension (missing bars count as 0)."""
    rng = np.random.default_rng(seed)
    n = points.shape[0]
    rows = {dim: [] for dim in range(max_dim + 1)}
    for _ in range(resamples):
        idx = rng.choice(n, size=max(int(fraction * n), 3), replace=False)
        diagrams = persistence(points[idx], max_dim=max_dim, method=method, **kwargs)
        for dim, d in diagrams.items():
            life = d[:, 1] - d[:, 0]
            life = np.sort(life[np.isfinite(life)])[::-1][:top]
            rows[dim].append(np.pad(life, (0, top - len(life))))
    return {dim: {"mean": np.mean(r, axis=0).tolist(), "std": np.std(r, axis=0).tolist()} for dim, r in rows.items()}
