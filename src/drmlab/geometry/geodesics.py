r"""Geodesics as a discrete boundary-value problem (``docs/geometry.md`` section 5).

Given endpoints a, b and K segments, minimise the discrete action over the interior points

    S(z_1..z_{K-1}) = sum_k (z_{k+1} - z_k)^T G(c_k) (z_{k+1} - z_k),   z_0 = a, z_K = b,

with c_k = z_k (``rule="left"``, the form of the issue) or the segment midpoint (``rule="midpoint"``).
Both give the length to second order in 1/K; the continuous geodesic equation is met to first
order by the left rule and to second order by the midpoint rule. Its stationarity condition dS/dz_k = 0 is the discrete
Euler-Lagrange (geodesic) equation, and a minimiser has constant speed, so K S = L^2 (L the length).
Solved by Newton's method (exact Hessian, or conjugate gradients on exact Hessian-vector products
for large problems) or L-BFGS, in the metric's dtype. The result always carries its residual; a solve that does not converge returns no
action or length, only the residual.

:func:`path_versus_geodesic` compares a given discrete path (e.g. the model's states between two
block starts) with the geodesic between its endpoints: the action ratio S(path) / S(geodesic) is
>= 1 when the solver found the minimiser. It is a diagnostic, never evidence that a model's
trajectories are geodesics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .connection import Metric, geodesic_residual

LBFGS_RESTARTS = 5

__all__ = ["GeodesicResult", "discrete_action", "path_versus_geodesic", "segment_lengths", "solve_geodesic"]


@dataclass
class GeodesicResult:
    """``points`` [K + 1, d]; ``action`` and ``length`` are None unless ``converged``; ``residual`` is
    |dS/dz| over its value at the straight-line start (``residual_abs`` the absolute norm);
    ``geodesic_equation``: the continuous residual of :func:`connection.geodesic_residual` (when
    the metric can solve)."""

    points: torch.Tensor
    converged: bool
    iterations: int
    residual: float
    residual_abs: float
    action: float | None
    length: float | None
    geodesic_equation: dict | None = None

    def as_dict(self) -> dict:
        return {
            "converged": self.converged,
            "iterations": self.iterations,
            "residual": self.residual,
            "residual_abs": self.residual_abs,
            "action": self.action,
            "length": self.length,
            "geodesic_equation": self.geodesic_equation,
        }


def _evaluation_points(points: torch.Tensor, rule: str) -> torch.Tensor:
    if rule == "left":
        return points[:-1]
    if rule == "midpoint":
        return 0.5 * (points[:-1] + points[1:])
    raise ValueError(f"rule must be 'left' or 'midpoint', got {rule!r}")


def discrete_action(metric: Metric, points: torch.Tensor, rule: str = "left") -> torch.Tensor:
    """sum_k Delta_k^T G(c_k) Delta_k over the path points [K + 1, d] (a 0-d tensor)."""
    from torch.func import vmap

    delta = points[1:] - points[:-1]
    return (delta * vmap(metric.apply)(_evaluation_points(points, rule), delta)).sum()


def segment_lengths(metric: Metric, points: torch.Tensor, rule: str = "left") -> torch.Tensor:
    """|Delta_k|_G(c_k) per segment, [K]."""
    from torch.func import vmap

    delta = points[1:] - points[:-1]
    return (delta * vmap(metric.apply)(_evaluation_points(points, rule), delta)).sum(-1).clamp_min(0).sqrt()


def solve_geodesic(
    metric: Metric,
    a: torch.Tensor,
    b: torch.Tensor,
    segments: int,
    rule: str = "midpoint",
    method: str = "newton",
    tol: float = 1e-7,
    max_iter: int = 500,
    init: torch.Tensor | None = None,
    equation_residual: bool = True,
) -> GeodesicResult:
    """The discrete geodesic from a to b [d] with ``segments`` segments (start: the straight line, or
    ``init`` [K + 1, d]). Converged when |dS/dz| <= tol x its value at the start (or <= 1e-14).

    ``method``: "newton" (the default: the exact Hessian up to 2,000 unknowns, conjugate gradients on
    Hessian-vector products above) or "lbfgs". L-BFGS's line search compares action values, which
    limits it to a relative gradient of about sqrt(machine epsilon) (1e-8 in float64, often worse on
    a learned metric); Newton's steps are judged on the gradient too and reach 1e-12."""
    if segments < 2:
        raise ValueError(f"a geodesic needs at least 2 segments, got {segments}")
    if method not in ("lbfgs", "newton"):
        raise ValueError(f"method must be 'lbfgs' or 'newton', got {method!r}")
    s = torch.linspace(0, 1, segments + 1, dtype=a.dtype, device=a.device).unsqueeze(1)
    start = init.detach().clone() if init is not None else (1 - s) * a + s * b
    interior = start[1:-1].clone().requires_grad_(True)

    def path(x):
        return torch.cat([a.unsqueeze(0), x, b.unsqueeze(0)])

    def action(x):
        return discrete_action(metric, path(x), rule)

    def grad_norm(x):
        x = x.detach().requires_grad_(True)
        return float(torch.autograd.grad(action(x), x)[0].norm())

    g0 = grad_norm(interior)
    scale = g0 if g0 > 0 else 1.0
    iterations = 0
    if method == "newton":
        # the Hessian of the action under the constant metric c I (c: the start's mean energy per squared step)
        # is 2 c times the path Laplacian: the conjugate gradients' preconditioner
        start_delta = start[1:] - start[:-1]
        c = float(discrete_action(metric, start, rule)) / max(float(start_delta.square().sum()), 1e-300)
        interior, iterations = _newton(
            action,
            interior.detach(),
            tol * scale,
            max_iter,
            precondition=_laplacian_preconditioner(segments - 1, 2 * c, a.dtype),
        )
    else:
        for _restart in range(LBFGS_RESTARTS):  # a stalled line search restarts from a fresh history
            optimizer = torch.optim.LBFGS(
                [interior],
                lr=1.0,
                max_iter=max_iter,
                history_size=50,
                tolerance_grad=max(tol * scale / math.sqrt(interior.numel()), 1e-16),
                tolerance_change=0.0,
                line_search_fn="strong_wolfe",
            )

            def closure():  # the gradient set directly: no training-style backward outside training/
                value = action(interior)
                interior.grad = torch.autograd.grad(value, interior)[0]
                return value

            optimizer.step(closure)
            iterations += int(optimizer.state[interior].get("n_iter", 0))
            if grad_norm(interior) <= max(tol * scale, 1e-14) or iterations >= max_iter:
                break
        interior = interior.detach()
    residual_abs = grad_norm(interior)
    residual = residual_abs / scale
    converged = residual <= tol or residual_abs <= 1e-14
    points = path(interior).detach()
    value = float(discrete_action(metric, points, rule))
    length = float(segment_lengths(metric, points, rule).sum())
    equation = None
    if equation_residual and segments >= 2:
        try:
            equation = geodesic_residual(metric, points)
        except NotImplementedError:
            equation = None
    return GeodesicResult(
        points,
        converged,
        iterations,
        residual,
        residual_abs,
        value if converged else None,
        length if converged else None,
        equation,
    )


