"""The claims docs/results-in-full.md (section 9, length 64 at CPU budget) makes about
docs/studies/zoology-l64: the protocol as run, each cell's rate as its probe chose it, the attention rows
against Zoology's figure, the check of the probe at width 128, and the cells finished so far."""

from __future__ import annotations

from study_results import ROOT, load, stated

from drmlab.experiments import lr_sweep

said = stated("zoology-l64")
RATES = (0.0001, 0.00046415888336127773, 0.002154434690031882, 0.01)


def _record():
    return load("zoology-l64")


def _runs():
    return {(r["model"], r["width"], r["lr"]): r for r in _record()["finished"]}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def test_the_record_is_the_protocol_at_cpu_budget_in_the_fast_setting():
    record = _record()
    study, recipe = record["study"], record["study"]["recipe"]
    assert "Zoology protocol at CPU budget" in record["title"]
    assert study["settings"] == [[64, 4]] and study["widths"] == [64, 128] and tuple(study["lr_grid"]) == RATES
    assert (recipe["epochs"], recipe["probe_epochs"], recipe["early_stop"]) == (16, 2, 0.99)
    assert study["train_overrides"] == {"bf16": True, "bf16_memory_products": True, "compile": True}
    assert study["models"] == ["ATTENTION", "MAMBA", "RESOLVENT", "SSM_CONTROL", "J_NO_DIRECTION", "ASM_CM"]
    assert all(r["test_queries"] == 3000 * 4 for r in record["finished"])  # 3,000 test examples x 4 queries


def test_each_probe_score_is_the_runs_second_epoch_and_each_cell_took_the_best():
    runs = _runs()
    for cell in _record()["cells"].values():
        scores = {float(k): v for k, v in cell["scores"].items()}
        for lr, score in scores.items():
            run = runs[(cell["model"], cell["width"], lr)]
            end = [e for e in run["epochs"] if e["epoch"] <= 2][-1]  # epoch 2, or the early stop before it
            assert score == end["test_acc"] and (end["epoch"] == 2 or run["early_stopped"])
        if len(scores) == len(RATES) and None not in scores.values():
            assert cell["lr"] == lr_sweep.choose(scores, lower_is_better=False)["lr"] == max(scores, key=scores.get)


def test_attention_at_width_64_reaches_the_figure_at_the_rate_its_probe_chose():
    cell = _record()["cells"]["ATTENTION w64 L64"]
    scores = [cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES]
    assert [_pct(s) for s in scores] == [said("10.18"), said("24.06"), said("25.96"), said("23.17")]
    assert cell["status"] == "done" and cell["lr"] == RATES[2] and cell["epochs"] == 9 and said("9 epochs")
    assert _pct(cell["acc"]) == said("99.11") and cell["acc"] > 0.97  # the figure's 0.97-0.99
    assert _runs()[("ATTENTION", 64, RATES[2])]["early_stopped"]


def test_attention_at_width_128_the_probe_chose_on_a_plateau_and_a_higher_rate_reaches_the_figure():
    cell = _record()["cells"]["ATTENTION w128 L64"]
    scores = [cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES]
    assert [_pct(s) for s in scores] == [said("26.92"), said("27.14"), said("26.67"), said("15.80")]
    assert max(scores[:3]) - min(scores[:3]) < 0.005  # three rates within half a point after 2 epochs
    assert cell["status"] == "done" and cell["lr"] == RATES[1] and cell["epochs"] == 16
    assert _pct(cell["acc"]) == said("49.60") and cell["acc"] < 0.97  # below the figure
    check = _runs()[("ATTENTION", 128, RATES[2])]  # the check: the next rate, trained on past its probe
    assert check["status"] == "done" and check["early_stopped"] and check["epochs_run"] == 8 and said("8 epochs")
    assert _pct(check["test_acc"]) == said("99.75")


