"""The claims docs/results.md and docs/results-in-full.md make about bf16 autocast at preset tiny
(docs/studies/bf16-tiny): the CE difference against float32 on paired seeds is inside the seed spread for every model,
and bf16 steps faster."""

from __future__ import annotations

from study_results import fmt, load, stated

from drmlab.experiments.stats import mean_std

MODELS = ("J", "J_NO_DIRECTION", "SSM_CONTROL", "MAMBA")
said = stated("bf16-tiny")


def test_bf16_is_inside_the_seed_spread_for_every_model():
    results = load("bf16-tiny")["models"]
    assert set(results) == set(MODELS)
    worst = []
    for name in MODELS:
        record = results[name]
        diffs = [record["bf16"]["per_seed"][s] - record["float32"]["per_seed"][s] for s in ("1", "2", "3")]
        mean_diff = sum(diffs) / 3
        spread = max(
            mean_std(list(record["float32"]["per_seed"].values()))[1],
            mean_std(list(record["bf16"]["per_seed"].values()))[1],
        )
        assert abs(mean_diff) < spread, (name, mean_diff, spread)
        assert abs(mean_diff) < 0.005 and max(abs(d) for d in diffs) < 0.011, (name, diffs)
        for run in ("float32", "bf16"):  # the table's mean +- std
            mean, std = mean_std(list(record[run]["per_seed"].values()))
            said(f"{fmt(mean, 4)} +- {fmt(std, 4)}")
        worst.append(abs(mean_diff))
    assert fmt(max(worst), 4) == said("0.0044")


def test_bf16_steps_faster_for_every_model_and_most_for_the_drm_variants():
    speed = load("bf16-tiny")["speed"]["ms_per_step"]
    assert all(speed[m]["bf16"] < speed[m]["float32"] for m in MODELS)
    assert speed["J"]["speedup"] >= 1.5 and speed["J_NO_DIRECTION"]["speedup"] >= 1.5
    assert speed["SSM_CONTROL"]["speedup"] < 1.2  # its scan stays float32
    for m in MODELS:
        said(f"{speed[m]['float32']:,.0f} / {speed[m]['bf16']:,.0f} ({speed[m]['speedup']:.2f}x)")


def test_the_memory_products_in_bf16_are_inside_the_seed_spread_and_faster():
    """docs/studies/fast-memory-tiny: SSM_CONTROL under --fast with and without memory_products_in_autocast."""
    said_fm = stated("fast-memory-tiny")
    record = load("fast-memory-tiny")
    arms = record["arms"]
    ce = {arm: [arms[arm]["per_seed"][s]["val_ce"] for s in ("1", "2", "3")] for arm in arms}
    diffs = [a - b for a, b in zip(ce["memory_bf16"], ce["memory_float32"])]
    spread = max(mean_std(ce["memory_bf16"])[1], mean_std(ce["memory_float32"])[1])
    mean_diff = sum(diffs) / 3
    assert abs(mean_diff) < spread
    assert [said_fm(f"{d:+.4f}") for d in diffs] == ["+0.0093", "-0.0114", "-0.0049"]
    assert fmt(mean_diff, 4) == said_fm("-0.0023")
    for arm in ("memory_bf16", "memory_float32"):
        mean, std = mean_std(ce[arm])
        said_fm(f"{fmt(mean, 4)} +- {fmt(std, 4)}")
    float32 = list(record["protocol_tiny_float32"]["per_seed"].values())
    said_fm("{} +- {}".format(*(fmt(v, 4) for v in mean_std(float32))))
    speed = {arm: arms[arm]["tokens_per_s_mean"] for arm in arms}
    assert speed["memory_bf16"] > 1.1 * speed["memory_float32"]
    assert (f"{speed['memory_bf16']:,.0f}", f"{speed['memory_float32']:,.0f}") == (said_fm("29,350"), said_fm("23,832"))