DENSE_NEWTON_MAX = (
    2000  # unknowns up to which Newton forms the Hessian; above, conjugate gradients on Hessian-vector products
)


def _laplacian_preconditioner(points: int, scale: float, dtype):
    """r [points * d] -> (scale T)^-1 r, T the tridiagonal path Laplacian (2 on the diagonal, -1 beside)."""
    lap = (
        2 * torch.eye(points, dtype=dtype)
        - torch.diag(torch.ones(points - 1, dtype=dtype), 1)
        - torch.diag(torch.ones(points - 1, dtype=dtype), -1)
    )
    inverse = torch.linalg.inv(lap) / max(scale, 1e-300)

    def apply(r: torch.Tensor) -> torch.Tensor:
        return (inverse.to(r.device) @ r.view(points, -1)).reshape(-1)

    return apply


def _newton(action, x: torch.Tensor, gtol: float, max_iter: int, precondition=None) -> tuple[torch.Tensor, int]:
    """Newton's method on the interior points x: the exact Hessian when small, else preconditioned
    conjugate gradients on exact Hessian-vector products (forward over reverse). A step is accepted
    when it lowers the action or the gradient norm (near the minimiser the action's rounding hides
    progress that the gradient still shows), halving it otherwise."""
    from torch.func import grad, hessian, jvp

    n = x.numel()

    def f(flat):
        return action(flat.view_as(x))

    g = grad(f)
    flat = x.reshape(-1).clone()
    for it in range(1, max_iter + 1):
        gk = g(flat)
        gnorm = float(gk.norm())
        if gnorm <= max(gtol, 1e-14):
            return flat.view_as(x), it - 1
        if n <= DENSE_NEWTON_MAX:
            h = hessian(f)(flat)
            step = torch.linalg.solve(h + 1e-14 * torch.eye(n, dtype=x.dtype, device=x.device), gk)
        else:
            step = _conjugate_gradients(
                lambda v, at=flat: jvp(g, (at,), (v,))[1],
                gk,
                tol=min(0.5, gnorm**0.5) * gnorm,
                precondition=precondition,
            )
        base, t = float(f(flat)), 1.0
        while t > 1e-10:
            trial = flat - t * step
            if float(f(trial)) <= base or float(g(trial).norm()) < gnorm:
                break
            t *= 0.5
        flat = flat - t * step
    return flat.view_as(x), max_iter


def _conjugate_gradients(hvp, b: torch.Tensor, tol: float, max_iter: int = 200, precondition=None) -> torch.Tensor:
    """Solve H p = b by (preconditioned) conjugate gradients, stopping at |r| <= tol or on negative curvature."""
    precondition = precondition or (lambda r: r)
    p = torch.zeros_like(b)
    r = b.clone()
    y = precondition(r)
    d = y.clone()
    ry = float(r @ y)
    for _ in range(max_iter):
        if float(r.norm()) <= tol:
            break
        hd = hvp(d)
        curvature = float(d @ hd)
        if curvature <= 0:
            return p if float(p.norm()) > 0 else b
        alpha = ry / curvature
        p = p + alpha * d
        r = r - alpha * hd
        y = precondition(r)
        ry_new = float(r @ y)
        d = y + (ry_new / ry) * d
        ry = ry_new
    return p


def path_versus_geodesic(metric: Metric, path: torch.Tensor, rule: str = "left", **solver) -> dict:
    """The discrete action of ``path`` [K + 1, d] against the geodesic between its endpoints with the
    same K: {'path_action', 'geodesic', 'action_ratio' (None unless the solve converged)}."""
    path_action = float(discrete_action(metric, path, rule))
    geo = solve_geodesic(metric, path[0], path[-1], path.shape[0] - 1, rule=rule, **solver)
    ratio = path_action / geo.action if geo.converged and geo.action and geo.action > 0 else None
    return {
        "path_action": path_action,
        "path_length": float(segment_lengths(metric, path, rule).sum()),
        "geodesic": geo.as_dict(),
        "action_ratio": ratio,
    }
