"""The protocol at preset small (docs/studies/protocol-small) and its verdicts beside preset tiny's: what
docs/results.md, docs/results-in-full.md and the README say of the pairs finished at both presets."""

from study_results import ROOT, fmt, gate_of, load, stated, study_text

from drmlab.experiments.ablate.scales import finished_models, verdicts

SMALL = load("protocol-small")
TINY = load("protocol-tiny")
MODELS = SMALL["models"]
said = stated("protocol-small")


def test_the_study_is_the_protocol_at_small_with_the_fast_setting():
    study = SMALL["study"]
    assert study["preset"] == "small" and study["train"]["tokens"] == 5_005_312 and study["seeds"] == [1, 2, 3]
    assert study["train"]["bf16"] and study["train"]["compile"]
    assert study["train"]["milestones"] == [1_000_000, 2_000_000]


def test_j_no_direction_beats_j_on_3_of_3_seeds_at_small_as_at_tiny():
    small = gate_of(MODELS["J_NO_DIRECTION"], MODELS["J"])
    tiny = gate_of(TINY["models"]["J_NO_DIRECTION"], TINY["models"]["J"])
    assert small["promoted"] and (small["wins"], small["n"]) == (3, 3) and fmt(small["gain"], 4) == said("0.0502")
    assert tiny["promoted"] and (tiny["wins"], tiny["n"]) == (3, 3) and fmt(tiny["gain"], 4) == said("0.0248")
    for gain in small["per_seed_gain"].values():
        said(fmt(gain, 4))
    assert 1.9 < small["gain"] / tiny["gain"] < 2.1 and said("doubles")


def test_the_scales_table_judges_only_the_pairs_finished_at_both_presets():
    done = finished_models(SMALL)
    assert {"J", "J_NO_DIRECTION"} <= set(done)
    rows = verdicts({"tiny": TINY, "small": SMALL})
    pair = next(r for r in rows if {r["a"], r["b"]} == {"J", "J_NO_DIRECTION"})
    assert pair["across"] == "holds"
    assert all(r["a"] in done and r["b"] in done for r in rows)
    waiting = [m for m in SMALL["study"]["models"] if m not in done]
    named = ", ".join(waiting[:-1]) + " and " + waiting[-1]
    assert f"wait for the third seed of {named}" in study_text("protocol-small")


def test_the_readme_quotes_the_small_verdict():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "J_NO_DIRECTION beats J by 0.0502 nats/byte on 3 of 3 seeds" in readme


def test_the_tie_with_the_direct_control_at_tiny_becomes_a_promotion_at_small():
    small = gate_of(MODELS["J_NO_DIRECTION"], MODELS["J_DIRECT_CONTROL_MATCHED"])
    tiny = gate_of(TINY["models"]["J_NO_DIRECTION"], TINY["models"]["J_DIRECT_CONTROL_MATCHED"])
    assert small["promoted"] and (small["wins"], small["n"]) == (3, 3) and fmt(small["gain"], 4) == said("0.0198")
    assert (
        not tiny["promoted"]
        and not gate_of(TINY["models"]["J_DIRECT_CONTROL_MATCHED"], TINY["models"]["J_NO_DIRECTION"])["promoted"]
    )
    over_j = gate_of(MODELS["J_DIRECT_CONTROL_MATCHED"], MODELS["J"])
    assert over_j["promoted"] and over_j["wins"] == 3 and fmt(over_j["gain"], 4) == said("0.0305")
