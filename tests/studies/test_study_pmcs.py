"""The claims docs/results.md and docs/results-in-full.md make about upstream's PMCS-64 comparison at preset tiny
(docs/studies/pmcs-tiny, docs/variable-rank.md section 11): on language, ASM_VR_S at full rank beats ASM_CM on every
paired seed by about the margin upstream reports; ASM_CM, trained from scratch and then specialised by the interleaved
recipe, recalls over distance where the arms without an addressable memory do not, and its controls fall."""

from __future__ import annotations

import math

from study_results import fmt, load, stated

from drmlab.experiments.stats import gate

said = stated("pmcs-tiny")


def _arms() -> dict:
    return {a["arm"]: a for a in load("pmcs-tiny")["arms"]}


def _ce(arm: dict) -> dict[int, float]:
    return {int(s): v for s, v in arm["language"]["per_seed"].items()}


def test_every_arm_has_three_paired_seeds_and_upstreams_parameter_match():
    arms = _arms()
    assert set(arms) == {"ASM_CM", "ASM_VR_S full", "ASM_VR_S fixed 64", "ASM_VR_R full", "J_NO_DIRECTION"}
    assert all(sorted(_ce(a)) == [17, 29, 43] for a in arms.values())
    cm, vrs = arms["ASM_CM"]["params"], arms["ASM_VR_S full"]["params"]
    assert abs(vrs - cm) / cm < 0.001  # VR-S is width-matched to ASM_CM (upstream: within 77 of 274,058)
    assert arms["ASM_VR_S fixed 64"]["overrides"] == {"rank_policy": "fixed", "rank_fixed": 64}


def test_vr_s_full_beats_asm_cm_on_language_on_every_seed_by_upstreams_margin():
    arms = _arms()
    vrs, cm = _ce(arms["ASM_VR_S full"]), _ce(arms["ASM_CM"])
    verdict = gate(vrs, cm)
    assert verdict["promoted"] and verdict["wins"] == 3
    assert 0.02 < verdict["gain"] < 0.045 and fmt(verdict["gain"], 3) == said("0.033")  # upstream: 0.0321
    assert said("0.032") and said("2.5489") and said("2.5168")
    assert fmt(arms["ASM_VR_S full"]["language"]["ce_mean"], 4) == said("2.1770")
    assert fmt(arms["ASM_CM"]["language"]["ce_mean"], 4) == said("2.2096")


def test_only_asm_cm_recalls_after_the_interleaved_recipe_and_its_controls_fall():
    arms = _arms()
    cm = arms["ASM_CM"]["specialised"]
    assert sorted(cm) == ["17", "29", "43"]  # every seed, where upstream's recalled at 32K in 1 of 3
    assert all(r["reads"][L]["acc"] >= 0.99 for r in cm.values() for L in ("40", "512", "4096", "32768"))
    assert all(round(100 * r["reads"]["32768"]["acc"], 1) == 100.0 for r in cm.values())
    first_at_40 = []
    for name, arm in arms.items():
        assert sorted(arm["specialised"]) == ["17", "29", "43"], name  # every arm read at every seed
        for seed, r in arm["specialised"].items():
            assert r["ce_after"] < r["ce_before"], (name, seed)  # its language steps train on
            if name != "ASM_CM":
                reads = r["reads"]
                assert round(100 * max(x["acc"] for x in reads.values()), 1) <= float(said("9.1")), (
                    name,
                    seed,
                )  # level 35%
                assert max(reads[L]["first_acc"] for L in ("512", "4096", "32768")) <= 0.103, (name, seed)
                if name in ("ASM_VR_R full", "J_NO_DIRECTION"):
                    first_at_40.append(reads["40"]["first_acc"])
    assert (round(100 * min(first_at_40), 1), round(100 * max(first_at_40), 1)) == (
        float(said("14.8")),
        float(said("20.3")),
    )  # level 13.87%
    said("13.87%")
    for seed, r in cm.items():
        controls = r["controls"]
        assert set(controls) == {"memory_read_off", "pairs_unwritten", "keys_shuffled"}
        for name, c in controls.items():
            assert c["verdict"] == "falls", (seed, name)
            assert all(round(100 * c[L]["acc"], 1) <= float(said("2.4")) for L in ("40", "512", "4096")), (
                seed,
                name,
            )  # chance 1.56%
        assert all(controls["keys_shuffled"][L]["bound_acc"] >= 0.999 for L in ("40", "512", "4096"))


def test_three_specialisations_start_from_language_runs_trained_again():
    """Their CE is within 0.0011 nats of the language leg's run of that arm and seed (another CPU)."""
    again = {
        (name, seed): r["base_retrained"]
        for name, arm in _arms().items()
        for seed, r in arm["specialised"].items()
        if "base_retrained" in r
    }
    assert sorted(again) == [("ASM_VR_R full", "43"), ("J_NO_DIRECTION", "29"), ("J_NO_DIRECTION", "43")]
    for (name, seed), b in again.items():
        assert b["language_leg_ce"] == _arms()[name]["language"]["per_seed"][seed]
        assert math.isclose(b["ce"], b["language_leg_ce"] + b["difference"], rel_tol=0, abs_tol=1e-12)
        assert 0 < abs(b["difference"]) <= float(said("0.0011"))


def test_the_training_rate_gap_is_small_on_the_cpu():
    arms = _arms()
    ratio = arms["ASM_VR_S full"]["language"]["tokens_per_s"] / arms["ASM_CM"]["language"]["tokens_per_s"]
    assert fmt(ratio, 2) == said("1.28") and said("18.5")  # upstream: 168,127 / 9,070 on its GPU
