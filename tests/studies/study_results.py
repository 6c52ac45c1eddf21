"""Shared helpers of the tests over the committed study results (docs/studies/NAME/results.json).

Each test module states, as plain assertions over those files, what the README's prose claims about
a study; a claim that stops being true of the committed values fails its test. Numbers the prose
quotes are compared at the precision it prints them (``fmt(x, 4) == "0.0248"``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from drmlab.experiments.stats import gate, mean_std

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "docs" / "studies"
LN2 = math.log(2)


def load(name: str) -> dict:
    """The committed results of study ``name``."""
    return json.loads((STUDIES / name / "results.json").read_text())


def per_seed(record: dict) -> dict[int, float]:
    """A model's validation CE by seed: ``per_seed`` of a collected study, ``ce_per_seed`` of a transcribed one."""
    values = record["per_seed"] if "per_seed" in record else record["ce_per_seed"]
    return {int(s): v for s, v in values.items()}


def seed_values(record: dict) -> list[float]:
    values = per_seed(record)
    return [values[s] for s in sorted(values)]


def ce_mean(record: dict) -> float:
    return mean_std(seed_values(record))[0]


def gate_of(candidate: dict, baseline: dict) -> dict:
    """The promotion gate of ``candidate`` over ``baseline`` (model records), paired by seed."""
    return gate(per_seed(candidate), per_seed(baseline))


def fmt(x: float, places: int) -> str:
    return f"{x:.{places}f}"
