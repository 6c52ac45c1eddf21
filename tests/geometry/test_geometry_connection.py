"""Connection, transport and holonomy (docs/geometry.md section 4) on the round sphere and flat metrics."""

from __future__ import annotations

import math

import pytest
import torch

from drmlab.geometry.connection import (
    DenseMetric,
    LowRankMetric,
    christoffel,
    christoffel_contract,
    holonomy_angle,
    polyline,
    schild_transport,
    sectional_curvature,
    transport,
)

F64 = torch.float64


def sphere():
    """The unit sphere in (theta, phi): g = diag(1, sin^2 theta), K = 1."""
    return DenseMetric(lambda z: torch.diag(torch.stack([torch.ones_like(z[0]), torch.sin(z[0]) ** 2])))


def polar():
    """The flat plane in polar coordinates (r, phi): g = diag(1, r^2), nonzero Christoffels, K = 0."""
    return DenseMetric(lambda z: torch.diag(torch.stack([torch.ones_like(z[0]), z[0] ** 2])))


def latitude(theta0):
    """The circle theta = theta0, phi from 0 to 2 pi on t in [0, 1]: positively oriented about the cap."""

    def path(t):
        return (torch.tensor([theta0, 2 * math.pi * t], dtype=F64), torch.tensor([0.0, 2 * math.pi], dtype=F64))

    return path


def _wrap(x):
    return (x + math.pi) % (2 * math.pi) - math.pi


def test_sphere_christoffel_symbols_are_the_closed_form():
    z = torch.tensor([0.7, 0.3], dtype=F64)
    gamma = christoffel(sphere(), z)
    want = torch.zeros(2, 2, 2, dtype=F64)
    want[0, 1, 1] = -math.sin(0.7) * math.cos(0.7)  # Gamma^theta_phiphi
    want[1, 0, 1] = want[1, 1, 0] = math.cos(0.7) / math.sin(0.7)  # Gamma^phi_thetaphi
    assert (gamma - want).abs().max() < 1e-13


def test_the_contracted_form_equals_the_full_tensor_in_higher_dimension():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 6, 6, generator=g, dtype=F64) * 0.3
    B = torch.randn(6, 2, generator=g, dtype=F64)

    def low_rank(z):  # gamma(z) > 0, U(z) smooth: a DRM-like metric
        return torch.nn.functional.softplus(A[0] @ z) + 0.1, torch.tanh(A[1] @ z).unsqueeze(1) * B + A[2, :, :2] @ z[
            :2
        ].diag()

    metric = LowRankMetric(low_rank)
    z, u, w = (torch.randn(6, generator=g, dtype=F64) for _ in range(3))
    full = christoffel(metric, z)
    assert torch.allclose(christoffel_contract(metric, z, u, w), torch.einsum("lij,i,j->l", full, u, w), atol=1e-12)


@pytest.mark.parametrize("theta0", [0.4, 1.0, math.pi / 2])
def test_holonomy_around_a_latitude_is_the_enclosed_area(theta0):
    area = 2 * math.pi * (1 - math.cos(theta0))
    base = torch.tensor([theta0, 0.0], dtype=F64)
    e_theta, e_phi = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    for dense in (True, False):
        angle = holonomy_angle(sphere(), latitude(theta0), base, e_theta, e_phi, steps=400, dense_christoffel=dense)
        assert abs(_wrap(angle - area)) < 1e-8


def test_a_wrong_christoffel_sign_fails_the_sphere_test():
    """The test above can fail: transport with the opposite connection turns by minus the area."""
    theta0 = 1.0
    area = 2 * math.pi * (1 - math.cos(theta0))
    metric = sphere()
    path = latitude(theta0)
    a = torch.tensor([[1.0], [0.0]], dtype=F64)
    h = 1.0 / 200
    for k in range(200):  # Runge-Kutta 4 of dA/dt = +Gamma[x', A]

        def rhs(t, a):
            x, xdot = path(t)
            return torch.einsum("lij,i,jm->lm", christoffel(metric, x), xdot, a)

        t = k * h
        k1 = rhs(t, a)
        k2 = rhs(t + h / 2, a + h / 2 * k1)
        k3 = rhs(t + h / 2, a + h / 2 * k2)
        k4 = rhs(t + h, a + h * k3)
        a = a + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    wrong = math.atan2(float(a[1, 0]) * math.sin(theta0), float(a[0, 0]))
    assert abs(_wrap(wrong + area)) < 1e-8 and abs(_wrap(wrong - area)) > 0.1


def test_flat_metrics_have_no_holonomy():
    base = torch.tensor([1.0, 0.2], dtype=F64)
    e_r, e_phi = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    k = sectional_curvature(polar(), base, e_r, e_phi, size=0.3, steps_per_side=20)
    assert abs(k["angle"]) < 1e-9

    # and a full circle around the origin (r = 1): the frame turns once with the coordinates, no holonomy
    def circle(t):
        return torch.tensor([1.0, 2 * math.pi * t], dtype=F64), torch.tensor([0.0, 2 * math.pi], dtype=F64)

    assert abs(_wrap(holonomy_angle(polar(), circle, torch.tensor([1.0, 0.0], dtype=F64), e_r, e_phi, 400))) < 1e-8


def test_small_loop_holonomy_estimates_the_unit_curvature():
    base = torch.tensor([1.0, 0.0], dtype=F64)
    u, w = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    errors = [
        abs(sectional_curvature(sphere(), base, u, w, size=s, steps_per_side=16)["curvature"] - 1) for s in (0.1, 0.05)
    ]
    assert errors[0] < 0.1 and errors[1] < errors[0] / 1.8  # O(size) convergence to K = 1


def test_schild_ladder_converges_to_the_ode_transport():
    theta0 = 1.0
    area = 2 * math.pi * (1 - math.cos(theta0))
    errors, norms = [], []
    for rungs in (100, 200):
        phis = torch.linspace(0, 2 * math.pi, rungs + 1, dtype=F64)
        points = torch.stack([torch.full_like(phis, theta0), phis], dim=1)
        out = schild_transport(sphere(), points, torch.tensor([1.0, 0.0], dtype=F64))
        angle = math.atan2(float(out[1]) * math.sin(theta0), float(out[0]))
        errors.append(abs(_wrap(angle - area)))
        raw = schild_transport(sphere(), points, torch.tensor([1.0, 0.0], dtype=F64), renormalize=False)
        norms.append(abs(float(raw[0] ** 2 + (raw[1] * math.sin(theta0)) ** 2) - 1))
    assert errors[1] < 3e-3 and errors[1] < errors[0] / 3  # the direction: second order here
    assert norms[1] < 0.1 and norms[1] < norms[0] / 1.8  # the norm without renormalising: first order


def test_polyline_transport_is_identity_in_a_flat_chart():
    metric = DenseMetric(lambda z: torch.eye(3, dtype=F64) * 2.0 + 0 * z.sum())
    points = torch.randn(6, 3, dtype=F64)
    frame = torch.randn(3, 2, dtype=F64)
    assert torch.allclose(transport(metric, polyline(points), frame, steps=10, t1=5.0), frame, atol=1e-14)
