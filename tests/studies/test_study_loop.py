"""The loop proofs and the loop study at preset tiny as docs/results.md and docs/results-in-full.md state them
(docs/studies/loop-proofs, loop-study-tiny)."""

import math

import pytest
from study_results import fmt, load, stated

from drmlab.experiments.stats import GATE_MAX_STD, GATE_MIN_GAIN

PROOFS = load("loop-proofs")
LOOP = load("loop-study-tiny")
ARMS = {a["arm"]: a for a in LOOP["arms"]}
COLUMNS = ("shared_eps1", "shared_scaled", "indep_eps1")
said = stated("loop-proofs", "loop-study-tiny")


def test_all_five_proofs_reproduce_the_printed_digits_and_are_confirmed():
    row = next(r for r in PROOFS["proof5"]["rows"] if r["n"] == 2)
    printed = PROOFS["study_printed"]["proof5_n2_row"]
    assert len(PROOFS["verdicts"]["defaults"]) == 5
    assert set(PROOFS["verdicts"]["defaults"].values()) == {said("CONFIRMED")}
    assert (
        [fmt(row[c], 3) for c in COLUMNS]
        == [fmt(printed[c], 3) for c in COLUMNS]
        == [said("1.596"), said("1.211"), said("1.426")]
    )


def test_without_the_scaling_every_proof_is_refuted():
    assert len(PROOFS["verdicts"]["remove_scaling"]) == 5
    assert set(PROOFS["verdicts"]["remove_scaling"].values()) == {said("REFUTED")}


def test_proof4_runs_in_13_to_17_seconds():
    seconds = [t["seconds"] for t in PROOFS["proof4_seconds"]]
    assert (f"{min(seconds):.0f}", f"{max(seconds):.0f}") == (said("13"), said("17"))
    assert PROOFS["study_printed"]["proof4_seconds"] == int(said("490"))


def test_the_committed_proof5_table_is_what_the_proof_computes():
    from drmlab.experiments.loop.proofs import proof5

    result = proof5()
    committed = PROOFS["proof5"]["rows"]
    # float64 to 1e-12, not bit for bit: numpy's vectorised exp and the BLAS differ in the last bit
    # between CPUs (AVX-512 or not); the committed digits came from one of them.
    assert [r["n"] for r in result.rows] == [r["n"] for r in committed]
    for got, want in zip(result.rows, committed):
        assert got == pytest.approx(want, rel=1e-12, abs=0), got["n"]
    assert result.verdict == PROOFS["verdicts"]["defaults"]["5"]


def test_every_arm_applies_12_blocks_per_token_in_49_steps():
    assert {a["stored_blocks"] * a["loops"] for a in LOOP["arms"]} == {12}
    p = LOOP["protocol"]
    assert (math.ceil(p["token_budget"] / p["tokens_per_step"]), p["tokens_per_step"]) == (int(said("49")), 8192)
    said("8,192")


def test_eps_1_over_n_beats_eps_1_at_n_12_on_every_seed():
    low, high = LOOP["per_seed_facts"]["I12_minus_I12u_per_seed_range"]
    gain = ARMS["I12u"]["ce_mean"] - ARMS["I12"]["ce_mean"]
    assert (low, high) == (said("0.23"), said("0.32")) and float(low) <= gain <= float(high)
    ref = LOOP["reference"]
    assert ref["ce_eps_1_over_N"] < ref["ce_eps_1"]
    assert (fmt(ref["ce_eps_1_over_N"], 4), fmt(ref["ce_eps_1"], 4)) == (said("4.7341"), said("4.8687"))


def test_at_n_2_the_scaled_arm_wins_2_of_3_seeds():
    wins = LOOP["per_seed_facts"]["C_wins_over_B"]
    assert (wins["wins"], wins["of"]) == (2, 3) and said("2 of 3 seeds")
    assert ARMS["C"]["ce_mean"] < ARMS["B"]["ce_mean"]


def test_no_arm_passes_the_promotion_gate():
    # an arm could pass only against an arm it beats by the gate's gain; each such arm's std is too high
    could_pass = [a for a in LOOP["arms"] if any(b["ce_mean"] - a["ce_mean"] >= GATE_MIN_GAIN for b in LOOP["arms"])]
    assert could_pass and all(a["ce_std"] > GATE_MAX_STD for a in could_pass)
    assert GATE_MAX_STD == float(said("0.03"))
