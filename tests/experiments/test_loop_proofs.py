"""Tests of drmlab.experiments.loop.proofs: the five looped-residual proofs.

Proofs 1, 2, 3 and 5 are pinned at their default sizes (each runs in about a second) against the
numbers the original scripts printed (``docs/looped.md`` section 7; proof 5 also against the
original script). Proof 4's full learning-rate grid costs ~10-15 s of CPU, so its verdict is
pinned on a reduced grid (N in 1, 8; LR in 0.3, 1, 3) plus single grid cells of the original
table; the full table runs when DRMLAB_SLOW_TESTS=1. Every planted negative removes the
loop-aware scaling (``scaled=False``: every ε = 1) and must come out REFUTED.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from drmlab.experiments.loop import proofs as lp
from drmlab.experiments.loop.proofs.common import openblas_controls

# ------------------------------------------------------------------ the original printed numbers

P1 = [  # N, shared/N, indep/N, shared/N^2
    (4, 2.180, 0.488, 0.5450),
    (8, 4.066, 0.491, 0.5083),
    (16, 9.656, 0.565, 0.6035),
    (32, 16.545, 0.462, 0.5170),
    (64, 45.322, 0.530, 0.7082),
    (128, 76.432, 0.508, 0.5971),
]
P2_COS = [(2, 0.9905, 0.9468), (4, 0.9915, 0.9601), (8, 0.9927, 0.9591)]
P2_R = [  # N, schedule, R eps=1 (3 significant digits), R scaled
    (2, "layer", 2.72e1, 1.165),
    (2, "model", 1.39e1, 1.159),
    (4, "layer", 1.27e4, 1.355),
    (4, "model", 3.53e2, 1.167),
    (8, "layer", 2.28e9, 1.286),
    (8, "model", 1.43e5, 1.269),
]
P3_NORM = [(2, 3.48, 2.46, 1.207), (4, 6.77, 3.59, 1.235), (8, 13.58, 5.23, 1.202), (16, 26.68, 7.21, 1.307)]
P3_AMP = [(2, 0.0133, 0.0061), (4, 0.0164, 0.0061), (8, 0.0180, 0.0060)]
P4 = {  # (N, mode) -> seven losses (None = div)
    (1, "unscaled"): [0.0325, 0.0321, 0.0246, 0.0177, 0.0077, 0.0015, 0.0001],
    (1, "scaled"): [0.0325, 0.0321, 0.0246, 0.0177, 0.0077, 0.0015, 0.0001],
    (2, "unscaled"): [0.0422, 0.0360, 0.0215, 0.0114, 0.0037, 0.0007, 0.0000],
    (2, "scaled"): [0.0322, 0.0319, 0.0243, 0.0177, 0.0083, 0.0019, 0.0002],
    (4, "unscaled"): [0.0636, 0.0310, 0.0118, 0.0049, 0.0014, 0.0003, 0.0000],
    (4, "scaled"): [0.0321, 0.0319, 0.0241, 0.0177, 0.0085, 0.0020, 0.0003],
    (8, "unscaled"): [0.0344, 0.0133, 0.0063, 0.0026, 0.0012, None, None],
    (8, "scaled"): [0.0321, 0.0319, 0.0241, 0.0177, 0.0086, 0.0021, 0.0003],
}
P5 = [(2, 1.596, 1.211, 1.426), (4, 2.503, 1.213, 1.823), (8, 4.672, 1.216, 2.369), (16, 9.335, 1.218, 3.156)]

P4_REDUCED = dict(ns=(1, 8), lrs=(0.3, 1.0, 3.0))


def _fmt(x: float, spec: str) -> str:
    return format(x, spec)


# ------------------------------------------------------------------ proofs at their defaults


def test_proof1_defaults_reproduce_original_and_confirm():
    res = lp.proof1()
    got = [
        (r["n"], _fmt(r["shared_over_n"], ".3f"), _fmt(r["indep_over_n"], ".3f"), _fmt(r["shared_over_n2"], ".4f"))
        for r in res.rows
    ]
    want = [(n, _fmt(a, ".3f"), _fmt(b, ".3f"), _fmt(c, ".4f")) for n, a, b, c in P1]
    assert got == want
    assert res.verdict == lp.CONFIRMED


def test_proof2_defaults_reproduce_original_and_confirm():
    res = lp.proof2()
    rows = {r["n"]: r for r in res.rows}
    assert [(n, _fmt(rows[n]["cos_layer"], ".4f"), _fmt(rows[n]["cos_model"], ".4f")) for n, *_ in P2_COS] == [
        (n, _fmt(a, ".4f"), _fmt(b, ".4f")) for n, a, b in P2_COS
    ]
    for n, kind, r1, rs in P2_R:
        assert _fmt(rows[n][f"R_{kind}_eps1"], ".2e") == _fmt(r1, ".2e")
        assert _fmt(rows[n][f"R_{kind}_scaled"], ".3f") == _fmt(rs, ".3f")
    assert res.verdict == lp.CONFIRMED


def test_proof3_defaults_reproduce_original_and_confirm():
    res = lp.proof3()
    rows = {r["n"]: r for r in res.rows}
    for n, sh, ind, sc in P3_NORM:
        assert (
            _fmt(rows[n]["shared_eps1"], ".2f"),
            _fmt(rows[n]["indep_eps1"], ".2f"),
            _fmt(rows[n]["shared_scaled"], ".3f"),
        ) == (_fmt(sh, ".2f"), _fmt(ind, ".2f"), _fmt(sc, ".3f"))
    for n, a1, asc in P3_AMP:
        assert (_fmt(rows[n]["amp_eps1"], ".4f"), _fmt(rows[n]["amp_scaled"], ".4f")) == (
            _fmt(a1, ".4f"),
            _fmt(asc, ".4f"),
        )
    assert rows[16]["amp_eps1"] is None and rows[16]["amp_scaled"] is None
    assert res.verdict == lp.CONFIRMED


def test_proof5_defaults_print_the_seed_numbers_and_confirm():
    res = lp.proof5()
    got = [(r["n"], *(_fmt(r[k], ".3f") for k in ("shared_eps1", "shared_scaled", "indep_eps1"))) for r in res.rows]
    assert got == [(n, *(_fmt(v, ".3f") for v in vals)) for n, *vals in P5]
    assert "   2         1.596           1.211        1.426" in res.text
    assert res.stats["shared_ratio"] == pytest.approx(5.85, abs=0.005)
    assert res.stats["indep_ratio"] == pytest.approx(2.21, abs=0.005)
    assert res.verdict == lp.CONFIRMED


# ------------------------------------------------------------------ planted negatives


@pytest.mark.parametrize(
    "number, failing",
    [
        (1, ["shared_slope_near_2", "indep_slope_near_1"]),
        (2, ["scaled_R_bounded"]),
        (3, ["scaled_flat", "scaled_amp_smaller"]),
        (5, ["scaled_flat"]),
    ],
)
def test_planted_negative_without_scaling_is_refuted(number, failing):
    res = lp.run_proof(number, scaled=False)
    assert res.verdict == lp.REFUTED
    for name in failing:
        assert res.checks[name] is False, (name, res.checks)
    assert res.params["scaled"] is False


def test_criteria_are_not_trivially_met_by_a_smaller_n_range():
    # Proof 5's ratio test needs N_max/N_min >= 8: with N in 2..8 linear growth is x4 and
    # sqrt growth x2, so "shared ratio / indep ratio > 2" cannot be met even with scaling on.
    res = lp.proof5(ns=(2, 4, 8), d=64, seq_len=16, repeats=1)
    assert res.verdict == lp.REFUTED
    assert res.checks["scaled_flat"] is True


# ------------------------------------------------------------------ proof 4


def _reference_train(X, Y, W, P, lr, eps, n_loop, steps):
    """Proof 4's GD written out plainly from the spec (no buffers), to check the fast one."""
    W, P = W.copy(), P.copy()
    loss = None
    for _ in range(steps):
        hs = [X]
        for _k in range(n_loop):
            hs.append(hs[-1] + eps * np.tanh(hs[-1] @ W.T))
        e = hs[-1] @ P.T - Y
        loss = float(np.mean(e**2))
        if not np.isfinite(loss) or loss > 1e6:
            return None
        gP = (2 / Y.size) * e.T @ hs[-1]
        g = (2 / Y.size) * e @ P
        gW = np.zeros_like(W)
        for k in range(n_loop - 1, -1, -1):
            v = eps * g * (1 - np.tanh(hs[k] @ W.T) ** 2)
            gW += v.T @ hs[k]
            g = g + v @ W
        W = W - lr * gW
        P = P - lr * gP
    return loss


