"""Step control in G-length and the preconditioned geodesic solve (docs/geometry.md sections 4 and 5) on
metrics shaped like a trained model's: an eps floor plus a stiff rank-1 part, condition 1e12.

The known answers: the hyperbolic plane dx^2 + e^{2x} dy^2 (K = -1) times a flat factor eps I + w w^T
(|w|^2 = 1e8). Along the horocycle x = x0 the parallel-transported vector turns, in the frame (e_x,
e^{-x0} e_y), by exactly the G-length L of the arc; distances are the half-plane's (y, e^{-x}) acosh
formula combined with the flat factor's norm. A horocycle segment of G-length L taken as one
integrator step is the failure seen on trained models (segments of G-length ~1e5).
"""

from __future__ import annotations

import math

import pytest
import torch

from drmlab.geometry import geodesics
from drmlab.geometry.connection import (
    DenseMetric,
    LowRankMetric,
    StepControl,
    christoffel_contract,
    christoffel_contract_functional,
    polyline,
    schild_ladder,
    small_loop_holonomy,
    transport,
    transport_adaptive,
)
from drmlab.geometry.geodesics import solve_geodesic

F64 = torch.float64
EPS = 1e-4
W = torch.tensor([6e3, 8e3], dtype=F64)  # |w|^2 = 1e8: with the floor eps, condition 1e12


def hyperbolic_times_stiff() -> LowRankMetric:
    def factors(z):
        one = torch.ones_like(z[0])
        gamma = torch.stack([one, torch.exp(2 * z[0]), EPS * one, EPS * one])
        return gamma, torch.cat([torch.zeros(2, dtype=z.dtype), W]).unsqueeze(1) + 0 * z.sum()

    return LowRankMetric(factors)


def horocycle(x0: float, g_length: float) -> torch.Tensor:
    base = torch.tensor([x0, 0.0, 0.0, 0.0], dtype=F64)
    return torch.stack([base, base + torch.tensor([0.0, g_length / math.exp(x0), 0.0, 0.0], dtype=F64)])


def half_plane_distance(p, q) -> float:
    y1, y2 = math.exp(-p[0]), math.exp(-q[0])
    return math.acosh(1 + ((q[1] - p[1]) ** 2 + (y2 - y1) ** 2) / (2 * y1 * y2))


def test_the_metric_is_as_ill_conditioned_as_a_trained_one():
    metric = hyperbolic_times_stiff()
    cond = float(torch.linalg.cond(metric.dense(torch.tensor([5.0, 0, 0, 0], dtype=F64))))
    assert 5e11 < cond < 2e12


def test_the_fast_christoffel_contraction_equals_the_reference_and_the_closed_form():
    metric = hyperbolic_times_stiff()
    g = torch.Generator().manual_seed(0)
    z, u, w = (torch.randn(4, generator=g, dtype=F64) for _ in range(3))
    # Gamma^x_yy = -e^{2x}, Gamma^y_xy = Gamma^y_yx = 1, the flat factor's are zero
    want = torch.stack([-torch.exp(2 * z[0]) * u[1] * w[1], u[0] * w[1] + u[1] * w[0], z[2] * 0, z[3] * 0])
    fast = christoffel_contract(metric, z, u, w)
    assert (fast - want).abs().max() < 1e-12 * want.abs().max()
    assert (fast - christoffel_contract_functional(metric, z, u, w)).abs().max() < 1e-12 * want.abs().max()


def test_adaptive_transport_along_a_long_horocycle_is_the_closed_form_rotation():
    """One integrator step for a segment of G-length 12 diverges (the trained failure); the
    controlled transport turns the vector by exactly 12 rad and keeps its G-norm."""
    metric, x0, length = hyperbolic_times_stiff(), 5.0, 12.0
    points = horocycle(x0, length)
    frame = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=F64)
    old = transport(metric, polyline(points), frame, steps=1)[:, 0]
    assert float(metric.inner(points[1], old, old)) ** 0.5 > 100  # should be 1: it diverged
    result = transport_adaptive(metric, points, frame)
    assert result.completed and result.reason is None and result.substeps > 10
    alpha, beta = float(result.frame[0, 0]), float(result.frame[1, 0]) * math.exp(x0)
    assert abs(alpha - math.cos(length)) < 1e-6 and abs(beta + math.sin(length)) < 1e-6
    assert result.isometry_defect < 1e-6
    assert float(result.frame[2:].abs().max()) < 1e-12  # the flat, stiff factor is untouched


def test_a_transport_over_its_sub_step_cap_says_so_and_gives_no_number():
    metric = hyperbolic_times_stiff()
    frame = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=F64)
    result = transport_adaptive(metric, horocycle(5.0, 1e5), frame, StepControl(max_substeps=300))
    assert not result.completed and result.frame is None and result.isometry_defect is None
    assert result.reason.startswith("sub-step cap (300)") and "sub-steps" in result.reason
    assert result.substeps + result.rejected <= 300
    ladder = schild_ladder(metric, horocycle(5.0, 1e5), frame[:, 0], StepControl(max_substeps=300))
    assert not ladder.completed and ladder.frame is None and ladder.reason.startswith("rung cap (300)")


def test_the_controlled_ladder_converges_at_first_order_on_the_horocycle():
    metric, x0, length = hyperbolic_times_stiff(), 5.0, 1.5
    errors = []
    for correction in (0.04, 0.02):
        result = schild_ladder(
            metric,
            horocycle(x0, length),
            torch.tensor([1.0, 0, 0, 0], dtype=F64),
            StepControl(max_correction=correction),
        )
        assert result.completed and result.isometry_defect < 1e-12  # each rung restores the norm
        angle = math.atan2(-float(result.frame[1, 0]) * math.exp(x0), float(result.frame[0, 0]))
        errors.append(abs(angle - length))
    assert errors[1] < 0.05 and 1.6 < errors[0] / errors[1] < 2.6  # halving the rungs halves the error


