r"""Parallel transport, Schild's ladder and small-loop holonomy with the step cut in G-length
(``docs/geometry.md`` section 4, "Step control"): :class:`StepControl` bounds each sub-step's
G-length, the metric's change along it and (for the ODE) the Dormand-Prince 5(4) local error, and caps
the attempts; a walk beyond the cap says why and carries no number (:class:`TransportResult`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .christoffel import Metric, christoffel_contract
from .transport import _gamma_frame, _orthonormal_pair

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
