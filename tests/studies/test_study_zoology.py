"""The claims docs/results.md and docs/results-in-full.md make about the Zoology MQAR protocol on the CPU
(docs/studies/zoology-cpu): our attention baseline at length 64, 4 pairs, width 64 reaches the figure's level (above
0.97) at the two higher rates of the grid, with the early stop, and the two lower rates had not finished."""

from __future__ import annotations

import pytest
from study_results import load, stated

said = stated("zoology-cpu")


def _runs():
    return {r["lr"]: r for r in load("zoology-cpu")["finished"]}


def test_attention_reaches_the_figures_level_at_the_higher_rates():
    runs = _runs()
    assert set(runs) == {0.01, 0.002154434690031882}
    top, second = runs[0.01], runs[0.002154434690031882]
    assert (
        f"{100 * top['test_acc']:.2f}" == said("99.17")
        and top["epochs_run"] == 8
        and said("8 epochs")
        and top["early_stopped"]
    )
    assert (
        f"{100 * second['test_acc']:.2f}" == said("99.08")
        and second["epochs_run"] == 11
        and said("11 epochs")
        and second["early_stopped"]
    )
    assert all(r["test_queries"] == 3000 * 4 for r in runs.values())  # 3,000 test examples x 4 queries


def test_the_cell_is_the_best_finished_rate_and_says_the_sweep_is_incomplete():
    cell = load("zoology-cpu")["cells"]["ATTENTION w64 L64"]
    assert cell["status"] == "incomplete" and cell["lr"] == 0.01 and cell["acc"] == _runs()[0.01]["test_acc"]
    assert cell["state_bytes"] == 2 * 2 * 64 * 64 * 4  # 2 layers x (keys, values) x 64 tokens x width x float32


def test_the_budgets_cost_adds_up_from_its_cells_and_the_text_quotes_it():
    """docs/studies/zoology-budget: the hours per length are the sum of the cells' faster dtype, the
    slowest cell's one run is its 16 epochs, and the text quotes the totals."""
    record = load("zoology-budget")
    said = stated("zoology-budget")
    rows = record["rows"]
    assert {(r["seq_len"], r["width"]) for r in rows} == {(64, 64), (64, 128), (256, 64), (256, 128)}
    assert len(rows) == 4 * 6 and not any("na" in r for r in rows)

    def hours(r):
        return min(r[k]["probe_h"] + r[k]["rest_h"] for k in ("float32", "bf16"))

    by_length = {L: sum(hours(r) for r in rows if r["seq_len"] == L) for L in (64, 256)}
    summary = record["summary"]
    assert summary["hours_no_early_stop"]["L64"] == by_length[64]
    assert summary["hours_no_early_stop"]["L256"] == by_length[256]
    for value in (by_length[64] + by_length[256], by_length[64], by_length[256]):
        said(f"{value:.1f}")
    slowest = max(rows, key=lambda r: min(r[k]["probe_h"] / 4 + r[k]["rest_h"] for k in ("float32", "bf16")))
    assert (slowest["model"], slowest["seq_len"], slowest["width"]) == ("SSM_CONTROL", 256, 128)
    said(f"{summary['longest_run_h']:.1f}")
    for r in rows:  # the probe is 4 rates x 2 epochs, the rest 14 epochs, at the same step time
        for k in ("float32", "bf16"):
            assert r[k]["probe_h"] / r[k]["rest_h"] == pytest.approx(8 / 14)
