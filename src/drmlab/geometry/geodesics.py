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
    ``decrement``: the metric-weighted residual sqrt(g^T P^-1 g / S) of :func:`solve_geodesic`;
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
    decrement: float | None = None
    hessian_vector_products: int = 0

    def as_dict(self) -> dict:
        return {
            "converged": self.converged,
            "iterations": self.iterations,
            "residual": self.residual,
            "residual_abs": self.residual_abs,
            "action": self.action,
            "length": self.length,
            "geodesic_equation": self.geodesic_equation,
            "metric_weighted_residual": self.decrement,
            "hessian_vector_products": self.hessian_vector_products,
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
    decrement_tol: float = 1e-6,
    max_hvp: int | None = None,
) -> GeodesicResult:
    """The discrete geodesic from a to b [d] with ``segments`` segments (start: the straight line, or
    ``init`` [K + 1, d]).

    Converged when both scale-free residuals are small: the gradient |dS/dz| <= ``tol`` x its value
    at the start (or <= 1e-14), and the metric-weighted residual sqrt(g^T P^-1 g / S) <=
    ``decrement_tol``, P the frozen-metric Hessian (:func:`frozen_metric_hessian`). The first alone
    is blind to the soft directions of an ill-conditioned G (their gradient is 1e-12 of the stiff
    ones'); the second weighs every direction by its stiffness (it is the Newton decrement per unit
    action, sqrt(2 (S - S*) / S) near a minimiser).

    ``method``: "newton" (the default: the exact Hessian up to 2,000 unknowns, above that conjugate
    gradients on exact Hessian-vector products preconditioned by P, which is exact for a constant
    metric of any condition) or "lbfgs" (unpreconditioned; its line search compares action values,
    which limits it to a relative gradient of about sqrt(machine epsilon)). ``max_hvp`` bounds the
    Hessian-vector products of Newton-CG (the cost; None: only ``max_iter`` bounds it)."""
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
    iterations, hvps = 0, 0
    if method == "newton":
        interior, iterations, hvps = _newton(
            action,
            interior.detach(),
            tol * scale,
            max_iter,
            precondition=lambda x: frozen_metric_hessian(metric, path(x.view(interior.shape)), rule),
            decrement_tol=decrement_tol,
            max_hvp=max_hvp,
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
    x = interior.detach().requires_grad_(True)
    value_t = action(x)
    gradient = torch.autograd.grad(value_t, x)[0].detach()
    residual_abs = float(gradient.norm())
    residual = residual_abs / scale
    points = path(interior).detach()
    value = float(discrete_action(metric, points, rule))
    decrement = _decrement(frozen_metric_hessian(metric, points, rule), gradient.reshape(-1), value)
    converged = (residual <= tol or residual_abs <= 1e-14) and decrement <= decrement_tol
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
        decrement,
        hvps,
    )


DENSE_NEWTON_MAX = (
    2000  # unknowns up to which Newton forms the Hessian; above, conjugate gradients on Hessian-vector products
)


class BlockTridiagonal:
    """The SPD block-tridiagonal matrix with diagonal blocks ``diagonal`` [n, d, d] and blocks
    ``upper`` [n - 1, d, d] at (m, m + 1) (and their transposes at (m + 1, m)), factorised by block
    Cholesky: S_0 = D_0, S_m = D_m - E_{m-1}^T S_{m-1}^-1 E_{m-1}. ``solve`` costs 2 n d^2 plus n
    triangular pairs; the factorisation n Cholesky factorisations of d x d."""

    def __init__(self, diagonal: torch.Tensor, upper: torch.Tensor):
        n = diagonal.shape[0]
        self.chol, self.coupling, self.upper, self.diagonal = [], [], upper, diagonal  # L_m, W_m = S_m^-1 E_m
        schur = diagonal[0]
        for m in range(n):
            schur = 0.5 * (schur + schur.mT)
            chol = _cholesky(schur)
            self.chol.append(chol)
            if m == n - 1:
                break
            w = torch.cholesky_solve(upper[m], chol)
            self.coupling.append(w)
            schur = diagonal[m + 1] - upper[m].mT @ w

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """P v for v [n * d]."""
        n = len(self.chol)
        x = v.reshape(n, -1)
        out = torch.einsum("mij,mj->mi", self.diagonal, x)
        out[:-1] += torch.einsum("mij,mj->mi", self.upper, x[1:])
        out[1:] += torch.einsum("mji,mj->mi", self.upper, x[:-1])
        return out.reshape(v.shape)

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        """P^-1 r for r [n * d] (or [n, d]); returns the same shape."""
        shape, n = r.shape, len(self.chol)
        r = r.reshape(n, -1, 1)
        y = [r[0]]
        for m in range(1, n):  # forward: y_m = r_m - W_{m-1}^T y_{m-1}
            y.append(r[m] - self.coupling[m - 1].mT @ y[m - 1])
        x = [None] * n
        x[n - 1] = torch.cholesky_solve(y[n - 1], self.chol[n - 1])
        for m in range(n - 2, -1, -1):  # backward: x_m = S_m^-1 y_m - W_m x_{m+1}
            x[m] = torch.cholesky_solve(y[m], self.chol[m]) - self.coupling[m] @ x[m + 1]
        return torch.stack(x).reshape(shape)


