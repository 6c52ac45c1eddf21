r"""Rank strata of visited states (``docs/geometry.md`` section 2).

A stratum is the set of states where a metric has a given rank. Each state of a trajectory gets a
label -- its exact rank where the construction gives one (:func:`exact_ranks`, through the exact
kernel of :mod:`.metric`), or its numerical rank at a stated relative tolerance
(:func:`numerical_ranks`, an approximation, and named so) -- and :func:`stratify` summarises the
labels: the occupancy of each stratum, the transitions between strata along each trajectory, the
number of changes and the mean dwell (run length).
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import torch

from .metric import kernel_split

__all__ = ["exact_ranks", "numerical_ranks", "stratify"]


def exact_ranks(gamma: torch.Tensor, U: torch.Tensor, with_margin: bool = False):
    """Exact ranks of diag(gamma_n) + U_n U_n^T for gamma [N, d] >= 0 and U [N, d, r]: [N]; with
    ``with_margin`` also the smallest margin of the U_Z rank decisions (``metric.KernelSplit.margin``)."""
    splits = [kernel_split(g, u) for g, u in zip(gamma, U)]
    ranks = torch.tensor([s.rank for s in splits], dtype=torch.long)
    return (ranks, min((s.margin for s in splits), default=1.0)) if with_margin else ranks


def numerical_ranks(eigenvalues: torch.Tensor, rtol: float) -> torch.Tensor:
    """#{sigma_i > rtol max sigma} per row of eigenvalues [N, d] (approximate ranks): [N]."""
    top = eigenvalues.amax(-1, keepdim=True).clamp_min(torch.finfo(eigenvalues.dtype).tiny)
    return (eigenvalues > rtol * top).sum(-1)


def stratify(labels: torch.Tensor) -> dict:
    """Summary of rank labels [B, T] (B trajectories of T states) or [T].

    Returns {'occupancy': {rank: fraction of states}, 'transitions': {'a->b': count} (consecutive
    states of one trajectory, a != b), 'changes': total count, 'mean_dwell': mean run length,
    'strata': sorted ranks seen}."""
    labels = labels.reshape(-1, labels.shape[-1]) if labels.dim() > 1 else labels.unsqueeze(0)
    flat = labels.flatten().tolist()
    counts = Counter(flat)
    transitions: Counter = Counter()
    runs = 0
    for row in labels.tolist():
        runs += 1
        for a, b in pairwise(row):
            if a != b:
                transitions[f"{a}->{b}"] += 1
                runs += 1
    return {
        "strata": sorted(counts),
        "occupancy": {int(k): v / len(flat) for k, v in sorted(counts.items())},
        "transitions": dict(sorted(transitions.items())),
        "changes": int(sum(transitions.values())),
        "mean_dwell": len(flat) / runs,
    }
