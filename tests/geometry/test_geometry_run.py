"""The instruments pointed at a model (docs/geometry.md section 7), including a degenerate metric."""

from __future__ import annotations

import dataclasses

import torch

from drmlab.geometry.model_adapter import model_view
from drmlab.geometry.run import (
    GeometryBudget,
    measure_connection,
    measure_geodesics,
    measure_metric,
    measure_strata,
)
from drmlab.models import build_model

BUDGET = GeometryBudget(strata_states=8, holonomy_points=1, transport_blocks=1, geodesic_max_iter=50)


def _view(mask_floor: bool):
    model = build_model("J", preset="micro").to(torch.float64).requires_grad_(False).eval()
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    view = model_view(model, tokens)
    if not mask_floor:
        return view
    zero = torch.arange(view.d_state) < 8  # a degenerate metric: the floor vanishes on 8 of 16 coordinates

    def degenerate(z):
        gamma, u = view.metric_fn(z)
        return torch.where(zero, torch.zeros_like(gamma), gamma), u

    return dataclasses.replace(view, metric_fn=degenerate)


def test_the_learned_metric_is_full_rank_by_construction():
    result = measure_metric(_view(False))
    assert result["exact_rank"] == [16] and result["kernel_dim"] == [0]
    assert result["pinv_vs_woodbury_max_rel"] < 1e-12


def test_a_degenerate_metric_has_its_exact_kernel_and_strata():
    view = _view(True)
    result = measure_metric(view)
    r = view.metric_config["metric_rank"]  # 4 columns of U: rank = 16 - 8 + 4, kernel 8 - 4
    assert result["exact_rank"] == [16 - 8 + r] and result["kernel_dim"] == [8 - r]
    assert result["numerical_rank_approx"]["rank_rtol_1e-06"] == 16 - 8 + r
    strata = measure_strata(view, BUDGET)
    assert strata["metric_exact"]["strata"] == [12] and strata["metric_exact"]["occupancy"] == {12: 1.0}
    assert sum(strata["pullback_numerical_approx"]["occupancy"].values()) == 1.0


def test_connection_and_geodesics_on_a_degenerate_metric_say_they_use_the_damped_one():
    view = _view(True)
    connection = measure_connection(view, BUDGET)
    assert connection["note"].startswith("the metric's floor vanishes")
    assert all(abs(h["angle"]) < 1 for h in connection["holonomy"])
    geodesics = measure_geodesics(view, BUDGET)
    assert "G + 0.3 I" in geodesics["note"]


def _option_view(**overrides):
    model = build_model("J", preset="micro", seed=1, **overrides).to(torch.float64).requires_grad_(False).eval()
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    return model, model_view(model, tokens)


def test_the_degenerate_option_gets_exact_ranks_labelled_with_their_source():
    from drmlab.ops import exact_rank

    _, view = _option_view(metric_diagonal="relu")
    result = measure_metric(view)
    gamma, u = torch.func.vmap(view.metric_fn)(view.block_starts.reshape(-1, view.d_state))
    assert bool((gamma == 0).any())
    assert result["exact_rank"] == sorted(set(exact_rank(gamma, u).tolist()))
    assert result["exact_rank_how"].startswith("exact: the floor's zero set (metric_diagonal='relu')")
    assert result["pinv_vs_model_max_rel"] < 1e-12  # the model's batched pseudo-inverse against the SVD split
    assert max(result["kernel_dim"]) > 0 and result["condition_number_mean"] is None  # an exact kernel: cond = inf
    assert f"smallest margin: {result['u_z_margin_min']:.3g}" in result["exact_rank_how"]
    strata = measure_strata(view, BUDGET)
    assert strata["metric_exact_how"].startswith("exact: the floor's zero set") and "metric_exact" in strata


def test_the_pullback_option_gets_a_rank_bound_and_no_agreement():
    from drmlab.geometry.pullback import pullback_metric
    from drmlab.geometry.report import write_tables
    from drmlab.geometry.run import _dense_metric, geometry_of_model

    model, view = _option_view(metric="pullback")
    z = view.block_starts.reshape(-1, view.d_state)
    want = pullback_metric(view.logits_fn, z)
    assert float((_dense_metric(view, z) - want).abs().max() / want.abs().max()) < 1e-12
    assert "agreement" in view.not_applicable
    record = geometry_of_model(model, torch.randint(0, 256, (2, 24)), BUDGET, only=("metric", "strata"))
    metric, strata = record["instruments"]["metric"], record["instruments"]["strata"]
    assert "exact_rank" not in metric and metric["exact_rank_bound"] == 16  # min(d = 16, V - 1 = 255)
    assert "metric_exact" not in strata and strata["metric_exact_bound"] == 16
    assert "decoder pullback itself" in " ".join(record["notes"])
    assert "only bounded, by 16" in write_tables(record)


def test_a_non_finite_vector_has_no_angle_not_a_perfect_one():
    """A diverged transport (NaN) once read as angle 0.0 -- min(1, NaN) is 1 in Python -- i.e. as a
    perfect agreement with the next block's directions. It is NaN now, and finite vectors keep their angle."""
    import math

    from drmlab.geometry.run import _g_angle

    class Euclid:
        def inner(self, z, a, b):
            return (a * b).sum()

    z = torch.zeros(2, dtype=torch.float64)
    e1, e2 = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert abs(_g_angle(Euclid(), z, e1, e2) - math.pi / 4) < 1e-15
    assert math.isnan(_g_angle(Euclid(), z, e1, torch.tensor([math.nan, 0.0], dtype=torch.float64)))
