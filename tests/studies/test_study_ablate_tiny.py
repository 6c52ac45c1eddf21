"""The DRM ablation at preset tiny, its GPT-2 learning-rate probe and the cross-family comparison's
language-modelling side as docs/results.md and docs/results-in-full.md state them (docs/studies/ablate-tiny,
gpt2-lr-probe-tiny)."""

import math

from study_results import LN2, ce_mean, fmt, gate_of, load, per_seed, stated

from drmlab.experiments.stats import GATE_MIN_GAIN, mean_std

ABLATE = load("ablate-tiny")
MODELS = ABLATE["models"]
said = stated("ablate-tiny", "gpt2-lr-probe-tiny")


def test_the_budget_is_245_steps_of_8192_tokens_short_of_the_full_budget():
    p = ABLATE["protocol"]
    steps = math.ceil(p["token_budget"] / p["tokens_per_step"])
    assert (steps, p["tokens_per_step"], steps * p["tokens_per_step"]) == (245, 8192, 2_007_040)
    for value in (245, 8192, 2_007_040, 5_005_312):
        said(f"{value:,}")
    assert p["full_budget"] == 5_005_312 > steps * p["tokens_per_step"]
    assert p["lr"] == said("2e-3") and p["validation_megabytes"] == said("1.03")


def test_the_reference_ordering_at_125m():
    ref = ABLATE["reference_125m"]["ce_mean"]
    assert ref["J_NO_DIRECTION"] < ref["J"] < ref["SSM_CONTROL"]
    assert [fmt(ref[m], 4) for m in ("J", "SSM_CONTROL", "J_NO_DIRECTION")] == [
        said("1.7606"),
        said("1.8065"),
        said("1.7510"),
    ]


def test_j_no_direction_beats_j_on_all_three_seeds_promoted():
    g = gate_of(MODELS["J_NO_DIRECTION"], MODELS["J"])
    assert g["promoted"] and g["wins"] == g["n"] == 3
    assert fmt(g["gain"], 3) == said("0.037")


def test_the_metric_buys_nothing():
    difference = ce_mean(MODELS["J_NO_METRIC"]) - ce_mean(MODELS["J"])
    assert abs(difference) < GATE_MIN_GAIN and fmt(difference, 4) == said("-0.0014")


def test_j_loses_to_ssm_control_on_all_three_seeds():
    j, control = per_seed(MODELS["J"]), per_seed(MODELS["SSM_CONTROL"])
    assert len(j) == 3 and all(j[s] > control[s] for s in j)
    assert fmt(ce_mean(MODELS["J"]) - ce_mean(MODELS["SSM_CONTROL"]), 3) == said("0.031")


def test_the_gpt2_probe_puts_its_best_at_1e_3_still_behind_j_and_mamba():
    runs = load("gpt2-lr-probe-tiny")["runs"]
    best = min(runs, key=lambda r: r["ce"])
    assert best["lr"] == 1e-3
    assert [(r["lr"], fmt(r["ce"], 4)) for r in runs] == [
        (4e-3, said("2.6277")),
        (2e-3, said("2.4786")),
        (1e-3, said("2.2803")),
        (5e-4, said("2.3404")),
        (2.5e-4, said("2.4279")),
    ]
    mamba_nats = MODELS["MAMBA"]["bpb_mean"] * LN2
    assert fmt(ce_mean(MODELS["GPT2"]) - best["ce"], 1) == said("0.2")
    assert fmt(best["ce"] - ce_mean(MODELS["J"]), 1) == said("0.3")
    assert fmt(best["ce"] - mamba_nats, 2) == said("0.84")
    # the run at the preset's rate is GPT2's seed-1 run of the ablation
    assert next(r["ce"] for r in runs if r["lr"] == 2e-3) == per_seed(MODELS["GPT2"])[1]


def test_mamba_is_far_ahead_of_every_drm_variant():
    drm = {
        n: mean_std(list(per_seed(m).values()))[0] / LN2 if "ce_per_seed" in m else m["bpb_mean"]
        for n, m in MODELS.items()
        if n.startswith("J")
    }
    best = min(drm.values())
    lead = best - MODELS["MAMBA"]["bpb_mean"]
    assert lead > 0 and fmt(lead, 2) == said("0.73") and fmt(lead * LN2, 2) == said("0.51")


def test_the_protocol_values_agree_with_the_code():
    from drmlab.experiments.ablate.protocol import DEFAULT_TOKENS
    from drmlab.presets import PRESET_DEFAULTS

    tiny = PRESET_DEFAULTS["tiny"]
    p = ABLATE["protocol"]
    assert p["tokens_per_step"] == tiny["batch_size"] * tiny["grad_accum"] * tiny["seq_len"]
    assert float(p["lr"]) == tiny["lr"]
    assert p["full_budget"] == DEFAULT_TOKENS
