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
from dataclasses import dataclass

import torch

__all__ = [
    "DenseMetric",
    "LowRankMetric",
    "Metric",
    "christoffel",
    "christoffel_contract",
    "christoffel_contract_functional",
    "geodesic_residual",
    "holonomy_angle",
    "parallelogram",
    "polyline",
    "schild_transport",
    "sectional_curvature",
    "small_loop_holonomy",
    "StepControl",
    "TransportResult",
    "metric_change",
    "schild_ladder",
    "transport",
    "transport_adaptive",
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

    def dense(self, z):
        gamma, u = self.fn(z)
        return torch.diag_embed(gamma) + u @ u.mT

    def christoffel_contract(self, z: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Gamma(z)[u, w] through the factors (the fast path of :func:`christoffel_contract`, equal to it):
        one graph of (gamma, U) at z; D_u G and D_w G from it by the double-backward Jacobian-vector
        product, the gradient of u^T G w by one backward; (D_x G) y = (D_x gamma) y + (D_x U)(U^T y)
        + U ((D_x U)^T y). Not usable under vmap (it calls autograd)."""
        with torch.enable_grad():
            x = z.detach().requires_grad_(True)
            gamma, big_u = self.fn(x)
            flat = torch.cat([gamma, big_u.reshape(-1)])
            dummy = torch.zeros_like(flat, requires_grad=True)
            (pulled,) = torch.autograd.grad(flat, x, dummy, create_graph=True)
            d_u = torch.autograd.grad(pulled, dummy, u, retain_graph=True)[0]
            d_w = torch.autograd.grad(pulled, dummy, w, retain_graph=True)[0]
            energy = (u * (gamma * w + big_u @ (big_u.mT @ w))).sum()
            (grad_energy,) = torch.autograd.grad(energy, x)
        d = z.shape[-1]
        gamma, big_u = gamma.detach(), big_u.detach()

        def derivative(t, y):  # (D_t G) y from the tangent t = (D gamma, D U) of the factors
            dg, du = t[:d], t[d:].view_as(big_u)
            return dg * y + du @ (big_u.mT @ y) + big_u @ (du.mT @ y)

        rhs = 0.5 * (derivative(d_u, w) + derivative(d_w, u) - grad_energy)
        from drmlab.ops import woodbury_solve

        return woodbury_solve(gamma, big_u, rhs.unsqueeze(0))[0]


def christoffel(metric: Metric, z: torch.Tensor) -> torch.Tensor:
    """Gamma[l, i, j] = Gamma^l_ij at z [d] (second kind, symmetric in i, j): [d, d, d]."""
    from torch.func import jacfwd

    dg = jacfwd(metric.dense)(z)  # dg[i, j, k] = d_k g_ij
    first = 0.5 * (dg.permute(0, 2, 1) + dg - dg.permute(2, 0, 1))  # [m, i, j]: d_i g_mj + d_j g_mi - d_m g_ij
    first = 0.5 * (first + first.transpose(1, 2))
    return torch.linalg.solve(metric.dense(z), first.reshape(z.shape[0], -1)).reshape(first.shape)


def christoffel_contract(metric: Metric, z: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Gamma(z)[u, w] (a vector [d]) without the d^3 tensor: 2 JVPs + 1 VJP through ``metric.apply``
    (a metric with its own ``christoffel_contract``, :class:`LowRankMetric`, takes its fast path)."""
    fast = getattr(metric, "christoffel_contract", None)
    if fast is not None:
        return fast(z, u, w)
    return christoffel_contract_functional(metric, z, u, w)


def christoffel_contract_functional(metric: Metric, z: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The reference form of :func:`christoffel_contract`: torch.func JVPs and a VJP through ``metric.apply``."""
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


# --- step control in G-length (docs/geometry.md section 4, "Step control") ---------------------------------

# Dormand-Prince 5(4): nodes, stages, the fifth-order weights (the last stage's row: first same as last) and
# the embedded fourth-order ones
_DP_C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_DP_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_DP_B4 = (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)


@dataclass
class StepControl:
    """How finely a path is cut for transport and the ladder (docs/geometry.md section 4).

    A sub-step from x0 to x1 is taken only when (a) its G-length |x1 - x0|_G(x0) <= ``max_g_length``
    (None: no bound), (b) the metric changes along it by at most ``max_metric_change``, measured on
    the vectors carried and the step itself: |C1_ij - C0_ij| <= max_metric_change sqrt(C0_ii C0_jj)
    for C = W^T G W, W = [A, x1 - x0] (:func:`metric_change`), and (c) for the ODE, the Dormand-Prince local error, in
    the G-norm per column and relative, is <= ``rtol``. At most ``max_substeps`` attempts in all:
    beyond them the result says so and carries no number."""

    rtol: float = 1e-8
    max_metric_change: float = 0.1
    max_g_length: float | None = None
    max_substeps: int = 2000
    max_correction: float = 0.1  # the ladder: |Gamma[v, v]|_G / 2 <= this x |v|_G for the second-order exp and log

    def __post_init__(self):
        for name in ("rtol", "max_metric_change", "max_correction"):
            if not getattr(self, name) > 0:
                raise ValueError(f"StepControl.{name} must be > 0, got {getattr(self, name)}")
        if self.max_g_length is not None and not self.max_g_length > 0:
            raise ValueError(f"StepControl.max_g_length must be > 0 or None, got {self.max_g_length}")
        if self.max_substeps < 1:
            raise ValueError(f"StepControl.max_substeps must be >= 1, got {self.max_substeps}")

    def cap_reason(self, unit: str, attempts: int, segment: int, segments: int, s: float, h: float, stalled: str):
        """None while ``attempts`` (sub-steps or rungs, accepted and rejected) are within budget; else why the
        walk stops: the cap reached, or, after 20 attempts, a rate that projects past 100x the cap (the
        projection is stated; ``stalled`` when no progress was made)."""
        done = (segment + s) / segments
        projected = attempts / done if done > 0 else math.inf
        if attempts < self.max_substeps and (attempts < 20 or projected <= 100 * self.max_substeps):
            return None
        return (
            f"{unit} cap ({self.max_substeps}): stopped after {attempts} attempts in segment {segment} of "
            f"{segments} at s = {s:.3g} with {unit} {h:.3g} of the segment; "
            + (f"at this rate the path needs about {projected:.2g} {unit}s" if done > 0 else stalled)
        )


@dataclass
class TransportResult:
    """``frame`` [d, m] (None unless ``completed``); sub-steps taken and rejected; the isometry defect
    |A^T G A (end) - A^T G A (start)|_F / |A^T G A (start)|_F (parallel transport keeps it 0); the
    reason when it did not complete."""

    frame: torch.Tensor | None
    completed: bool
    substeps: int
    rejected: int
    isometry_defect: float | None
    reason: str | None = None

    def as_dict(self) -> dict:
        return {
            "completed": self.completed,
            "substeps": self.substeps,
            "rejected": self.rejected,
            "isometry_defect": self.isometry_defect,
            "reason": self.reason,
        }


def _gram(metric, z, w):
    """W^T G(z) W for W [d, m]."""
    from torch.func import vmap

    gw = vmap(lambda c: metric.apply(z, c), in_dims=1, out_dims=1)(w)
    out = w.mT @ gw
    return 0.5 * (out + out.mT)


def metric_change(metric: Metric, x0: torch.Tensor, x1: torch.Tensor, vectors: torch.Tensor) -> float:
    """max_ij |C1_ij - C0_ij| / sqrt(C0_ii C0_jj), C_i = W^T G(x_i) W, W = vectors [d, m]: how much G
    changes from x0 to x1 as seen by those vectors, relative to their G-norms (0 for a constant
    metric; inf when a value is not finite or a vector has no G-norm)."""
    c0, c1 = _gram(metric, x0, vectors), _gram(metric, x1, vectors)
    norms = c0.diagonal().clamp_min(0).sqrt()
    if not bool(torch.isfinite(c1).all()) or not bool((norms > 0).all()):
        return math.inf
    return float(((c1 - c0).abs() / (norms.unsqueeze(0) * norms.unsqueeze(1))).max())


def _isometry_defect(metric, z0, a0, z1, a1) -> float:
    g0, g1 = _gram(metric, z0, a0), _gram(metric, z1, a1)
    return float((g1 - g0).norm() / g0.norm())


def _column_norms(metric, z, a):
    return _gram(metric, z, a).diagonal().clamp_min(0).sqrt()


def transport_adaptive(
    metric: Metric, points: torch.Tensor, frame: torch.Tensor, control: StepControl | None = None
) -> TransportResult:
    """Parallel transport of the columns of frame [d, m] along the polyline points [K + 1, d]:
    dA/ds = -Gamma(x(s))[x'(s), A] on each segment, by Dormand-Prince 5(4) sub-steps under
    :class:`StepControl` (G-length, metric change, local error; a capped number of attempts)."""
    control = control or StepControl()
    a = frame
    taken = rejected = 0
    h = 1.0
    for k in range(points.shape[0] - 1):
        p, delta = points[k], points[k + 1] - points[k]

        def rhs(s, a, p=p, delta=delta):
            return -_gamma_frame(metric, p + s * delta, delta, a, None)

        s, first = 0.0, None
        while 1.0 - s > 1e-12:
            capped = control.cap_reason("sub-step", taken + rejected, k, points.shape[0] - 1, s, h, "no progress")
            if capped is not None:
                return TransportResult(None, False, taken, rejected, None, capped)
            h = 1.0 - s if h >= (1.0 - s) * (1 - 1e-9) else h  # the last sub-step ends on the corner
            x0 = p + s * delta
            if control.max_g_length is not None:
                glen = float(metric.inner(x0, delta, delta)) ** 0.5
                h = min(h, control.max_g_length / max(glen, 1e-300))
            if h < 1e-15:
                return TransportResult(None, False, taken, rejected, None, f"sub-step underflow in segment {k}")
            change = metric_change(metric, x0, x0 + h * delta, torch.cat([a, (h * delta).unsqueeze(1)], dim=1))
            if change > control.max_metric_change:
                h *= 0.5 if math.isfinite(change) else 0.1
                rejected += 1
                continue
            stages = [first if first is not None else rhs(s, a)]
            for i in range(1, 7):
                inc = sum(c * st for c, st in zip(_DP_A[i], stages) if c != 0.0)
                stages.append(rhs(s + _DP_C[i] * h, a + h * inc))
            a5 = a + h * sum(c * st for c, st in zip(_DP_A[6], stages) if c != 0.0)
            a4 = a + h * sum(c * st for c, st in zip(_DP_B4, stages) if c != 0.0)
            scale = _column_norms(metric, x0, a).clamp_min(1e-300)
            err = float((_column_norms(metric, x0, a5 - a4) / scale).max())
            if not math.isfinite(err) or not bool(torch.isfinite(a5).all()):
                h *= 0.1
                rejected += 1
                first = stages[0]
                continue
            factor = 0.9 * (control.rtol / max(err, 1e-300)) ** 0.2
            if err <= control.rtol:
                a, s, taken = a5, (1.0 if h == 1.0 - s else s + h), taken + 1
                first = stages[6]  # first same as last
                h *= min(4.0, factor)
            else:
                rejected += 1
                first = stages[0]
                h *= max(0.1, factor)
    defect = _isometry_defect(metric, points[0], frame, points[-1], a)
    return TransportResult(a, True, taken, rejected, defect)


def _exp_checked(metric, x, v, limit):
    """(exp_x(v) to second order, whether its correction |Gamma[v, v]|_G / 2 is <= limit x |v|_G)."""
    corr = 0.5 * christoffel_contract(metric, x, v, v)
    ok = float(metric.inner(x, corr, corr)) <= (limit**2) * float(metric.inner(x, v, v))
    return x + v - corr, ok


def _log_checked(metric, x, y, limit):
    delta = y - x
    corr = 0.5 * christoffel_contract(metric, x, delta, delta)
    ok = float(metric.inner(x, corr, corr)) <= (limit**2) * float(metric.inner(x, delta, delta))
    return delta + corr, ok


def schild_ladder(
    metric: Metric, points: torch.Tensor, vector: torch.Tensor, control: StepControl | None = None, scale: float = 1.0
) -> TransportResult:
    """Schild's ladder (the rung of :func:`schild_transport`, norm restored each rung) along the polyline
    points [K + 1, d] with rungs cut by :class:`StepControl`: a rung from x to y is split in two until
    its G-length and the metric change (on [A, y - x]) are within bounds and every second-order exp
    and log it uses has a correction below ``max_correction`` of its argument (the maps' own validity);
    at most ``max_substeps`` rung attempts. ``frame`` of the result is the vector as [d, 1]."""
    control = control or StepControl()
    a_vec = vector
    taken = rejected = 0
    limit = control.max_correction
    segments = points.shape[0] - 1
    for k in range(segments):
        pending = [(0.0, 1.0)]  # rungs as parameter intervals of the segment, the next one last
        while pending:
            t0, t1 = pending.pop()
            capped = control.cap_reason("rung", taken + rejected, k, segments, t0, t1 - t0, "no rung accepted")
            if capped is not None:
                return TransportResult(None, False, taken, rejected, None, capped)
            x = points[k] + t0 * (points[k + 1] - points[k])
            y = points[k] + t1 * (points[k + 1] - points[k])
            step = float(metric.inner(x, y - x, y - x)) ** 0.5
            fine = control.max_g_length is None or step <= control.max_g_length
            fine = fine and metric_change(metric, x, y, torch.stack([a_vec, y - x], 1)) <= control.max_metric_change
            if fine:
                eps = scale * step / max(float(metric.inner(x, a_vec, a_vec)) ** 0.5, 1e-300)
                a, ok1 = _exp_checked(metric, x, eps * a_vec, limit)
                la, ok2 = _log_checked(metric, a, y, limit)
                mid, ok3 = _exp_checked(metric, a, 0.5 * la, limit)
                lm, ok4 = _log_checked(metric, x, mid, limit)
                b, ok5 = _exp_checked(metric, x, 2.0 * lm, limit)
                lb, ok6 = _log_checked(metric, y, b, limit)
                out = lb / eps
                fine = ok1 and ok2 and ok3 and ok4 and ok5 and ok6 and bool(torch.isfinite(out).all())
            if not fine:
                rejected += 1
                half = 0.5 * (t0 + t1)
                pending += [(half, t1), (t0, half)]  # the first half is popped first
                continue
            out = out * (metric.inner(x, a_vec, a_vec) / metric.inner(y, out, out)).sqrt()
            a_vec, taken = out, taken + 1
    defect = _isometry_defect(metric, points[0], vector.unsqueeze(1), points[-1], a_vec.unsqueeze(1))
    return TransportResult(a_vec.unsqueeze(1), True, taken, rejected, defect)


def small_loop_holonomy(
    metric: Metric,
    base: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    max_metric_change: float = 1e-2,
    side: float = 1.0,
    control: StepControl | None = None,
) -> dict:
    """Sectional curvature of span(u, w) at base from the holonomy of a square sized in G-length.

    (e1, e2) is the G-orthonormal pair of the plane; the loop is base -> +s e1 -> +s e2 -> -s e1 ->
    -s e2, so its sides have G-length s (at base) and its G-area is s^2. s starts at ``side`` and
    halves until the metric changes by at most ``max_metric_change`` on (e1, e2) at every corner (a
    loop small against the metric's variation) and s max_ij |Gamma(base)[e_i, e_j]|_G <= max_metric_change
    (a side bends the frame by at most that much). The angle is measured at s and s / 2 (area ratio 4):
    K(s) = angle / s^2 with error O(s), so the two estimates and their extrapolation 2 K(s/2) - K(s)
    are reported, ``consistent`` when they agree to 25 %. Angles within ``angle_resolution`` (ten times
    the transports' local error bound or isometry defect) are ``resolved: False``: zero within
    resolution (a flat plane), consistent by definition. A transport that does not complete gives no
    angle (None) and its reason; no angle is ever NaN."""
    control = control or StepControl(rtol=1e-10)
    e1, e2 = _orthonormal_pair(metric, base, u, w)
    plane = torch.stack([e1, e2], 1)
    bend = max(
        float(metric.inner(base, g, g)) ** 0.5
        for g in (christoffel_contract(metric, base, x, y) for x, y in ((e1, e1), (e1, e2), (e2, e2)))
    )
    s, halvings = side, 0
    while halvings < 80:
        corners = (base + s * e1, base + s * (e1 + e2), base + s * e2)
        small = s * bend <= max_metric_change  # a side turns the frame by <= max_metric_change (first order)
        if small and all(metric_change(metric, base, c, plane) <= max_metric_change for c in corners):
            break
        s, halvings = s / 2, halvings + 1
    else:
        return {"angle": None, "failed": f"no loop down to G-side {s:.3g} keeps the metric change within bounds"}
    rows = []
    for size in (s, s / 2):
        corners = torch.stack([base, base + size * e1, base + size * (e1 + e2), base + size * e2, base])
        result = transport_adaptive(metric, corners, e1.unsqueeze(1), control)
        if not result.completed:
            return {"angle": None, "side": size, "failed": result.reason, **result.as_dict()}
        out = result.frame[:, 0]
        angle = math.atan2(float(metric.inner(base, out, e2)), float(metric.inner(base, out, e1)))
        if not math.isfinite(angle):
            return {"angle": None, "side": size, "failed": "the transported vector is not finite"}
        rows.append({"side": size, "area": size**2, "angle": angle, "curvature": angle / size**2, **result.as_dict()})
    k1, k2 = rows[0]["curvature"], rows[1]["curvature"]
    # the angles' resolution: the transports' local error bound and their isometry defect, ten times over
    resolution = 10 * max([control.rtol] + [row["isometry_defect"] for row in rows])
    resolved = max(abs(rows[0]["angle"]), abs(rows[1]["angle"])) > resolution
    return {
        "angle": rows[0]["angle"],
        "side": s,
        "area": s**2,
        "curvature": k1,
        "curvature_half": k2,
        "curvature_extrapolated": 2 * k2 - k1,
        "angle_resolution": resolution,
        "consistent": abs(k1 - k2) <= 0.25 * max(abs(k1), abs(k2)) if resolved else True,
        "resolved": resolved,
        "halvings": halvings,
        "loops": rows,
    }
