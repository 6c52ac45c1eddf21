r"""Parallel transport along a path in fixed steps, and the holonomy and curvature it measures
(``docs/geometry.md`` section 4).

Parallel transport solves dA/dt = -Gamma(x(t))[x'(t), A] along a path with classical Runge-Kutta
(:func:`transport`); :func:`schild_transport` is Schild's ladder, which needs only geodesic
midpoints, built here from the second-order exponential and logarithm
exp_x(v) = x + v - 1/2 Gamma(x)[v, v], log_x(y) = (y - x) + 1/2 Gamma(x)[y - x, y - x] (first order
in the rung size). :func:`holonomy_angle` transports a G-orthonormal pair of a 2-plane around a
closed loop and returns the signed rotation angle; for a small loop of G-area a it is K a, K the
sectional curvature of that plane (:func:`sectional_curvature`). The same under step control is
:mod:`~drmlab.geometry.step_control`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .christoffel import Metric, christoffel, christoffel_contract


def _gamma_frame(metric, z, velocity, frame, full):
    """Gamma(z)[velocity, A] for each column A of frame [d, m]: [d, m]."""
    if full is not None:
        return torch.einsum("lij,i,jm->lm", full(z), velocity, frame)
    if frame.shape[1] == 1:
        return christoffel_contract(metric, z, velocity, frame[:, 0]).unsqueeze(1)
    if getattr(metric, "christoffel_contract", None) is not None:  # autograd inside: no vmap
        return torch.stack([metric.christoffel_contract(z, velocity, a) for a in frame.unbind(1)], 1)
    from torch.func import vmap

    return vmap(lambda a: christoffel_contract(metric, z, velocity, a), in_dims=1, out_dims=1)(frame)


def transport(
    metric: Metric,
    path: Callable[[float], tuple[torch.Tensor, torch.Tensor]],
    frame: torch.Tensor,
    steps: int,
    dense_christoffel: bool = False,
    t0: float = 0.0,
    t1: float = 1.0,
) -> torch.Tensor:
    """Parallel transport of the columns of frame [d, m] along path(t) -> (x(t), x'(t)), t in [t0, t1],
    by ``steps`` Runge-Kutta-4 steps of dA/dt = -Gamma(x)[x', A]. With ``dense_christoffel`` the full
    tensor of :func:`christoffel` is used (small d), else the contracted form."""
    full = (lambda x: christoffel(metric, x)) if dense_christoffel else None
    h = (t1 - t0) / steps
    a = frame

    piecewise = getattr(path, "piecewise", False)

    def rhs(t, a, anchor):  # a piecewise path is evaluated on the segment holding the step's midpoint
        x, xdot = path(t, anchor) if piecewise else path(t)
        return -_gamma_frame(metric, x, xdot, a, full)

    for k in range(steps):
        t = t0 + k * h
        mid = t + h / 2
        k1 = rhs(t, a, mid)
        k2 = rhs(mid, a + h / 2 * k1, mid)
        k3 = rhs(mid, a + h / 2 * k2, mid)
        k4 = rhs(t + h, a + h * k3, mid)
        a = a + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return a


def polyline(points: torch.Tensor) -> Callable[[float], tuple[torch.Tensor, torch.Tensor]]:
    """The piecewise-linear path through points [K + 1, d], segment k on t in [k, k + 1]. It is
    ``piecewise``: :func:`transport` names the segment by the step's midpoint (``anchor``), so a
    step ending on a corner keeps its own segment's velocity."""
    last = points.shape[0] - 2

    def path(t: float, anchor: float | None = None):
        k = min(max(math.floor(t if anchor is None else anchor), 0), last)
        step = points[k + 1] - points[k]
        return points[k] + (t - k) * step, step

    path.piecewise = True
    return path


def _exp(metric, x, v):
    return x + v - 0.5 * christoffel_contract(metric, x, v, v)


def _log(metric, x, y):
    delta = y - x
    return delta + 0.5 * christoffel_contract(metric, x, delta, delta)


def schild_transport(
    metric: Metric,
    points: torch.Tensor,
    vector: torch.Tensor,
    rungs_per_segment: int = 1,
    scale: float = 1.0,
    renormalize: bool = True,
) -> torch.Tensor:
    """Schild's ladder: transport ``vector`` [d] along the polyline points [K + 1, d].

        Each rung from x to the next point y: a = exp_x(eps A), m = the geodesic midpoint of a and y,
        b = exp_x(2 log_x(m)); the transported vector is log_y(b) / eps. eps makes the rung as long as
        the step, |eps A|_G = ``scale`` |y - x|_G: the second-order exp and log err by O(h^3), which
        the division by eps would amplify were the rung much shorter than the step. The ladder is first
    order: its G-norm drifts by O(h) in total, so with ``renormalize`` each rung restores the norm
    (parallel transport is an isometry) and what is left is the direction's error."""
    a_vec = vector
    for k in range(points.shape[0] - 1):
        for j in range(rungs_per_segment):
            x = points[k] + (points[k + 1] - points[k]) * (j / rungs_per_segment)
            y = points[k] + (points[k + 1] - points[k]) * ((j + 1) / rungs_per_segment)
            step = float(metric.inner(x, y - x, y - x)) ** 0.5
            eps = scale * step / max(float(metric.inner(x, a_vec, a_vec)) ** 0.5, 1e-300)
            a = _exp(metric, x, eps * a_vec)
            mid = _exp(metric, a, 0.5 * _log(metric, a, y))
            b = _exp(metric, x, 2.0 * _log(metric, x, mid))
            out = _log(metric, y, b) / eps
            if renormalize:
                out = out * (metric.inner(x, a_vec, a_vec) / metric.inner(y, out, out)).sqrt()
            a_vec = out
    return a_vec


def _orthonormal_pair(metric, z, u, w):
    """G-orthonormal e1, e2 spanning span(u, w), e1 along u (Gram-Schmidt in G)."""
    e1 = u / metric.inner(z, u, u).sqrt()
    w2 = w - metric.inner(z, e1, w) * e1
    return e1, w2 / metric.inner(z, w2, w2).sqrt()


def holonomy_angle(
    metric: Metric,
    path,
    base: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    steps: int,
    dense_christoffel: bool = False,
) -> float:
    """Signed rotation (radians, in (-pi, pi]) of a vector of span(u, w) transported once around the
    closed ``path`` starting and ending at ``base``, measured in the G-orthonormal frame (e1 along u)."""
    e1, e2 = _orthonormal_pair(metric, base, u, w)
    out = transport(metric, path, e1.unsqueeze(1), steps, dense_christoffel)[:, 0]
    return math.atan2(float(metric.inner(base, out, e2)), float(metric.inner(base, out, e1)))


def parallelogram(base: torch.Tensor, u: torch.Tensor, w: torch.Tensor, size: float):
    """The closed loop base -> +size u -> +size w -> -size u -> -size w on t in [0, 4]."""
    corners = torch.stack([base, base + size * u, base + size * (u + w), base + size * w, base])
    return polyline(corners)


def sectional_curvature(
    metric: Metric,
    base: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    size: float,
    steps_per_side: int = 8,
    dense_christoffel: bool = False,
) -> dict:
    """Holonomy estimate of the sectional curvature of span(u, w) at base: angle / G-area of the
    parallelogram of side ``size`` (error O(size) as the loop shrinks)."""
    loop = parallelogram(base, u, w, size)
    e1, e2 = _orthonormal_pair(metric, base, u, w)
    a = e1.unsqueeze(1)
    for side in range(4):
        a = transport(metric, loop, a, steps_per_side, dense_christoffel, t0=side, t1=side + 1)
    angle = math.atan2(float(metric.inner(base, a[:, 0], e2)), float(metric.inner(base, a[:, 0], e1)))
    guu, gww, guw = (float(metric.inner(base, x, y)) for x, y in ((u, u), (w, w), (u, w)))
    area = size**2 * math.sqrt(max(guu * gww - guw**2, 0.0))
    return {"angle": angle, "area": area, "curvature": angle / area if area > 0 else float("nan")}