def test_mamba_chose_the_grids_top_at_both_widths():
    cell = _record()["cells"]["MAMBA w64 L64"]
    assert cell["status"] == "done" and cell["lr"] == RATES[3] and cell["epochs"] == 9
    assert _pct(cell["acc"]) == said("99.02")
    assert [_pct(cell["scores"][lr_sweep.lr_label(lr)]) for lr in RATES[2:]] == [said("22.33"), said("42.35")]
    wide = _record()["cells"]["MAMBA w128 L64"]
    assert wide["status"] == "done" and wide["lr"] == RATES[3] and wide["epochs"] == 8
    assert _pct(wide["scores"][lr_sweep.lr_label(RATES[3])]) == said("93.63") and _pct(wide["acc"]) == said("99.23")


def test_resolvent_at_width_128_left_the_plateau_in_its_probe_and_stopped_early():
    cell = _record()["cells"]["RESOLVENT w128 L64"]
    scores = [_pct(cell["scores"][lr_sweep.lr_label(lr)]) for lr in RATES]
    assert scores == [said("27.52"), said("37.45"), said("25.34"), said("23.47")]
    assert cell["status"] == "done" and cell["lr"] == RATES[1] and cell["epochs"] == 3
    assert _pct(cell["acc"]) == said("99.25") and _runs()[("RESOLVENT", 128, RATES[1])]["early_stopped"]


def test_resolvent_at_width_64_jumped_then_stayed_below_the_early_stop():
    cell = _record()["cells"]["RESOLVENT w64 L64"]
    scores = {lr: cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES}
    assert cell["lr"] == RATES[1] and [_pct(scores[lr]) for lr in RATES[1:3]] == [said("26.84"), said("24.95")]
    assert f"{100 * (scores[RATES[1]] - scores[RATES[2]]):.2f}" == said("1.89")
    acc = {e["epoch"]: e["test_acc"] for e in _runs()[("RESOLVENT", 64, RATES[1])]["epochs"]}
    assert [_pct(acc[e]) for e in (3, 4)] == [said("35.27"), said("97.40")]
    later = [acc[e] for e in range(5, 17)]
    assert [_pct(min(later)), _pct(max(later))] == [said("98.08"), said("98.66")] and max(later) < 0.99
    assert cell["status"] == "done" and cell["epochs"] == 16 and _pct(cell["acc"]) == said("98.52")


def _probe(key: str) -> dict:
    return _record()["cells"][key]["probe"]


def test_the_probe_rate_by_rate_where_the_loss_and_the_accuracy_part():
    """docs/results-in-full.md's paragraph on the probe's rule: the last batch's loss names attention's
    good rate at width 128, the accuracy names RESOLVENT's at width 128, and the two agree for MAMBA."""
    labels = [lr_sweep.lr_label(lr) for lr in RATES]
    attention = _probe("ATTENTION w128 L64")
    losses = [f"{attention['rates'][x]['train_loss']:.2f}" for x in labels]
    assert losses == [said("7.61"), said("5.11"), said("2.39"), said("7.17")]
    assert attention["by_train_loss"] == RATES[2] and _runs()[("ATTENTION", 128, RATES[2])]["test_acc"] > 0.99
    resolvent = _probe("RESOLVENT w128 L64")
    assert resolvent["by_test_ce"] == resolvent["by_train_loss"] == RATES[2]
    assert f"{resolvent['rates'][labels[1]]['test_ce']:.2f}" == said("4.58")
    assert f"{resolvent['rates'][labels[2]]['test_ce']:.2f}" == said("2.66")
    for model in ("MAMBA", "SSM_CONTROL"):
        for width in (64, 128):
            cell = _record()["cells"][f"{model} w{width} L64"]
            assert cell["probe"]["by_train_loss"] == cell["lr"]
            assert cell["probe"]["by_test_ce"] in (None, cell["lr"])  # where the test CE was recorded
    narrow = _probe("ATTENTION w64 L64")
    gap = narrow["rates"][labels[2]]["train_loss"] - narrow["rates"][labels[3]]["train_loss"]
    assert narrow["by_train_loss"] == RATES[3] and f"{gap:.3f}" == said("0.008")
    cpu = {r["lr"]: r for r in load("zoology-cpu")["finished"]}
    assert _pct(cpu[RATES[3]]["test_acc"]) == said("99.17")  # that rate in float32, every epoch trained


