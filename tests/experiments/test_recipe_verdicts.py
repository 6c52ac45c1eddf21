"""The verdicts of two recipes side by side (drmlab.experiments.ablate.recipe_verdicts), on gates with known
answers: a pair that holds, one that flips, one whose promotion changes, and studies that differ elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drmlab.experiments.ablate.recipe_verdicts import side_by_side

MODELS = ["J_NO_DIRECTION", "J", "SSM_CONTROL", "MAMBA"]


def _study(recipe: str | None, promoted: dict, gains: dict, finished=MODELS) -> dict:
    """A collected record: ``promoted`` the (candidate, baseline) pairs the gate promotes, ``gains`` the
    candidate's mean gain per pair (the other orientation gets its negative)."""
    train = {"tokens": 5_005_312, "batch_size": 32, "grad_accum": 1, "seq_len": 256}
    if recipe is not None:
        train["recipe"] = recipe
    gate = []
    for (a, b), gain in gains.items():
        for cand, base, g in ((a, b, gain), (b, a, -gain)):
            gate.append(
                {"candidate": cand, "baseline": base, "gain": g, "wins": 3 if g > 0 else 0, "n": 3}
                | {"promoted": (cand, base) in promoted}
            )
    return {
        "study": {"preset": "tiny", "seeds": [1, 2, 3], "tokenizer": "bytes", "content_sha256": "c"}
        | {"models": MODELS, "train": train},
        "models": {m: {"per_seed": {"1": 1.0, "2": 1.0, "3": 1.0}} for m in finished},
        "gate": gate,
    }


GAINS_REFERENCE = {("J_NO_DIRECTION", "J"): 0.025, ("J", "SSM_CONTROL"): 0.008, ("MAMBA", "J"): 0.002}
GAINS_FIELD = {("J_NO_DIRECTION", "J"): 0.030, ("J", "SSM_CONTROL"): -0.012, ("MAMBA", "J"): 0.020}
REFERENCE = _study(None, {("J_NO_DIRECTION", "J"), ("J", "SSM_CONTROL")}, GAINS_REFERENCE)
FIELD = _study("field", {("J_NO_DIRECTION", "J"), ("SSM_CONTROL", "J"), ("MAMBA", "J")}, GAINS_FIELD)


def test_each_pair_judged_under_both_recipes_holds_flips_or_changes():
    rows = {(r["a"], r["b"]): r for r in side_by_side(REFERENCE, FIELD)}
    assert {pair: r["across"] for pair, r in rows.items()} == {
        ("J_NO_DIRECTION", "J"): "holds",
        ("J", "SSM_CONTROL"): "flips",
        ("J", "MAMBA"): "changes",  # neither promoted under the reference; MAMBA under the field recipe
    }
    flipped = rows[("J", "SSM_CONTROL")]["at"]
    assert list(flipped) == ["reference", "field"]  # a record without a recipe ran the reference
    assert flipped["reference"] == {"winner": "A", "gain": 0.008, "wins": 3, "n": 3}
    assert flipped["field"] == {"winner": "B", "gain": -0.012, "wins": 0, "n": 3}


def test_a_pair_not_finished_under_one_recipe_is_left_out():
    field = _study("field", set(), GAINS_FIELD, finished=["J_NO_DIRECTION", "J", "SSM_CONTROL"])
    assert {(r["a"], r["b"]) for r in side_by_side(REFERENCE, field)} == {("J_NO_DIRECTION", "J"), ("J", "SSM_CONTROL")}


def test_studies_that_differ_in_more_than_the_recipe_or_not_in_it_are_refused():
    other = json.loads(json.dumps(FIELD))
    other["study"]["preset"], other["study"]["train"]["tokens"] = "small", 1
    with pytest.raises(ValueError, match=r"more than their recipe: preset: 'tiny' and 'small'; tokens: 5005312 and 1"):
        side_by_side(REFERENCE, other)
    with pytest.raises(ValueError, match="both studies trained under recipe 'reference'"):
        side_by_side(REFERENCE, REFERENCE)


def test_a_committed_reference_study_against_itself_as_another_recipe_holds_everywhere():
    record = json.loads((Path(__file__).parents[2] / "docs/studies/protocol-tiny/results.json").read_text())
    relabelled = json.loads(json.dumps(record))
    relabelled["study"]["train"]["recipe"] = "field"
    rows = side_by_side(record, relabelled)
    models = len(record["models"])
    assert len(rows) == models * (models - 1) // 2 and {r["across"] for r in rows} == {"holds"}
