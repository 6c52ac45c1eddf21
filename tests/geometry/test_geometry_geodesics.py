"""The discrete geodesic solver (docs/geometry.md section 5): Euclidean lines, Poincare semicircles."""

from __future__ import annotations

import math

import pytest
import torch

from drmlab.geometry.connection import DenseMetric
from drmlab.geometry.geodesics import (
    discrete_action,
    path_versus_geodesic,
    solve_geodesic,
)

F64 = torch.float64


def poincare():
    """The upper half-plane, G = I / y^2."""
    return DenseMetric(lambda z: torch.eye(2, dtype=z.dtype) / z[1] ** 2)


def poincare_distance(p, q):
    return math.acosh(1 + ((p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2) / (2 * p[1] * q[1]))


@pytest.mark.parametrize("method,tol", [("lbfgs", 1e-7), ("newton", 1e-12)])
def test_constant_metric_geodesics_are_straight_uniform_lines(method, tol):
    A = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]], dtype=F64)
    metric = DenseMetric(lambda z: A + 0 * z.sum())
    a, b = torch.tensor([0.0, 1.0, -1.0], dtype=F64), torch.tensor([2.0, -1.0, 0.5], dtype=F64)
    init = torch.linspace(0, 1, 9, dtype=F64).unsqueeze(1) * (b - a) + a + 0.1 * torch.randn(9, 3, dtype=F64)
    init[0], init[-1] = a, b
    result = solve_geodesic(metric, a, b, 8, method=method, init=init, tol=tol)
    line = torch.linspace(0, 1, 9, dtype=F64).unsqueeze(1) * (b - a) + a
    assert result.converged
    assert (result.points - line).abs().max() < 10 * tol
    assert abs(result.length - float(((b - a) @ A @ (b - a)).sqrt())) < 10 * tol
    assert result.geodesic_equation["max"] < 100 * tol


@pytest.mark.parametrize("rule,order", [("midpoint", 2), ("left", 1)])
def test_poincare_geodesics_are_semicircles_with_the_closed_form_length(rule, order):
    a, b = torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    exact = poincare_distance(a, b)  # acosh(3); the geodesic is the circle |z| = sqrt(2)
    rows = []
    for k in (16, 32):
        result = solve_geodesic(poincare(), a, b, k, rule=rule, method="newton", tol=1e-11)
        assert result.converged and result.residual < 1e-11
        radius_error = float((result.points.norm(dim=1) - math.sqrt(2)).abs().max())
        rows.append((abs(result.length - exact), radius_error, result.geodesic_equation["max"]))
        assert abs(k * result.action / result.length**2 - 1) < (
            2e-3 if order == 1 else 1e-5
        )  # ~constant speed: K S = L^2
    (l16, r16, e16), (l32, r32, e32) = rows
    assert l32 < 2e-4 and r32 < 6e-4 * order  # measured: 9e-5 / 2.7e-4 (midpoint), 1.7e-4 / 5.4e-4 (left)
    assert l16 / l32 > 3.5 and r16 / r32 > 3.5  # the length and the circle converge at second order for both rules
    # the continuous geodesic equation is met at the rule's order: 2 (midpoint) or 1 (left)
    assert 2**order * 0.85 < e16 / e32 < 2**order * 1.15


def test_lbfgs_and_newton_agree_on_the_half_plane():
    a, b = torch.tensor([0.0, 0.5], dtype=F64), torch.tensor([2.0, 2.0], dtype=F64)
    newton = solve_geodesic(poincare(), a, b, 24, method="newton")
    lbfgs = solve_geodesic(poincare(), a, b, 24, method="lbfgs")
    assert newton.converged and lbfgs.converged
    assert (newton.points - lbfgs.points).abs().max() < 1e-6
    assert abs(newton.length - poincare_distance(a, b)) < 1e-3


def test_a_solve_that_does_not_converge_reports_its_residual_and_no_number():
    a, b = torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    result = solve_geodesic(poincare(), a, b, 32, method="newton", max_iter=1, tol=1e-14)
    assert not result.converged and result.action is None and result.length is None
    assert 0 < result.residual < 1


def test_a_path_against_the_geodesic_has_ratio_at_least_one():
    a, b = torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    s = torch.linspace(0, 1, 17, dtype=F64).unsqueeze(1)
    line = (1 - s) * a + s * b  # the straight chord is not a Poincare geodesic
    out = path_versus_geodesic(poincare(), line, rule="midpoint", method="newton")
    assert out["action_ratio"] is not None and out["action_ratio"] > 1.05
    assert out["path_action"] == pytest.approx(float(discrete_action(poincare(), line, "midpoint")))


def test_newton_with_conjugate_gradients_matches_the_dense_hessian(monkeypatch):
    from drmlab.geometry import geodesics

    a, b = torch.tensor([0.0, 0.5], dtype=F64), torch.tensor([2.0, 2.0], dtype=F64)
    dense = solve_geodesic(poincare(), a, b, 24, tol=1e-11)
    monkeypatch.setattr(geodesics, "DENSE_NEWTON_MAX", 0)
    cg = solve_geodesic(poincare(), a, b, 24, tol=1e-11)
    assert dense.converged and cg.converged
    assert (dense.points - cg.points).abs().max() < 1e-9