@pytest.mark.parametrize("plane,curvature", [((0, 1), -1.0), ((2, 3), 0.0), ((0, 2), 0.0), ((1, 3), 0.0)])
def test_small_loop_holonomy_sized_in_g_length_gives_the_sectional_curvature(plane, curvature):
    metric = hyperbolic_times_stiff()
    base = torch.tensor([5.0, 0.3, 0.0, 0.0], dtype=F64)
    e = torch.eye(4, dtype=F64)
    result = small_loop_holonomy(metric, base, e[plane[0]], e[plane[1]])
    assert result["angle"] is not None and math.isfinite(result["angle"]) and result["consistent"]
    if curvature:
        assert result["resolved"] and abs(result["curvature_extrapolated"] - curvature) < 1e-3
        assert abs(result["curvature"] - curvature) < 0.01  # O(side): the side is 2^-8 in G-length
    else:
        assert abs(result["angle"]) <= result["angle_resolution"]


def test_small_loop_holonomy_on_the_sphere():
    sphere = DenseMetric(lambda z: torch.diag(torch.stack([torch.ones_like(z[0]), torch.sin(z[0]) ** 2])))
    e = torch.eye(2, dtype=F64)
    result = small_loop_holonomy(sphere, torch.tensor([1.0, 0.0], dtype=F64), e[0], e[1])
    assert result["consistent"] and result["resolved"]
    assert abs(result["curvature"] - 1) < 0.01 and abs(result["curvature_extrapolated"] - 1) < 1e-4


def test_a_connection_that_is_not_finite_gives_no_angle_never_nan():
    # G = (1 + |z_0|^(1/2)) I: its derivative is infinite at z_0 = 0, so is Gamma there
    metric = DenseMetric(lambda z: torch.eye(2, dtype=z.dtype) * (1 + z[0].abs().sqrt()))
    e = torch.eye(2, dtype=F64)
    result = small_loop_holonomy(metric, torch.zeros(2, dtype=F64), e[0], e[1])
    assert result["angle"] is None and result["failed"]


def _diag_plus_low_rank(d=6, r=2, seed=0):
    """A constant G = eps I + U U^T with |U|^2 ~ 1e8: condition ~1e12, like the trained metrics."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, r, generator=g, dtype=F64) * 5e3
    return LowRankMetric(lambda z: (torch.full_like(z, EPS), u + 0 * z.sum())), u


@pytest.mark.parametrize("dense_newton", [True, False])
def test_the_geodesic_of_a_constant_condition_1e12_metric_is_the_straight_line(dense_newton, monkeypatch):
    if not dense_newton:
        monkeypatch.setattr(geodesics, "DENSE_NEWTON_MAX", 0)  # trust-region Newton-CG, preconditioned
    metric, u = _diag_plus_low_rank()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64)
    s = torch.linspace(0, 1, 9, dtype=F64).unsqueeze(1)
    line = (1 - s) * a + s * b
    init = line + 0.1 * torch.randn(9, 6, generator=g, dtype=F64)  # off the line in stiff and soft directions
    init[0], init[-1] = a, b
    result = solve_geodesic(metric, a, b, 8, init=init, rule="left")
    dense = metric.dense(a)
    length = float(((b - a) @ dense @ (b - a)).sqrt())
    assert result.converged and result.decrement < 1e-6
    assert abs(result.length / length - 1) < 1e-12
    # on the line in the metric's own terms; in coordinates the soft directions (cost eps) are fixed only to
    # the gradient's rounding over their curvature, ~ condition x machine epsilon (measured: 2e-4)
    off = result.points - line
    assert float(torch.einsum("ki,ij,kj->k", off, dense, off).max().sqrt()) < 1e-9 * length
    assert float(off.abs().max()) < 1e12 * 1e-15


def test_unpreconditioned_lbfgs_does_not_converge_there():
    """The failure mode: on the same problem L-BFGS stops with the soft directions unsolved."""
    metric, _ = _diag_plus_low_rank()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64)
    s = torch.linspace(0, 1, 9, dtype=F64).unsqueeze(1)
    init = (1 - s) * a + s * b + 0.1 * torch.randn(9, 6, generator=g, dtype=F64)
    init[0], init[-1] = a, b
    result = solve_geodesic(metric, a, b, 8, init=init, rule="left", method="lbfgs", max_iter=200)
    assert not result.converged and result.action is None and result.decrement > 1e-6


@pytest.mark.parametrize("dense_newton", [True, False])
def test_the_geodesic_of_the_ill_conditioned_curved_metric_has_the_closed_form_length(dense_newton, monkeypatch):
    if not dense_newton:
        monkeypatch.setattr(geodesics, "DENSE_NEWTON_MAX", 0)
    metric = hyperbolic_times_stiff()
    a = torch.tensor([0.0, -1.0, 0.0, 0.0], dtype=F64)
    b = torch.tensor([0.0, 1.0, 1e-2, -2e-2], dtype=F64)
    flat = metric.dense(a)[2:, 2:]
    exact = math.sqrt(half_plane_distance(a.tolist(), b.tolist()) ** 2 + float((b - a)[2:] @ flat @ (b - a)[2:]))
    errors = []
    for k in (16, 32):
        result = solve_geodesic(metric, a, b, k, rule="midpoint")
        assert result.converged and result.decrement < 1e-6 and result.residual < 1e-7
        errors.append(abs(result.length - exact) / exact)
    assert errors[1] < 1e-4 and 3.5 < errors[0] / errors[1] < 4.5  # second order in 1 / K
