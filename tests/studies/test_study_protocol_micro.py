"""The protocol at preset micro (docs/studies/protocol-micro) and the verdicts across micro, tiny and small:
what docs/results.md, docs/results-in-full.md and the README say of them."""

from study_results import ROOT, fmt, gate_of, load, stated

from drmlab.experiments.ablate.scales import finished_models, verdicts

MICRO = load("protocol-micro")
TINY = load("protocol-tiny")
SMALL = load("protocol-small")
MODELS = MICRO["models"]
said = stated("protocol-micro")


def test_the_study_is_the_protocol_at_micro_in_float32():
    study = MICRO["study"]
    assert MICRO["complete"] and finished_models(MICRO) == list(study["models"])
    assert study["preset"] == "micro" and study["seeds"] == [1, 2, 3]
    assert study["train"]["tokens"] == TINY["study"]["train"]["tokens"] == 5_005_312
    assert not study["train"]["bf16"] and not study["train"]["compile"]
    # the preset differs in context and tokens per parameter as well as width, as the text says
    assert (study["train"]["seq_len"], study["train"]["batch_size"]) == (32, 8) and said("32-byte")
    assert all(190 < study["train"]["tokens"] / m["params"] < 240 for m in MODELS.values()) and said("200")


def test_the_order_at_micro_is_not_tiny_s():
    order = ["MAMBA", "GPT2", "SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED", "J_NO_DIRECTION", "J"]
    means = [MODELS[m]["bpb_mean"] for m in order]
    assert means == sorted(means)
    for model in order:
        said(fmt(MODELS[model]["bpb_mean"], 4))
    # no chosen rate sits at an edge of the grid
    grid = MICRO["study"]["lr_grid"]
    assert all(grid[0] < m["lr"] < grid[-1] for m in MODELS.values())


def test_seven_verdicts_hold_seven_flip_and_one_changes_across_the_three_presets():
    rows = verdicts({"micro": MICRO, "tiny": TINY, "small": SMALL})
    assert len(rows) == 15
    across = {(r["a"], r["b"]): r["across"] for r in rows}
    assert sorted(across.values()).count("holds") == 7 and said("seven")
    assert [pair for pair, v in across.items() if v == "changes"] == [("SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED")]
    flipped = {pair for pair, v in across.items() if v == "flips"}
    assert flipped == {
        ("J", "SSM_CONTROL"),
        ("J", "GPT2"),
        ("J_NO_DIRECTION", "SSM_CONTROL"),
        ("J_NO_DIRECTION", "J_DIRECT_CONTROL_MATCHED"),
        ("J_NO_DIRECTION", "GPT2"),
        ("SSM_CONTROL", "GPT2"),
        ("J_DIRECT_CONTROL_MATCHED", "GPT2"),
    }
    # MAMBA first at every preset
    assert all(across[pair] == "holds" for pair in across if "MAMBA" in pair)


def test_the_control_beats_the_drm_variants_at_micro_and_the_lead_grows_with_the_preset():
    for model, gain in (("J", "0.0606"), ("J_NO_DIRECTION", "0.0506")):
        g = gate_of(MODELS["SSM_CONTROL"], MODELS[model])
        assert g["promoted"] and (g["wins"], g["n"]) == (3, 3) and fmt(g["gain"], 4) == said(gain)
    for seed_gain in gate_of(MODELS["SSM_CONTROL"], MODELS["J"])["per_seed_gain"].values():
        said(fmt(seed_gain, 4))
    for model, quoted in (
        ("J", ("-0.0606", "+0.0083", "+0.0550")),
        ("J_NO_DIRECTION", ("-0.0506", "+0.0331", "+0.1053")),
    ):
        leads = [gate_of(r["models"][model], r["models"]["SSM_CONTROL"])["gain"] for r in (MICRO, TINY, SMALL)]
        assert leads == sorted(leads) and tuple(f"{x:+.4f}" for x in leads) == tuple(map(said, quoted))


def test_j_no_direction_beats_j_at_every_preset_by_a_gap_that_about_doubles():
    gains = []
    for record in (MICRO, TINY, SMALL):
        g = gate_of(record["models"]["J_NO_DIRECTION"], record["models"]["J"])
        assert g["promoted"] and (g["wins"], g["n"]) == (3, 3)
        gains.append(g["gain"])
    assert [fmt(x, 4) for x in gains] == [said("0.0100"), said("0.0248"), said("0.0502")]
    assert all(1.9 < b / a < 2.6 for a, b in zip(gains, gains[1:]))
    for seed_gain in gate_of(MODELS["J_NO_DIRECTION"], MODELS["J"])["per_seed_gain"].values():
        said(fmt(seed_gain, 4))


def test_gpt2_beats_every_drm_variant_at_micro_and_mamba_s_lead_over_j_no_direction_barely_moves():
    gains = [
        gate_of(MODELS["GPT2"], MODELS[m]) for m in ("J", "J_NO_DIRECTION", "SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED")
    ]
    assert all(g["promoted"] and g["wins"] == 3 for g in gains)
    assert (fmt(min(g["gain"] for g in gains), 4), fmt(max(g["gain"] for g in gains), 4)) == (
        said("0.1275"),
        said("0.1882"),
    )
    lead = [gate_of(r["models"]["MAMBA"], r["models"]["J_NO_DIRECTION"])["gain"] for r in (MICRO, TINY, SMALL)]
    assert max(lead) - min(lead) < 0.005 and fmt(lead[0], 4) == said("0.2648")
    over_gpt2 = [gate_of(r["models"]["MAMBA"], r["models"]["GPT2"])["gain"] for r in (MICRO, TINY, SMALL)]
    assert over_gpt2 == sorted(over_gpt2) and [fmt(x, 4) for x in over_gpt2] == list(
        map(said, ("0.0867", "0.5278", "0.7566"))
    )


def test_the_readme_quotes_the_micro_turn():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "SSM_CONTROL beats J by 0.0606 on 3 of 3 seeds and GPT2 beats every DRM variant" in readme
