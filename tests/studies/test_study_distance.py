"""The distance MQAR protocol at preset tiny and the specialisation recipe
(docs/studies/distance-tiny, specialise-tiny)."""

from study_results import fmt, load, stated

DISTANCE = load("distance-tiny")
ENTRIES = {e["model"]: e for e in DISTANCE["entries"]}
CHANCE = DISTANCE["protocol"]["chance"]
SPECIALISE = load("specialise-tiny")
said = stated("distance-tiny", "specialise-tiny")


def test_the_fast_weight_memory_binds_and_the_others_do_not():
    asm = ENTRIES["ASM_CM"]
    solved = next(m for m in asm["milestones"] if m["acc"] >= 0.8)
    assert solved["step"] == int(said("250")) and f"{100 * solved['acc']:.0f}" == said("100")
    # no better than answering among the values not yet queried, without binding (35.0%)
    level = DISTANCE["protocol"]["elimination_guess"]
    assert fmt(100 * level, 0) == said("35")
    for model in ("J_NO_DIRECTION", "RESOLVENT", "MAMBA"):
        assert ENTRIES[model]["lengths"]["40"]["ci95"][0] <= level
    mamba = ENTRIES["MAMBA"]
    assert f"{100 * mamba['lengths']['40']['acc']:.0f}" == said("9") and mamba["milestones"][-1]["step"] == 1000
    for model in ("J_NO_DIRECTION", "RESOLVENT", "MAMBA"):
        assert all(ENTRIES[model]["lengths"][str(n)]["status"] == "not read" for n in (512, 4096, 32768))


def test_asm_cm_forgets_over_distance():
    at_512 = ENTRIES["ASM_CM"]["lengths"]["512"]
    assert at_512["ci95"][0] <= 2 * CHANCE
    assert (f"{100 * at_512['acc']:.0f}", fmt(100 * CHANCE, 1)) == (said("2"), said("1.6"))


def test_the_specialised_model_reads_at_every_length_with_one_state_size():
    reads = SPECIALISE["long_reads"]["lengths"]
    long = [reads[str(n)] for n in (512, 4096, 32768)]
    assert all(r["acc"] == long[0]["acc"] and r["state_bytes"] == long[0]["state_bytes"] for r in long)
    assert all(r["ci95"][0] >= 0.8 for r in long)
    assert (fmt(100 * long[0]["acc"], 1), fmt(long[0]["state_bytes"] / 1024, 1)) == (said("99.8"), said("46.5"))


def test_the_fast_rates_keep_the_language_model_and_the_recipe_s_rates_fail():
    fast, recipe = SPECIALISE["runs"]["rates_x10"], SPECIALISE["runs"]["recipe"]
    assert fast["passed"] and not recipe["passed"]
    assert (fmt(fast["language_ce"]["before"], 4), fmt(fast["language_ce"]["after"], 4)) == (
        said("1.9482"),
        said("1.9018"),
    )
    assert (fmt(100 * recipe["control"]["acc"], 1), fmt(recipe["language_ce"]["after"], 4)) == (
        said("5.4"),
        said("1.9202"),
    )
    assert (fast["memory_lr"], fast["backbone_lr"]) == (10 * recipe["memory_lr"], 10 * recipe["backbone_lr"])


def test_the_trained_runs_carry_their_curves():
    for entry in DISTANCE["entries"]:
        train = entry["curves"]["train"]
        assert 2 <= len(train["step"]) <= 64 and train["step"][-1] == DISTANCE["protocol"]["steps"]
