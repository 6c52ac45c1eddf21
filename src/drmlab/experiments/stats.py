"""The statistics every study reports: mean and population standard deviation over seeds, and the
promotion gate of the reference ablation protocol (docs/drm.md section A.7).

The gate compares a candidate with a baseline on validation CEs paired by seed: the candidate is
promoted only with at least 3 paired seeds, a mean CE at least 0.005 nats below the baseline's, a
win on at least 2/3 of the pairs and a population std over its seeds of at most 0.03.
"""

from __future__ import annotations

import math

GATE_MIN_GAIN = 0.005
GATE_MIN_WIN_FRACTION = 2 / 3
GATE_MAX_STD = 0.03
GATE_MIN_SEEDS = 3
# The rule as the studies record it next to their verdicts (results.json's "gate_rule").
GATE_RULE = {
    "min_seeds": GATE_MIN_SEEDS,
    "min_gain": GATE_MIN_GAIN,
    "min_win_fraction": GATE_MIN_WIN_FRACTION,
    "max_std": GATE_MAX_STD,
    "std": "population",
}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof 0, as the reference reports)."""
    n = len(values)
    centre = sum(values) / n
    return centre, math.sqrt(sum((v - centre) ** 2 for v in values) / n)


def gate(candidate: dict[int, float], baseline: dict[int, float]) -> dict:
    """The promotion gate for per-seed CEs ``candidate`` against ``baseline`` (paired by seed).

    Returns ``paired_seeds``, ``n``, ``promoted`` and ``reasons`` (why not, empty when promoted); with
    at least one pair also ``gain`` (baseline mean - candidate mean), ``wins``, ``wins_needed``,
    ``candidate_std`` and ``per_seed_gain``.
    """
    seeds = sorted(set(candidate) & set(baseline))
    result = {"paired_seeds": seeds, "n": len(seeds)}
    if not seeds:
        return dict(result, promoted=False, reasons=["no paired seeds"])
    cand = [candidate[s] for s in seeds]
    base = [baseline[s] for s in seeds]
    cand_mean, cand_std = mean_std(cand)
    base_mean, _ = mean_std(base)
    gain = base_mean - cand_mean
    wins = sum(c < b for c, b in zip(cand, base))
    need_wins = math.ceil(GATE_MIN_WIN_FRACTION * len(seeds) - 1e-9)
    reasons = []
    if len(seeds) < GATE_MIN_SEEDS:
        reasons.append(f"only {len(seeds)} paired seeds (needs {GATE_MIN_SEEDS})")
    if gain < GATE_MIN_GAIN:
        reasons.append(f"mean gain {gain:+.4f} < {GATE_MIN_GAIN}")
    if wins < need_wins:
        reasons.append(f"wins {wins} of {len(seeds)} (needs {need_wins})")
    if cand_std > GATE_MAX_STD:
        reasons.append(f"std {cand_std:.4f} > {GATE_MAX_STD}")
    return dict(
        result,
        gain=gain,
        wins=wins,
        wins_needed=need_wins,
        candidate_std=cand_std,
        per_seed_gain={s: b - c for s, c, b in zip(seeds, cand, base)},
        promoted=not reasons,
        reasons=reasons,
    )
