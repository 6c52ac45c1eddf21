"""The protocol at the seed's budget (each model at its swept rate) and its check at the full
budget (docs/studies/protocol-tiny, protocol-tiny-fullbudget): the promotion-gate verdicts."""

from study_results import fmt, gate_of, load, per_seed, stated

from drmlab.experiments.stats import mean_std

PROTOCOL = load("protocol-tiny")
MODELS = PROTOCOL["models"]
CHECK = load("protocol-tiny-fullbudget")
SWEEPS = {m: sw for part in CHECK["parts"].values() for m, sw in (part.get("lr_sweep") or {}).items()}
said = stated("protocol-tiny", "protocol-tiny-fullbudget")
PAIRED = {m: rec for part in CHECK["parts"].values() for m, rec in part["models"].items()}


def test_the_study_is_complete_at_the_seed_s_budget():
    assert PROTOCOL["complete"] and PROTOCOL["study"]["train"]["tokens"] == 5_005_312
    assert all(m["n_seeds"] == 3 for m in MODELS.values())


def test_tuned_j_no_direction_beats_j_on_3_of_3_seeds_promoted():
    g = gate_of(MODELS["J_NO_DIRECTION"], MODELS["J"])
    assert g["promoted"] and (g["wins"], g["n"]) == (3, 3) and fmt(g["gain"], 4) == said("0.0248")


def test_tuned_j_beats_ssm_control_on_2_of_3_seeds_promoted():
    g = gate_of(MODELS["J"], MODELS["SSM_CONTROL"])
    assert g["promoted"] and (g["wins"], g["n"]) == (2, 3) and fmt(g["gain"], 4) == said("0.0083")


def test_the_direct_control_ties_j_no_direction():
    g = gate_of(MODELS["J_DIRECT_CONTROL_MATCHED"], MODELS["J_NO_DIRECTION"])
    assert not g["promoted"] and not gate_of(MODELS["J_NO_DIRECTION"], MODELS["J_DIRECT_CONTROL_MATCHED"])["promoted"]
    assert fmt(-g["gain"], 4) == said("0.0003") and g["n"] - g["wins"] == 1


def test_the_direct_control_led_at_the_1m_and_2m_milestones():
    def milestone_mean(model: str) -> dict[int, float]:
        runs = [r for r in PROTOCOL["runs"] if r["model"] == model]
        marks = sorted({t for r in runs for t, _, _ in r["milestones"]})
        return {t: mean_std([b for r in runs for tt, _, b in r["milestones"] if tt == t])[0] for t in marks}

    control, no_direction = milestone_mean("J_DIRECT_CONTROL_MATCHED"), milestone_mean("J_NO_DIRECTION")
    assert len(control) == 2 and all(control[t] < no_direction[t] for t in control)
    speed = {
        m: mean_std([r["tokens_per_s"] for r in PROTOCOL["runs"] if r["model"] == m])[0]
        for m in ("J_DIRECT_CONTROL_MATCHED", "J_NO_DIRECTION")
    }
    assert speed["J_DIRECT_CONTROL_MATCHED"] < speed["J_NO_DIRECTION"]


def test_mamba_stays_far_ahead_on_every_seed_and_gpt2_last():
    g = gate_of(MODELS["MAMBA"], MODELS["J_NO_DIRECTION"])
    assert g["wins"] == g["n"] == 3 and fmt(g["gain"], 4) == said("0.2681")
    assert max(MODELS, key=lambda m: MODELS[m]["ce_mean"]) == "GPT2" and MODELS["GPT2"]["lr"] == 1e-3


def test_resolvent_ties_j_and_beats_ssm_control_at_the_edge_of_the_grid():
    g = gate_of(MODELS["RESOLVENT"], MODELS["J"])
    assert not g["promoted"] and g["wins"] == 2 and fmt(g["gain"], 4) == said("0.0007")
    assert MODELS["RESOLVENT"]["ce_mean"] < MODELS["SSM_CONTROL"]["ce_mean"]
    sweep = PROTOCOL["lr_sweep"]["RESOLVENT"]
    assert sweep["lr"] == 5e-4 and sweep["edge"] and sweep["edge_side"] == "low"


def test_every_drm_variant_chose_8e_3_inside_the_grid():
    for model in ("J", "J_NO_DIRECTION", "SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED"):
        assert PROTOCOL["lr_sweep"][model]["lr"] == 8e-3 and not PROTOCOL["lr_sweep"][model]["edge"]
    assert max(PROTOCOL["study"]["lr_grid"]) == 1.6e-2


def test_the_1m_sweep_chose_too_high_only_for_j_and_the_direct_control():
    changed = sorted(m for m, sw in SWEEPS.items() if sw["lr"] != MODELS[m]["lr"])
    assert changed == ["J", "J_DIRECT_CONTROL_MATCHED"]
    assert all(SWEEPS[m]["lr"] < MODELS[m]["lr"] for m in changed)
    assert sorted(PAIRED) == changed and all(PAIRED[m]["lr"] == SWEEPS[m]["lr"] for m in changed)


def test_resolvent_s_edge_is_closed():
    sweep = SWEEPS["RESOLVENT"]
    assert sweep["lr"] == MODELS["RESOLVENT"]["lr"] == 5e-4
    assert sweep["scores"]["0.00025"] > sweep["scores"]["0.0005"]


def test_the_verdicts_do_not_depend_on_the_rate_choice():
    j_full, j_protocol = PAIRED["J"], MODELS["J"]
    behind = gate_of(j_protocol, j_full)  # gain > 0: the full-budget rate ends behind
    assert behind["gain"] > 0 and fmt(behind["gain"], 4) == said("0.0020") and behind["n"] - behind["wins"] == 2
    stds = [mean_std(list(per_seed(r).values()))[1] for r in (j_full, j_protocol)]
    assert [fmt(s, 4) for s in stds] == [said("0.0049"), said("0.0151")]
    js = gate_of(j_full, MODELS["SSM_CONTROL"])
    assert js["promoted"] and js["wins"] == 2 and fmt(js["gain"], 4) == said("0.0063")
    nd = gate_of(MODELS["J_NO_DIRECTION"], j_full)
    assert nd["promoted"] and nd["wins"] == 3 and fmt(nd["gain"], 4) == said("0.0269")


def test_the_direct_control_at_its_full_budget_rate_still_ties_j_no_direction():
    full, at_protocol = PAIRED["J_DIRECT_CONTROL_MATCHED"], MODELS["J_DIRECT_CONTROL_MATCHED"]
    behind, tie = gate_of(at_protocol, full), gate_of(full, MODELS["J_NO_DIRECTION"])
    assert behind["gain"] > 0 and fmt(behind["gain"], 4) == said("0.0004")
    assert not tie["promoted"] and not gate_of(MODELS["J_NO_DIRECTION"], full)["promoted"]
    assert f"{tie['gain']:+.4f}" == said("-0.0006")


def test_the_runs_carry_curves_short_enough_to_commit():
    for run in PROTOCOL["runs"]:
        train, evals = run["curves"]["train"], run["curves"]["eval"]
        assert 2 <= len(train["step"]) <= 64 and len(train["loss"]) == len(train["tokens"]) == len(train["step"])
        assert train["tokens"][-1] == run["tokens"] and evals["tokens"][0] == 0


def test_drmlab_report_draws_the_committed_copy_without_its_runs(tmp_path):
    from study_results import STUDIES

    from drmlab.experiments.report import pages

    assert pages.directory_kind(STUDIES / "protocol-tiny") == "ablate"
    page = pages.write_report(STUDIES / "protocol-tiny", tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 and "Not drawn" not in page
