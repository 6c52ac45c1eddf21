"""Shared helpers of the tests over the committed study results (docs/studies/NAME/results.json).

Each test module states, as plain assertions over those files, what the text claims about a study: the
study's sections of docs/results.md, docs/results-in-full.md and the README (each section opens with
``<!-- study: NAME ... -->`` and runs to the next such marker, an ``<!-- end study -->`` or the end of the
page). Numbers the text quotes are compared at the precision it prints them, and found in that text:
``fmt(x, 4) == said("0.0248")`` fails when the committed value says otherwise and when the text does.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from drmlab.experiments.stats import gate, mean_std

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "docs" / "studies"
PAGES = (ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "results-in-full.md")
LN2 = math.log(2)
MARKER = re.compile(r"<!-- study: ([\w .-]+?) -->|<!-- end study -->")


def study_text(*names: str, pages=PAGES) -> str:
    """The text of every section of the ``pages`` about one of the studies ``names``, whitespace collapsed."""
    parts = []
    for page in pages:
        text = page.read_text()
        marks = list(MARKER.finditer(text))
        for mark, after in zip(marks, marks[1:] + [None]):
            if mark[1] and set(mark[1].split()) & set(names):
                parts.append(text[mark.end() : after.start() if after else len(text)])
    assert parts, f"no section of {', '.join(p.name for p in pages)} is marked '<!-- study: {names[0]} -->'"
    return " ".join(" ".join(parts).split())


def stated(*names: str):
    """``said(value) -> value`` for the studies ``names``: asserts their text quotes ``value`` (a number as a
    whole: "0.91" is not found in "10.91" or "0.915")."""
    text = study_text(*names)

    def said(value: str) -> str:
        pattern = r"(?<![\d.])" + re.escape(value) + (r"(?!\d)" if value[-1:].isdigit() else "")
        assert re.search(pattern, text), f"the text of {', '.join(names)} does not say {value!r}"
        return value

    return said


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
