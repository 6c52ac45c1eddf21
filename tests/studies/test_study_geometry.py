"""The README's claims about the geometry instruments on trained tiny runs (docs/studies/geometry-tiny,
docs/geometry.md section 10): seed 1 of J, J_METRIC_SUBSPACE and J_NO_DIRECTION; a learned metric that is
numerically its rank-8 part on the eps floor, unlike the decoder's pullback metric, with large curvatures
of both signs; transport stopped at its cap; an unconverged geodesic solve that still bounds the model
path's excess action from below."""

from __future__ import annotations

import math

from study_results import load

RUNS = ("J-seed1", "J_METRIC_SUBSPACE-seed1", "J_NO_DIRECTION-seed1")


def _runs() -> dict:
    return load("geometry-tiny")["runs"]


def test_the_three_seed_one_runs_and_nothing_else():
    runs = _runs()
    assert set(runs) == set(RUNS) and all(r["seed"] == 1 and r["tokens_measured"] == 512 for r in runs.values())


def test_the_learned_metric_is_its_rank_eight_part_on_the_floor():
    for name, r in _runs().items():
        m = r["metric"]
        assert m["numerical_rank_approx"]["rank_rtol_1e-02"] == 8.0 and m["exact_rank"] == [128], name
        assert 1e11 <= m["condition_number_mean"] <= 1e14, name
        assert math.isclose(m["eigenvalue_min"], 1e-4, rel_tol=1e-2), name  # the eps floor


def test_it_does_not_resemble_the_decoders_pullback_metric():
    pearson = {}
    for name, r in _runs().items():
        a = r["agreement"]
        assert abs(a["principal_angle_largest_mean_rad"] - a["random_subspace_largest_angle_rad"]) < 0.02, name
        pearson[name] = a["energy_log_pearson"]
    assert all(p <= 0 for p in pearson.values())  # uncorrelated or anti-correlated
    assert round(pearson["J-seed1"], 2) == -0.06 and round(pearson["J_NO_DIRECTION-seed1"], 2) == -0.82


def test_curvatures_are_large_of_both_signs_and_one_is_the_loops():
    curvatures, inconsistent = [], []
    for name, r in _runs().items():
        for h in r["connection"]["holonomy"]:
            assert h["angle"] is not None and math.isfinite(h["curvature"]), name  # never NaN
            curvatures.append(h["curvature"])
            if not h["consistent"]:
                inconsistent.append((name, h["block"]))
    assert len(curvatures) == 6 and min(curvatures) < -50 and max(curvatures) > 50
    assert inconsistent == [("J-seed1", 0)]


def test_transport_stops_at_its_cap_and_the_geodesic_solve_does_not_converge():
    for name, r in _runs().items():
        transport = r["connection"]["transport"]
        assert (not transport) == (name == "J_NO_DIRECTION-seed1")  # no directions to transport
        assert all(not t["completed"] and t["angle_transported_mean_rad"] is None for t in transport), name
        (geo,) = r["geodesics"]
        assert not geo["converged"] and geo["action_ratio"] is None, name
        assert geo["path_action"] / geo["action_upper_bound"] >= 1e6, name