def test_proof4_trainer_matches_plain_reference():
    X, Y = lp.lr_teacher_data(5, n_samples=32, d=16, d_out=4)
    ((W0, P0),) = lp.lr_student_inits(7, 1, d=16, d_out=4)
    for lr, eps, n in ((0.3, 1.0, 3), (1.0, 1 / 3, 3), (30.0, 1.0, 4)):
        fast = lp.train_looped_student(X, Y, W0, P0, lr, eps, n, 40)
        ref = _reference_train(X, Y, W0, P0, lr, eps, n, 40)
        if ref is None:
            assert fast is None
        else:
            assert fast == pytest.approx(ref, rel=1e-10, abs=1e-15)
    # the diverging case really diverges, so the "div" path is exercised
    assert lp.train_looped_student(X, Y, W0, P0, 300.0, 1.0, 4, 40) is None


@pytest.mark.parametrize("n, mode, idx", [(8, "unscaled", 4), (8, "unscaled", 5), (2, "scaled", 6), (4, "unscaled", 0)])
def test_proof4_single_cells_of_the_original_grid(n, mode, idx):
    X, Y = lp.lr_teacher_data()
    W0, P0 = lp.lr_student_inits(42, 7)[idx]
    eps = 1.0 / n if mode == "scaled" else 1.0
    loss = lp.train_looped_student(X, Y, W0, P0, lp.LR_GRID[idx], eps, n, 300)
    want = P4[(n, mode)][idx]
    if want is None:
        assert loss is None
    else:
        assert loss is not None and _fmt(loss, ".4f") == _fmt(want, ".4f")


