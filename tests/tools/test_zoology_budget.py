"""benchmarks/zoology_budget.py: the budget's arithmetic on a case worked by hand, and one cell end to end."""

from __future__ import annotations

import json

import pytest
from tool_scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "zoology_budget.py"


def _module():
    return load_script(SCRIPT, "drmlab_zoology_budget")


def test_cell_hours_by_hand():
    # 196 steps an epoch at 1.8 s: 4 rates x 2 epochs = 1,568 steps of probe, then 14 epochs = 2,744 steps
    hours = _module().cell_hours(1.8, 196, grid=4, probe=2, epochs=16)
    assert hours["probe_h"] == pytest.approx(1568 * 1.8 / 3600)
    assert hours["rest_h"] == pytest.approx(2744 * 1.8 / 3600)


def test_one_cell_is_timed_and_scaled_to_the_protocols_batch(tmp_path, capsys):
    out = tmp_path / "budget.json"
    argv = ["--models", "ATTENTION", "--seq-lens", "64", "--widths", "64", "--slice", "2", "--repeats", "1"]
    assert _module().main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert (row["model"], row["seq_len"], row["width"], row["batch"], row["per_epoch"]) == (
        "ATTENTION",
        64,
        64,
        512,
        196,
    )
    assert row["float32_step_s"] > 0
    assert row["float32"] == _module().cell_hours(row["float32_step_s"], 196, grid=4, probe=2, epochs=16)
    assert "one-thread hours" in capsys.readouterr().out
