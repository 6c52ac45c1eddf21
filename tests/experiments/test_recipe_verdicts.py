"""The verdicts of two recipes side by side (drmlab.experiments.ablate.recipe_verdicts), on gates with known
answers: a pair that holds, one that flips, one whose promotion changes, and studies that differ elsewhere."""

from __future__ import annotations

import pytest

from drmlab.experiments.ablate.recipe_verdicts import markdown, side_by_side


def _gate(candidate, baseline, gain, wins, promoted):
    return {"candidate": candidate, "baseline": baseline, "gain": gain, "wins": wins, "n": 3, "promoted": promoted}


def _study(recipe, gates):
    train = {"tokens": 5_005_312, "batch_size": 32, "grad_accum": 1, "seq_len": 256, "recipe": recipe}
    study = {"preset": "tiny", "seeds": [1, 2, 3], "tokenizer": "bytes", "content_sha256": "c", "train": train}
    both = gates + [_gate(b, a, -g, 3 - w, False) for a, b, g, w, _ in [tuple(x.values())[:5] for x in gates]]
    return {"study": study, "gate_rule": {"min_gain": 0.005}, "gate": both}


REFERENCE = _study(
    "reference",
    [
        _gate("J_NO_DIRECTION", "J", 0.0248, 3, True),  # holds
        _gate("J", "SSM_CONTROL", 0.0083, 2, True),  # flips
        _gate("MAMBA", "GPT2", 0.02, 2, True),  # changes: no longer promoted
        _gate("RESOLVENT", "LLAMA", 0.001, 1, False),  # changes: a tie grows into a lead
    ],
)
FIELD = _study(
    "field",
    [
        _gate("J_NO_DIRECTION", "J", 0.0301, 3, True),
        _gate("J", "SSM_CONTROL", -0.0120, 0, False),
        _gate("MAMBA", "GPT2", 0.012, 1, False),
        _gate("RESOLVENT", "LLAMA", 0.02, 3, True),
    ],
)


def test_each_pair_once_oriented_by_the_first_recipe_with_its_verdict():
    rows = side_by_side(REFERENCE, FIELD)
    verdicts = {(r["candidate"], r["baseline"]): r["verdict"] for r in rows}
    assert verdicts == {
        ("J_NO_DIRECTION", "J"): "holds",
        ("J", "SSM_CONTROL"): "flips",
        ("MAMBA", "GPT2"): "changes",
        ("RESOLVENT", "LLAMA"): "changes",
    }
    flipped = next(r for r in rows if r["verdict"] == "flips")
    assert flipped["first"] == {"gain": 0.0083, "wins": 2, "n": 3, "promoted": True}
    assert flipped["second"] == {"gain": -0.0120, "wins": 0, "n": 3, "promoted": False}


def test_the_orientation_follows_the_first_study_whichever_order_its_gates_come_in():
    reordered = dict(REFERENCE, gate=list(reversed(REFERENCE["gate"])))
    assert side_by_side(reordered, FIELD) == side_by_side(REFERENCE, FIELD)
    swapped = {(r["candidate"], r["baseline"]) for r in side_by_side(FIELD, REFERENCE)}
    assert ("SSM_CONTROL", "J") in swapped and ("J_NO_DIRECTION", "J") in swapped


def test_a_pair_gated_in_one_study_only_is_left_out():
    field = dict(FIELD, gate=[g for g in FIELD["gate"] if "LLAMA" not in (g["candidate"], g["baseline"])])
    assert {r["candidate"] for r in side_by_side(REFERENCE, field)} == {"J_NO_DIRECTION", "J", "MAMBA"}


def test_studies_that_differ_in_more_than_the_recipe_are_refused_naming_each_difference():
    other = {**FIELD, "study": {**FIELD["study"], "preset": "small", "train": {**FIELD["study"]["train"], "tokens": 1}}}
    with pytest.raises(ValueError, match=r"preset: 'tiny' and 'small'; tokens: 5005312 and 1"):
        side_by_side(REFERENCE, other)


def test_the_table_names_both_recipes_and_marks_promotions():
    table = markdown(side_by_side(REFERENCE, FIELD))
    assert (
        table.splitlines()[0]
        == "| pair (candidate over baseline) | reference: gain, wins | field: gain, wins | verdict |"
    )
    assert "| J over SSM_CONTROL | +0.0083, 2 of 3 (promoted) | -0.0120, 0 of 3 | flips |" in table


def test_a_committed_study_against_itself_holds_everywhere():
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).parents[2] / "docs/studies/protocol-tiny/results.json").read_text())
    rows = side_by_side(record, record)
    models = len(record["models"])
    assert len(rows) == models * (models - 1) // 2
    assert {r["verdict"] for r in rows} == {"holds"} and all(r["first"]["gain"] >= 0 for r in rows)