def test_the_last_batchs_loss_lies_near_the_test_ce_and_in_its_order():
    with_ce = [c["probe"] for c in _record()["cells"].values() if c.get("probe") and c["probe"]["by_test_ce"]]
    assert with_ce  # RESOLVENT at width 128 on
    swapped = []
    for probe in with_ce:
        rates = [r for r in probe["rates"].values() if r["test_ce"] is not None]
        assert all(abs(r["test_ce"] - r["train_loss"]) < 0.3 for r in rates) and said("0.3 nats")
        for a in rates:
            for b in rates:
                if a["test_ce"] < b["test_ce"] and a["train_loss"] > b["train_loss"]:
                    swapped.append((a["test_ce"], b["test_ce"]))
    assert all(b - a < 0.05 for a, b in swapped) and said("0.05 nats")
    assert [f"{x:.3f}" for x in swapped[0]] == [said("0.024"), said("0.030")] and len(swapped) == 1


def test_the_check_of_the_probe_at_width_128_and_the_jump_after_the_plateau():
    runs = _runs()
    top = runs[("ATTENTION", 128, RATES[3])]
    assert top["status"] == "done" and top["epochs_run"] == 16 and not top["early_stopped"]
    assert _pct(top["test_acc"]) == said("40.13")
    jump = {e["epoch"]: e["test_acc"] for e in runs[("ATTENTION", 128, RATES[2])]["epochs"]}
    assert [_pct(jump[e]) for e in (6, 7, 8)] == [said("49.52"), said("69.77"), said("99.75")]
    assert all(jump[e] < 0.30 for e in (1, 2))  # the probe ends before the jump
    cell = _record()["cells"]["ATTENTION w128 L64"]
    gap = cell["scores"][lr_sweep.lr_label(RATES[1])] - cell["scores"][lr_sweep.lr_label(RATES[0])]
    assert f"{100 * gap:.2f}" == said("0.22")


def test_the_step_times_beside_the_budgets():
    runs, budget = _runs(), {(r["model"], r["width"]): r for r in load("zoology-budget")["rows"] if r["seq_len"] == 64}
    for model, lr, step, estimate in (("ATTENTION", RATES[2], "0.72", "0.33"), ("MAMBA", RATES[3], "0.68", "0.86")):
        assert f"{runs[(model, 64, lr)]['seconds_per_step']:.2f}" == said(step)
        assert f"{budget[(model, 64)]['bf16_step_s']:.2f}" == said(estimate)


def test_the_frontier_draws_the_cells_with_a_final_accuracy():
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import readme_figures

    inputs = readme_figures.zoology_frontier_inputs({"zoology-l64": _record()})
    drawn = {k for k, c in inputs["cells"].items() if c["acc"] is not None}
    assert drawn == {k for k, c in _record()["cells"].items() if c.get("acc") is not None}
    assert {"ATTENTION w64 L64", "ATTENTION w128 L64", "MAMBA w64 L64"} <= drawn


