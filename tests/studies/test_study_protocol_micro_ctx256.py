"""Micro at tiny's 256-byte window (docs/studies/protocol-micro-ctx256), the micro confound of docs/drm.md A.7.3:
what docs/results-in-full.md says of it and of the window readings against micro and tiny."""

from study_results import fmt, load, stated

from drmlab.experiments.ablate.scales import WINDOW_READINGS, finished_models, window_readings

MICRO = load("protocol-micro")
LONG = load("protocol-micro-ctx256")
TINY = load("protocol-tiny")
said = stated("protocol-micro-ctx256")


def test_the_study_is_micro_with_tiny_s_window_and_what_moves_with_it_is_said():
    study, micro = LONG["study"], MICRO["study"]
    assert study["preset"] == "micro" and study["seeds"] == micro["seeds"] and study["models"] == micro["models"]
    assert study["train"]["seq_len"] == TINY["study"]["train"]["seq_len"] == 256 and said("256-byte")
    assert study["train"]["batch_size"] == micro["train"]["batch_size"] == 8
    assert {k: v for k, v in study["train"].items() if k not in ("seq_len", "milestones")} == {
        k: v for k, v in micro["train"].items() if k not in ("seq_len", "milestones")
    }  # only the window moved (and the milestones, the same tokens)
    per_step = study["train"]["batch_size"] * study["train"]["seq_len"]
    assert per_step == 2048 and said("2,048") and said(f"{study['train']['tokens'] // per_step:,}")
    assert said(f"{study['train']['tokens'] // (micro['train']['batch_size'] * micro['train']['seq_len']):,}")
    assert study["model_overrides"] == {"GPT2": {"n_positions": 256}}
    for model, m in LONG["models"].items():  # only GPT2's size depends on the window
        if model == "GPT2":
            grown = m["params"] - MICRO["models"][model]["params"]
            assert said(f"{m['params']:,}") and said(f"{MICRO['models'][model]['params']:,}") and said(f"{grown:,}")
        else:
            assert m["params"] == MICRO["models"][model]["params"]


def test_the_order_and_the_sweep_that_grew_at_its_top():
    study = LONG["study"]
    assert LONG["complete"] and finished_models(LONG) == list(study["models"])
    order = ["MAMBA", "SSM_CONTROL", "J", "GPT2", "J_DIRECT_CONTROL_MATCHED", "J_NO_DIRECTION"]
    means = [LONG["models"][m]["bpb_mean"] for m in order]
    assert means == sorted(means)
    for model in order:
        said(fmt(LONG["models"][model]["bpb_mean"], 4))
    grid = study["lr_grid"]
    assert grid == [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2] and said("3.2e-2 and 6.4e-2 were added")
    assert all(grid[0] < m["lr"] < grid[-1] for m in LONG["models"].values()) and said("No chosen rate is at an edge")
    # the four that chose the old grid's top rate, 1.6e-2: with its scores alone each picks it
    for model in ("J", "J_NO_DIRECTION", "SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED"):
        first = {float(k): v for k, v in LONG["lr_sweep"][model]["scores"].items() if float(k) <= 1.6e-2}
        assert min(first, key=first.get) == 1.6e-2, model


def _readings() -> dict[tuple[str, str], dict]:
    return {(r["a"], r["b"]): r for r in window_readings(MICRO, LONG, TINY)}


def test_the_window_turns_gpt2_s_verdicts_but_not_the_drm_s_against_its_control():
    rows = _readings()
    assert len(rows) == 15
    readings = [r["reading"] for r in rows.values()]
    assert {key: readings.count(key) for key in WINDOW_READINGS} == {
        "same": 7, "window": 3, "not the window": 2, "neither": 3
    }  # fmt: skip
    assert said("three") and said("two") and said("seven")
    window = {pair for pair, r in rows.items() if r["reading"] == "window"}
    assert window == {("J", "GPT2"), ("SSM_CONTROL", "GPT2"), ("J_NO_DIRECTION", "J_DIRECT_CONTROL_MATCHED")}
    for a in ("J", "SSM_CONTROL"):  # now beat GPT2, 3 of 3 each, at the longer window
        v = rows[a, "GPT2"]["long"]
        assert v["winner"] == "A" and v["wins"] == v["n"] == 3 and said(fmt(v["gain"], 4))
    kept = {pair for pair, r in rows.items() if r["reading"] == "not the window"}
    assert kept == {("J", "SSM_CONTROL"), ("J_NO_DIRECTION", "SSM_CONTROL")}
    for pair in kept:  # SSM_CONTROL still wins at micro's width with tiny's window
        v = rows[pair]["long"]
        assert v["winner"] == "B" and v["wins"] == 0 and v["n"] == 3 and said(fmt(-v["gain"], 4))
    third = rows["SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED"]["long"]
    assert third["winner"] == "A" and third["wins"] == 3 and said(fmt(third["gain"], 4))
    order = sorted(LONG["models"], key=lambda m: LONG["models"][m]["bpb_mean"])
    micro_order = sorted(MICRO["models"], key=lambda m: MICRO["models"][m]["bpb_mean"])
    assert (micro_order.index("GPT2"), order.index("GPT2")) == (1, 3) and said("from second to fourth")


def test_two_pairs_the_presets_agree_on_turn_at_the_longer_window():
    rows = _readings()
    for b, wins in (("J_NO_DIRECTION", 3), ("J_DIRECT_CONTROL_MATCHED", 2)):
        r = rows["J", b]
        assert r["reading"] == "same" and r["short"]["winner"] == r["larger"]["winner"] == "B"
        assert r["long"]["winner"] == "A" and r["long"]["wins"] == wins and said(fmt(r["long"]["gain"], 4))