def _cholesky(a: torch.Tensor) -> torch.Tensor:
    """Cholesky of an SPD block; a block that rounding made indefinite gets the smallest jitter
    (relative 1e-14, growing tenfold) that factors it."""
    chol, info = torch.linalg.cholesky_ex(a)
    jitter = 1e-14 * float(a.diagonal().abs().max())
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    while int(info) != 0:
        chol, info = torch.linalg.cholesky_ex(a + jitter * eye)
        jitter *= 10
    return chol


def dense_metrics(metric: Metric, z: torch.Tensor) -> torch.Tensor:
    """G at each of the states z [N, d]: [N, d, d]."""
    return torch.stack([metric.dense(x) for x in z])


def frozen_metric_hessian(metric: Metric, points: torch.Tensor, rule: str = "left") -> BlockTridiagonal:
    """The Hessian of the action in the interior points with each segment's metric G_k = G(c_k) held
    fixed: diagonal blocks 2 (G_{m-1} + G_m), blocks -2 G_m beside them (the discrete Laplacian
    weighted by G). It is exact for a constant metric, whatever its condition, and SPD; Newton-CG's
    preconditioner and the weight of the metric-weighted residual."""
    g = dense_metrics(metric, _evaluation_points(points, rule).detach())  # [K, d, d]
    return BlockTridiagonal(2 * (g[:-1] + g[1:]), -2 * g[1:-1])


def _decrement(hessian: BlockTridiagonal, gradient: torch.Tensor, action: float) -> float:
    """sqrt(g^T P^-1 g / S): the metric-weighted residual of the discrete geodesic equation."""
    value = float(gradient @ hessian.solve(gradient))
    return math.sqrt(max(value, 0.0) / action) if action > 0 else math.sqrt(max(value, 0.0))


def _newton(
    action, x: torch.Tensor, gtol: float, max_iter: int, precondition=None, decrement_tol=0.0, max_hvp=None
) -> tuple[torch.Tensor, int, int]:
    """Newton's method on the interior points x, globalised by a trust region.

    Small problems: the exact Hessian, and a step halved until it lowers the action or the gradient
    norm. Large ones: a trust region in the norm of ``precondition(x)`` (a :class:`BlockTridiagonal`
    P, rebuilt at every iterate), with the Steihaug-Toint truncated conjugate gradients on exact
    Hessian-vector products (forward over reverse) preconditioned by P: the step stops at the
    region's boundary, at negative curvature, or when the model gradient's P^-1-norm has fallen
    by the forcing term. The radius shrinks by 4 when the action falls by less than a quarter of
    the quadratic model's prediction and doubles when the step reached the boundary and the
    prediction held. Returns (x, iterations, Hessian-vector products)."""
    from torch.func import grad, hessian, jvp

    n = x.numel()

    def f(flat):
        return action(flat.view_as(x))

    g = grad(f)
    flat = x.reshape(-1).clone()
    hvps, radius = 0, None
    gk, base = g(flat), float(f(flat))
    for it in range(1, max_iter + 1):
        gnorm = float(gk.norm())
        p = precondition(flat) if precondition is not None else None
        decrement = _decrement(p, gk, base) if p is not None else 0.0
        if gnorm <= max(gtol, 1e-14) and decrement <= decrement_tol:
            return flat.view_as(x), it - 1, hvps
        if max_hvp is not None and hvps >= max_hvp:
            return flat.view_as(x), it - 1, hvps
        if n <= DENSE_NEWTON_MAX or p is None:
            h = hessian(f)(flat)
            step = torch.linalg.solve(h + 1e-14 * torch.eye(n, dtype=x.dtype, device=x.device), gk)
            t = 1.0
            while t > 1e-10:
                trial = flat - t * step
                if float(f(trial)) <= base or float(g(trial).norm()) < gnorm:
                    break
                t *= 0.5
            else:
                return flat.view_as(x), it - 1, hvps  # no step lowers either: stop, unconverged
            flat = flat - t * step
            gk, base = g(flat), float(f(flat))
            continue
        if radius is None:
            radius = math.sqrt(base)  # a first step may change the path by its own action's scale
        hvp = lambda v, at=flat: jvp(g, (at,), (v,))[1]  # noqa: E731
        budget = 200 if max_hvp is None else max(1, min(200, max_hvp - hvps))
        step, predicted, on_boundary, used = _steihaug(hvp, gk, p, radius, min(0.5, math.sqrt(decrement)), budget)
        hvps += used
        trial = flat + step
        value = float(f(trial))
        g_trial = g(trial) if math.isfinite(value) else None
        ratio = (base - value) / predicted if predicted > 0 and math.isfinite(value) else -1.0
        if ratio < 0.25:
            radius *= 0.25
        elif ratio > 0.75 and on_boundary:
            radius *= 2.0
        lower_gradient = (
            g_trial is not None and value <= base * (1 + 1e-12) and _decrement(p, g_trial, value) < decrement
        )
        if ratio > 1e-4 or lower_gradient:  # near the minimiser the action's rounding hides what the gradient shows
            flat, gk, base = trial, g_trial, value
        if radius < 1e-14 * math.sqrt(max(base, 1e-300)):
            return flat.view_as(x), it, hvps  # the region collapsed: stop, unconverged
    return flat.view_as(x), max_iter, hvps


