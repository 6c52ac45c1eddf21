r"""The Levi-Civita connection of a metric: Christoffel symbols, parallel transport, holonomy
(``docs/geometry.md`` section 4).

A metric is given as a :class:`Metric`: ``apply(z, v) = G(z) v`` (differentiable in z) and
``solve(z, w) = G(z)^{-1} w``, for one state z [d]. Two ways to the connection:

* :func:`christoffel` (small d): the full tensor Gamma^l_ij = 1/2 g^lm (d_i g_mj + d_j g_mi - d_m g_ij)
  from the forward-mode Jacobian of the dense metric, d^3 numbers.
* :func:`christoffel_contract` (any d): Gamma(z)[u, w] = g^-1 (1/2 (D_u G) w + 1/2 (D_w G) u
  - 1/2 grad_z (u^T G w)), two Jacobian-vector products and one vector-Jacobian product through the
  metric, never the d^3 tensor.

Parallel transport solves dA/dt = -Gamma(x(t))[x'(t), A] along a path with classical Runge-Kutta
(:func:`transport`); :func:`schild_transport` is Schild's ladder, which needs only geodesic
midpoints, built here from the second-order exponential and logarithm
exp_x(v) = x + v - 1/2 Gamma(x)[v, v], log_x(y) = (y - x) + 1/2 Gamma(x)[y - x, y - x] (first order
in the rung size). :func:`holonomy_angle` transports a G-orthonormal pair of a 2-plane around a
closed loop and returns the signed rotation angle; for a small loop of G-area a it is K a, K the
sectional curvature of that plane (:func:`sectional_curvature`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = [
    "DenseMetric",
    "LowRankMetric",
    "Metric",
    "christoffel",
    "christoffel_contract",
    "geodesic_residual",
    "holonomy_angle",
    "parallelogram",
    "polyline",
    "schild_transport",
    "sectional_curvature",
    "transport",
]


class Metric:
    """G(z) as the instruments see it; subclasses give ``apply`` and ``solve`` for one state z [d]."""

    dim: int

    def apply(self, z: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def solve(self, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dense(self, z: torch.Tensor) -> torch.Tensor:
        """[d, d]: G applied to the identity (symmetrised)."""
        g = torch.func.vmap(lambda e: self.apply(z, e))(torch.eye(z.shape[-1], dtype=z.dtype, device=z.device))
        return 0.5 * (g + g.mT)

    def inner(self, z, u, w):
        return (u * self.apply(z, w)).sum(-1)


class DenseMetric(Metric):
    """From a callable z [d] -> G(z) [d, d] (symmetric positive definite)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.fn = fn

    def apply(self, z, v):
        return self.fn(z) @ v

    def solve(self, z, w):
        return torch.linalg.solve(self.fn(z), w)

    def dense(self, z):
        return self.fn(z)


class LowRankMetric(Metric):
    """From a callable z [d] -> (gamma [d] > 0, U [d, r]): G = diag(gamma) + U U^T, solved with Woodbury."""

    def __init__(self, fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        self.fn = fn

    def apply(self, z, v):
        gamma, u = self.fn(z)
        return gamma * v + u @ (u.mT @ v)

    def solve(self, z, w):
        from drmlab.ops import woodbury_solve

        gamma, u = self.fn(z)
        return woodbury_solve(gamma, u, w.unsqueeze(0))[0]


def christoffel(metric: Metric, z: torch.Tensor) -> torch.Tensor:
    """Gamma[l, i, j] = Gamma^l_ij at z [d] (second kind, symmetric in i, j): [d, d, d]."""
    from torch.func import jacfwd

    dg = jacfwd(metric.dense)(z)  # dg[i, j, k] = d_k g_ij
    first = 0.5 * (dg.permute(0, 2, 1) + dg - dg.permute(2, 0, 1))  # [m, i, j]: d_i g_mj + d_j g_mi - d_m g_ij
    first = 0.5 * (first + first.transpose(1, 2))
    return torch.linalg.solve(metric.dense(z), first.reshape(z.shape[0], -1)).reshape(first.shape)


def christoffel_contract(metric: Metric, z: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Gamma(z)[u, w] (a vector [d]) without the d^3 tensor: 2 JVPs + 1 VJP through ``metric.apply``."""
    from torch.func import grad, jvp

    du_w = jvp(lambda x: metric.apply(x, w), (z,), (u,))[1]
    dw_u = jvp(lambda x: metric.apply(x, u), (z,), (w,))[1]
    grad_energy = grad(lambda x: (u * metric.apply(x, w)).sum())(z)
    return metric.solve(z, 0.5 * (du_w + dw_u - grad_energy))


def _gamma_frame(metric, z, velocity, frame, full):
    """Gamma(z)[velocity, A] for each column A of frame [d, m]: [d, m]."""
    if full is not None:
        return torch.einsum("lij,i,jm->lm", full(z), velocity, frame)
    if frame.shape[1] == 1:
        return christoffel_contract(metric, z, velocity, frame[:, 0]).unsqueeze(1)
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


def geodesic_residual(metric: Metric, points: torch.Tensor) -> dict:
    """The geodesic-equation residual of a discrete path points [K + 1, d] at its interior points,
    parametrised on [0, 1]: r_k = a_k + Gamma(z_k)[v_k, v_k] with central differences, reported as
    |r_k|_G / |v_k|_G^2 (scale-free; zero for an exact constant-speed geodesic up to O(h^2))."""
    n = points.shape[0] - 1
    h = 1.0 / n
    rel = []
    for k in range(1, n):
        v = (points[k + 1] - points[k - 1]) / (2 * h)
        a = (points[k + 1] - 2 * points[k] + points[k - 1]) / h**2
        r = a + christoffel_contract(metric, points[k], v, v)
        speed2 = float(metric.inner(points[k], v, v))
        rel.append(math.sqrt(max(float(metric.inner(points[k], r, r)), 0.0)) / max(speed2, 1e-300))
    return {"max": max(rel) if rel else 0.0, "mean": sum(rel) / len(rel) if rel else 0.0}