def test_proof4_reduced_grid_confirms():
    # The planted negative on this grid runs through the CLI in test_cli_set_and_remove_scaling.
    res = lp.proof4(**P4_REDUCED)
    assert res.verdict == lp.CONFIRMED
    assert res.stats["optima"] == {"unscaled": [3.0, 0.3], "scaled": [3.0, 3.0]}


@pytest.mark.skipif(
    not os.environ.get("DRMLAB_SLOW_TESTS"), reason="full proof-4 grid (~10-15 s CPU); set DRMLAB_SLOW_TESTS=1"
)
def test_proof4_full_grid_reproduces_original():
    res = lp.proof4()
    for row in res.rows:
        for mode in ("unscaled", "scaled"):
            got = [None if v is None else _fmt(v, ".4f") for v in row[f"loss_{mode}"]]
            want = [None if v is None else _fmt(v, ".4f") for v in P4[(row["n"], mode)]]
            assert got == want, (row["n"], mode)
    assert res.stats["optima"] == {"unscaled": [3.0, 3.0, 3.0, 0.3], "scaled": [3.0, 3.0, 3.0, 3.0]}
    assert res.verdict == lp.CONFIRMED


# ------------------------------------------------------------------ CLI, JSON, plot


def _check_schema(obj, number):
    assert obj["proof"] == number
    assert obj["verdict"] in ("CONFIRMED", "REFUTED")
    assert obj["rows"] and isinstance(obj["rows"], list)
    for row in obj["rows"]:
        assert isinstance(row["n"], int)
        assert set(row) == {"n", *obj["arms"]}
    assert set(obj["checks"]) and all(isinstance(v, bool) for v in obj["checks"].values())


def test_cli_proof5_json_and_plot(tmp_path, capsys):
    from drmlab.cli import main

    out, png = tmp_path / "out.json", tmp_path / "p5.png"
    assert main(["proofs", "5", "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "   2         1.596           1.211        1.426" in printed
    assert "verdict: CONFIRMED" in printed
    obj = json.loads(out.read_text())
    _check_schema(obj, 5)
    assert obj["verdict"] == "CONFIRMED"
    assert [r["n"] for r in obj["rows"]] == [2, 4, 8, 16]
    assert set(obj["rows"][0]) == {"n", "shared_eps1", "shared_scaled", "indep_eps1"}
    assert round(obj["rows"][0]["shared_eps1"], 3) == 1.596
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_several_proofs_json_is_keyed_by_number(tmp_path):
    from drmlab.cli import main

    out, png = tmp_path / "many.json", tmp_path / "many.png"
    assert main(["proofs", "1", "2", "--d", "64", "--json", str(out), "--plot", str(png)]) == 0
    obj = json.loads(out.read_text())
    assert set(obj) == {"1", "2"}
    _check_schema(obj["1"], 1)
    _check_schema(obj["2"], 2)
    assert obj["1"]["params"]["d"] == 64
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_set_and_remove_scaling(tmp_path):
    from drmlab.cli import main

    out = tmp_path / "p4.json"
    argv = ["proofs", "4", "--set", "ns=1,8", "--set", "lrs=0.3,1,3", "--json", str(out)]
    assert main(argv + ["--remove-scaling"]) == 0
    obj = json.loads(out.read_text())
    _check_schema(obj, 4)
    assert obj["verdict"] == "REFUTED"  # proof 4's planted negative
    assert obj["checks"]["scaled_optimum_within_one_notch"] is False
    assert obj["params"]["scaled"] is False and obj["params"]["ns"] == [1, 8]
    assert obj["rows"][1]["loss_unscaled"][1] is None  # "div" is written as null
    assert obj["rows"][1]["unscaled"] == 0.3


@pytest.mark.parametrize("argv", [["proofs", "7"], ["proofs", "5", "--set", "bogus=1"], ["proofs", "all", "3"]])
def test_cli_usage_errors_exit_2(argv, capsys):
    from drmlab.cli import main

    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_single_blas_thread_restores_the_thread_count():
    controls = openblas_controls()
    before = [get() for get, _ in controls]
    with lp.single_blas_thread():
        assert all(get() == 1 for get, _ in controls)
    assert [get() for get, _ in controls] == before
