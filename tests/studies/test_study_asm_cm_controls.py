"""The claims docs/results.md and docs/results-in-full.md make about ASM_CM's recall under controls at three seeds
(docs/studies/asm-cm-controls): at ten times the recipe's rates the specialised model recalls at
32,768 tokens in every seed and every control falls; at the recipe's rates nothing is recalled; ASM_CM trained on the
control alone recalls at 40 tokens only."""

from __future__ import annotations

from study_results import fmt, load, stated

LENGTHS = ("40", "512", "4096", "32768")
CONTROLS = {"memory_read_off", "memory_write_off", "pairs_unwritten", "keys_shuffled"}
said = stated("asm-cm-controls")


def _arms() -> dict:
    return {a["arm"]: a["runs"] for a in load("asm-cm-controls")["arms"]}


def test_every_run_is_read_at_every_length_and_under_every_control():
    arms = _arms()
    assert sorted(arms["x10"]) == sorted(arms["alone"]) == sorted(arms["recipe"]) == ["0", "1", "2"]
    for runs in arms.values():
        for run in runs.values():
            assert tuple(sorted(run["reads"], key=int)) == LENGTHS and set(run["controls"]) == CONTROLS


def test_at_ten_times_the_rates_asm_cm_recalls_at_32k_in_every_seed_and_its_controls_fall():
    for seed, run in _arms()["x10"].items():
        assert run["recall_pass"] and run["ce_after"] < run["ce_before"], seed
        assert all(run["reads"][L]["acc"] >= 0.99 for L in LENGTHS), seed
        assert run["reads"]["32768"]["first_acc"] >= 0.99, seed
        for name, c in run["controls"].items():
            assert c["verdict"] == "falls", (seed, name)
            assert all(
                float(said("1.1")) <= round(100 * c[L]["acc"], 1) <= float(said("2.4")) for L in ("40", "512", "4096")
            ), (seed, name)
        assert all(run["controls"]["keys_shuffled"][L]["bound_acc"] >= 0.996 for L in ("40", "512", "4096"))
    worst = min(run["reads"]["32768"]["acc"] for run in _arms()["x10"].values())
    assert fmt(100 * worst, 1) == said("99.1") and said("99.1-100%")


def test_at_the_recipes_rates_nothing_is_recalled():
    for seed, run in _arms()["recipe"].items():
        assert not run["recall_pass"], seed
        assert round(100 * max(r["acc"] for r in run["reads"].values()), 1) <= float(said("6.8")), seed  # level 35%
        assert all(c["verdict"].startswith("falls (uninformative") for c in run["controls"].values()), seed


def test_trained_on_the_control_alone_it_recalls_at_40_tokens_only():
    for seed, run in _arms()["alone"].items():
        assert run["reads"]["40"]["acc"] == 1.0, seed
        assert all(run["reads"][L]["acc"] <= 0.03 for L in ("512", "4096", "32768")), seed  # chance 1.56%
        assert all(c["verdict"] == "falls" and c["40"]["acc"] <= 0.02 for c in run["controls"].values()), seed


def test_the_seed_zero_base_reproduces_the_single_seed_study():
    base = load("asm-cm-controls")["base"]
    earlier = load("specialise-tiny")["base"]
    assert abs(base["0"]["val_ce"] - earlier["val_ce"]) < 1e-4 and fmt(base["0"]["val_ce"], 4) == said("1.9482")