def _steihaug(hvp, g: torch.Tensor, p: BlockTridiagonal, radius: float, forcing: float, max_iter: int):
    """Steihaug-Toint: approximately minimise g^T s + 1/2 s^T H s over |s|_P <= radius by conjugate
    gradients preconditioned by P. Returns (s, the model's predicted decrease, whether s is on the
    boundary, Hessian-vector products used)."""
    s = torch.zeros_like(g)
    r = g.clone()
    y = p.solve(r)
    d = -y
    ry = float(r @ y)
    target = forcing**2 * ry
    used, model = 0, 0.0

    def to_boundary(s, d):
        ss, sd, dd = float(s @ p.matvec(s)), float(s @ p.matvec(d)), float(d @ p.matvec(d))
        tau = (-sd + math.sqrt(max(sd * sd + dd * (radius**2 - ss), 0.0))) / max(dd, 1e-300)
        return s + tau * d

    def predicted(s):
        return -float(g @ s + 0.5 * (s @ hvp_s(s)))

    cache = {}

    def hvp_s(s):  # the model's curvature at the final step: one more product, only on a boundary exit
        cache["n"] = cache.get("n", 0) + 1
        return hvp(s)

    for _ in range(max_iter):
        hd = hvp(d)
        used += 1
        curvature = float(d @ hd)
        if curvature <= 0:
            s = to_boundary(s, d)
            pred = predicted(s)
            return s, pred, True, used + cache["n"]
        alpha = ry / curvature
        s_next = s + alpha * d
        if float(s_next @ p.matvec(s_next)) >= radius**2:
            s = to_boundary(s, d)
            pred = predicted(s)
            return s, pred, True, used + cache["n"]
        model += -alpha * ry + 0.5 * alpha**2 * curvature  # m(s + a d) - m(s) = a d^T r + 1/2 a^2 d^T H d
        s = s_next
        r = r + alpha * hd
        y = p.solve(r)
        ry_new = float(r @ y)
        if ry_new <= target:
            return s, -model, False, used
        d = -y + (ry_new / ry) * d
        ry = ry_new
    return s, -model, False, used


def path_versus_geodesic(metric: Metric, path: torch.Tensor, rule: str = "left", **solver) -> dict:
    """The discrete action of ``path`` [K + 1, d] against the geodesic between its endpoints with the
    same K: {'path_action', 'path_length', 'straight_line_action', 'geodesic' (with the last
    iterate's action as an upper bound on the minimum, and its largest state norm), 'action_ratio' (None unless the
    solve converged)}."""
    path_action = float(discrete_action(metric, path, rule))
    geo = solve_geodesic(metric, path[0], path[-1], path.shape[0] - 1, rule=rule, **solver)
    ratio = path_action / geo.action if geo.converged and geo.action and geo.action > 0 else None
    s = torch.linspace(0, 1, path.shape[0], dtype=path.dtype, device=path.device).unsqueeze(1)
    line = (1 - s) * path[0] + s * path[-1]
    return {
        "path_action": path_action,
        "path_length": float(segment_lengths(metric, path, rule).sum()),
        "straight_line_action": float(discrete_action(metric, line, rule)),
        "geodesic": {
            **geo.as_dict(),
            # any path's action bounds the discrete minimum from above: the last iterate's, converged or not
            "action_upper_bound": float(discrete_action(metric, geo.points, rule)),
            "state_norm_max": float(geo.points.norm(dim=-1).max()),
        },
        "action_ratio": ratio,
    }