def test_ssm_control_chose_the_same_rate_at_both_widths_and_stayed_on_the_plateau():
    for width, score, final, low, high, state in (
        (64, "21.52", "22.95", "22.56", "23.56", 256),
        (128, "24.29", "24.46", "24.41", "25.09", 512),
    ):
        cell = _record()["cells"][f"SSM_CONTROL w{width} L64"]
        scores = [cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES]
        assert cell["lr"] == RATES[2] and _pct(scores[2]) == said(score)
        assert max(s for i, s in enumerate(scores) if i != 2) < 0.081 and said("8.1%")
        assert cell["status"] == "done" and cell["epochs"] == 16 and _pct(cell["acc"]) == said(final)
        later = [e["test_acc"] for e in _runs()[("SSM_CONTROL", width, RATES[2])]["epochs"] if e["epoch"] >= 3]
        assert [_pct(min(later)), _pct(max(later))] == [said(low), said(high)] and max(later) < 0.26
        assert cell["state_bytes"] == state
    assert said("256 and 512 bytes of decoding state")


def test_j_no_direction_chose_the_same_rate_at_both_widths_and_stayed_on_the_plateau():
    for width, score, final, low, high in (
        (64, "14.16", "23.62", "22.55", "24.05"),
        (128, "23.34", "24.73", "24.68", "25.33"),
    ):
        cell = _record()["cells"][f"J_NO_DIRECTION w{width} L64"]
        scores = [cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES]
        assert cell["lr"] == RATES[2] and _pct(scores[2]) == said(score)
        assert max(s for i, s in enumerate(scores) if i != 2) < 0.055 and said("5.5%")
        assert cell["probe"]["by_test_ce"] == cell["probe"]["by_train_loss"] == cell["lr"]
        assert cell["status"] == "done" and cell["epochs"] == 16 and _pct(cell["acc"]) == said(final)
        later = [e["test_acc"] for e in _runs()[("J_NO_DIRECTION", width, RATES[2])]["epochs"] if e["epoch"] >= 4]
        assert [_pct(min(later)), _pct(max(later))] == [said(low), said(high)] and max(later) < 0.26


def test_asm_cm_learned_the_task_inside_its_probe_and_stopped_after_one_epoch():
    for width, final, state in ((64, "99.52", 33280), (128, "99.72", 33792)):
        cell = _record()["cells"][f"ASM_CM w{width} L64"]
        scores = [cell["scores"][lr_sweep.lr_label(lr)] for lr in RATES]
        assert sum(s > 0.98 for s in scores) == 3 and said("98%")
        assert cell["status"] == "done" and cell["lr"] == RATES[2] and cell["epochs"] == 1
        assert _pct(cell["acc"]) == said(final) and _runs()[("ASM_CM", width, RATES[2])]["early_stopped"]
        assert cell["state_bytes"] == state and said(f"{state:,}")
    assert _record()["cells"]["ASM_CM w128 L64"]["probe"]["by_train_loss"] == RATES[3]
    assert _pct(_runs()[("ASM_CM", 128, RATES[3])]["test_acc"]) == said("99.21")


def test_the_study_is_complete_and_its_wall_time_is_the_runs_sum():
    record = _record()
    assert record["provenance"]["complete"] and all(c["status"] == "done" for c in record["cells"].values())
    assert len(record["finished"]) == 48 and said("48 runs")
    hours = sum(r["wall_seconds"] for r in record["finished"]) / 3600
    past_probe = [e for lr in RATES[2:] for e in _runs()[("ATTENTION", 128, lr)]["epochs"] if e["epoch"] > 2]
    check = sum(e["train_seconds"] + e["eval_seconds"] for e in past_probe) / 3600  # the check's own epochs
    assert f"{hours:.1f}" == said("14.9") and f"{hours - check:.1f}" == said("14.0")
    hours_of = load("zoology-budget")["summary"]["hours_no_early_stop"]  # each cell at its faster dtype
    budget = hours_of["L256"]
    assert f"{hours_of['L64']:.1f}" == said("17.6")
    pace = (hours - check) / hours_of["L64"]
    assert f"{budget:.1f}" == said("73.2") and f"{budget * pace:.0f}" == said("58")
    params = {r["model"]: r["params"] for r in record["finished"]}
    assert min(p for m, p in params.items() if m in ("SSM_CONTROL", "J_NO_DIRECTION", "ASM_CM")) > 4e6
