"""One protocol at several sizes side by side (drmlab.experiments.ablate.scales): the gate's verdicts per
pair and scale, whether each holds, flips or changes, and bits per byte against parameters."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from drmlab.experiments.ablate import scales

TINY = Path(__file__).resolve().parents[2] / "docs" / "studies" / "protocol-tiny" / "results.json"


def _entry(candidate: str, baseline: str, gain: float, promoted: bool) -> dict:
    return {"candidate": candidate, "baseline": baseline, "gain": gain, "wins": 3 if gain > 0 else 0, "n": 3,
            "promoted": promoted}  # fmt: skip


def _record(params: dict[str, int], bpb: dict[str, float], promoted: dict[tuple[str, str], bool]) -> dict:
    """A collected record with these models and, per ordered pair, whether the gate promoted it."""
    seeds = {"1": 0.0, "2": 0.0, "3": 0.0}
    models = {m: {"params": params[m], "bpb_mean": bpb[m], "bpb_std": 0.01, "per_seed": seeds} for m in params}
    gate = [_entry(a, b, bpb[b] - bpb[a], promoted.get((a, b), False)) for a in params for b in params if a != b]
    return {"study": {"models": list(params), "seeds": [1, 2, 3]}, "models": models, "gate": gate}


def test_one_record_against_itself_holds_everywhere_and_reads_the_gate():
    tiny = json.loads(TINY.read_text())
    rows = scales.verdicts({"tiny": tiny, "again": copy.deepcopy(tiny)})
    n = len(tiny["models"])
    assert len(rows) == n * (n - 1) // 2 and {r["across"] for r in rows} == {"holds"}
    j_ssm = next(r for r in rows if (r["a"], r["b"]) == ("J", "SSM_CONTROL"))["at"]["tiny"]
    # the committed gate: J over SSM_CONTROL promoted (gain +0.0083, 2 of 3 wins)
    assert j_ssm["winner"] == "A" and j_ssm["gain"] == pytest.approx(0.0083, abs=5e-5) and j_ssm["wins"] == 2
    j_jnd = next(r for r in rows if (r["a"], r["b"]) == ("J", "J_NO_DIRECTION"))["at"]["tiny"]
    assert j_jnd["winner"] == "B"  # J_NO_DIRECTION promoted over J


def test_a_flip_a_change_and_a_hold_are_told_apart():
    params = {"A": 10, "B": 10, "C": 10}
    small = _record(params, {"A": 2.0, "B": 2.1, "C": 2.3}, {("A", "B"): True, ("A", "C"): True, ("B", "C"): True})
    large = _record(params, {"A": 1.9, "B": 1.8, "C": 1.85}, {("B", "A"): True, ("A", "C"): False, ("B", "C"): True})
    rows = {(r["a"], r["b"]): r for r in scales.verdicts({"small": small, "large": large})}
    assert rows["A", "B"]["across"] == "flips"
    assert rows["A", "C"]["across"] == "changes" and rows["A", "C"]["at"]["large"]["winner"] == scales.NEITHER
    assert rows["B", "C"]["across"] == "holds"


def test_a_model_not_finished_at_every_scale_is_left_out():
    params = {"A": 10, "B": 10, "C": 10}
    small = _record(params, {"A": 2.0, "B": 2.1, "C": 2.3}, {})
    partial = _record({"A": 20, "B": 20}, {"A": 1.9, "B": 1.8}, {})
    partial["study"]["models"] = ["A", "B", "C"]  # C still training
    rows = scales.verdicts({"small": small, "large": partial})
    assert [(r["a"], r["b"]) for r in rows] == [("A", "B")]
    points = scales.bits_per_byte_by_size({"small": small, "large": partial})
    assert [p["params"] for p in points["A"]] == [10, 20] and [p["scale"] for p in points["C"]] == ["small"]


def test_a_scale_still_training_leaves_the_verdicts_of_the_others_standing():
    params = {"A": 10, "B": 10}
    micro = _record({"A": 5, "B": 5}, {"A": 2.5, "B": 2.6}, {})
    micro["models"] = {}  # its sweep done, no paired run finished
    small = _record(params, {"A": 2.0, "B": 2.1}, {("A", "B"): True})
    large = _record({"A": 20, "B": 20}, {"A": 1.9, "B": 1.8}, {("B", "A"): True})
    rows = scales.verdicts({"micro": micro, "small": small, "large": large})
    assert [(r["a"], r["b"], r["across"]) for r in rows] == [("A", "B", "flips")]
    assert rows[0]["at"]["micro"] is None and rows[0]["at"]["small"]["winner"] == "A"
    # one finished scale alone judges nothing across scales
    assert scales.verdicts({"micro": micro, "small": small}) == []


def test_a_model_part_way_through_its_seeds_is_neither_judged_nor_drawn():
    params = {"A": 10, "B": 10}
    small = _record(params, {"A": 2.0, "B": 2.1}, {("A", "B"): True})
    large = _record({"A": 20, "B": 20}, {"A": 1.9, "B": 1.8}, {})
    large["models"]["B"]["per_seed"] = {"1": 1.25}  # 1 of 3 seeds: its gate entries say "not promoted" for now
    assert scales.finished_models(large) == ["A"]
    assert scales.verdicts({"small": small, "large": large}) == []
    assert [p["scale"] for p in scales.bits_per_byte_by_size({"small": small, "large": large})["B"]] == ["small"]


def test_the_plot_draws_each_model_over_its_sizes(tmp_path):
    tiny = json.loads(TINY.read_text())
    points = scales.bits_per_byte_by_size({"tiny": tiny})
    path = tmp_path / "scales.png"
    assert scales.plot_bits_per_byte_by_size(points, path, "test", metadata={"k": "v"})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not scales.plot_bits_per_byte_by_size({}, tmp_path / "none.png", "nothing")
    assert not (tmp_path / "none.png").exists()


def test_the_window_reading_tells_which_preset_a_longer_window_sides_with():
    """Four pairs, one per reading: A-B agree at both presets (same); A-C turns and the longer window turns
    it too (window); B-C turns and the longer window keeps the small preset's verdict (not the window); A-D
    turns and the longer window promotes neither (neither). A pair not finished in one record is left out."""
    params = {"A": 10, "B": 10, "C": 10, "D": 10}
    bpb = {"A": 2.0, "B": 2.1, "C": 2.2, "D": 2.3}
    short = _record(params, bpb, {("A", "B"): True, ("A", "C"): True, ("B", "C"): True, ("A", "D"): True})
    long = _record(params, bpb, {("A", "B"): True, ("C", "A"): True, ("B", "C"): True})
    larger = _record(params, bpb, {("A", "B"): True, ("C", "A"): True, ("C", "B"): True, ("D", "A"): True})
    rows = {(r["a"], r["b"]): r for r in scales.window_readings(short, long, larger)}
    assert rows["A", "B"]["reading"] == "same"
    assert rows["A", "C"]["reading"] == "window" and rows["A", "C"]["long"]["winner"] == "B"
    assert rows["B", "C"]["reading"] == "not the window" and rows["B", "C"]["larger"]["winner"] == "B"
    assert rows["A", "D"]["reading"] == "neither" and rows["A", "D"]["long"]["winner"] == scales.NEITHER
    assert set(scales.WINDOW_READINGS) == {r["reading"] for r in rows.values()}
    long["models"].pop("D")  # D not finished at the longer window: its pairs are not read
    assert not any("D" in pair for pair in {(r["a"], r["b"]) for r in scales.window_readings(short, long, larger)})
