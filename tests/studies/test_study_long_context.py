"""The long-context study at tiny (docs/studies/long-context-tiny; docs/results.md section 13): what its text
says of loss by position past the 256-byte window and of the carried state, computed from the record."""

import math

from study_results import fmt, load, stated

said = stated("long-context-tiny")
RECURRENT = ("J", "J_NO_DIRECTION", "SSM_CONTROL", "MAMBA")


def _bucket(entry: dict, lo: int) -> dict:
    return next(b for b in entry["by_position"]["buckets"] if b["lo"] == lo)


def test_the_study_is_complete_over_the_seven_models_of_the_field_protocol_at_seed_one():
    study = load("long-context-tiny")
    assert study["complete"] and set(study["models"]) == {*RECURRENT, "GPT2", "RESOLVENT", "LLAMA"}
    for model, entry in study["models"].items():
        assert entry["windowed"]["seq_len"] == 256 and entry["by_position"]["seq_len"] == 4096, model
        assert entry["carried"]["context"] == ("carried" if model in RECURRENT else "windows"), model


def test_past_the_window_the_recurrent_models_rise_by_hundredths_and_the_rotary_transformer_does_not_hold():
    models = load("long-context-tiny")["models"]
    rise = {m: _bucket(e, 2048)["ce"] - _bucket(e, 128)["ce"] for m, e in models.items() if m != "GPT2"}
    assert {m: models[m]["derived"]["past_window"] for m in rise} == rise
    assert [fmt(rise[m], 4) for m in RECURRENT] == [said("0.0079"), said("0.0186"), said("0.0206"), said("0.0131")]
    assert max(rise[m] for m in RECURRENT) < 0.025 and fmt(rise["RESOLVENT"], 4) == said("0.0178")
    llama = models["LLAMA"]
    assert fmt(rise["LLAMA"], 4) == said("2.2697") and rise["LLAMA"] > 1
    assert (fmt(_bucket(llama, 128)["ce"], 3), fmt(_bucket(llama, 2048)["ce"], 3)) == (said("1.365"), said("3.635"))
    assert (fmt(llama["by_position"]["bpb"], 4), fmt(llama["windowed"]["bpb"], 4)) == (said("4.7180"), said("2.0222"))
    # GPT2's position table holds 256 rows: nothing past it is scored
    assert all(b["ce"] == "n/a" for b in models["GPT2"]["by_position"]["buckets"] if b["lo"] >= 256)
    for m in RECURRENT:  # the lowest bucket lies within the first 64 positions
        assert models[m]["derived"]["lowest"]["hi"] <= 64


def test_carrying_the_state_gains_what_the_text_says_and_attention_gains_nothing():
    models = load("long-context-tiny")["models"]
    gain = {m: e["windowed"]["ce"] - e["carried"]["ce"] for m, e in models.items()}
    assert {m: models[m]["derived"]["carried_gain"] for m in gain} == gain
    bits = [fmt(gain[m] / math.log(2), 4) for m in RECURRENT]
    assert bits == [said("0.0117"), said("0.0119"), said("0.0090"), said("0.0294")]
    assert max(gain, key=gain.get) == "MAMBA" and all(abs(gain[m]) < 1e-3 for m in ("GPT2", "RESOLVENT", "LLAMA"))
    for m in RECURRENT:  # the 4,096-byte windows come within a thousandth of a nat of the carried state
        assert abs(models[m]["by_position"]["ce"] - models[m]["carried"]["ce"]) < 1e-3
