"""Float64 numpy reference of the resolvent operator (``docs/resolvent.md`` sections 1-4): one causal
head with switches ``(beta, qk, g)``, evaluated by the rules of section 4 (path products accumulated
from ``k = i`` down, complex arithmetic on real lanes, a log-domain normaliser, the refusals as
:class:`NonFinite`), so that every number is reproducible by a plain Python loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = [
    "Switches",
    "NonFinite",
    "blend",
    "gate",
    "path_product",
    "operator",
    "readout",
    "chain_label",
]


class NonFinite(ArithmeticError):
    """Refusal of a non-finite input, blended phase or logit (``docs/resolvent.md`` section 4)."""


@dataclass(frozen=True)
class Switches:
    """The three switches of the head: ``beta`` (normaliser power), ``qk`` (content scale on the
    logit) and ``g`` (gate blend)."""

    beta: float
    qk: float
    g: float

    SOFTMAX: ClassVar[Switches]
    UNNORMALIZED_KERNEL: ClassVar[Switches]
    PATH_PRODUCT: ClassVar[Switches]


Switches.SOFTMAX = Switches(beta=1.0, qk=1.0, g=0.0)
Switches.UNNORMALIZED_KERNEL = Switches(beta=0.0, qk=1.0, g=0.0)
Switches.PATH_PRODUCT = Switches(beta=0.0, qk=0.0, g=1.0)


def _lerp(start, end, weight):
    """``lerp(start, end, weight)``, exact at both ends (``weight`` 0 gives ``start``, 1 gives
    ``end``): the two-sided formula that ``torch.lerp`` uses."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    low = start + weight * (end - start)
    high = end - (end - start) * (1.0 - weight)
    return np.where(np.abs(weight) < 0.5, low, high)


def blend(u, theta, g):
    """Blended gate ``(m, theta') = (clamp(lerp(1, u, g), 0, 1), g * theta)``.

    The clamp comes after the lerp, so ``g > 1`` never yields a negative magnitude. Scalars in,
    Python floats out; arrays in, float64 arrays out (elementwise). No refusal here: the operator
    refuses non-finite results.
    """
    scalar = np.ndim(u) == 0 and np.ndim(theta) == 0 and np.ndim(g) == 0
    with np.errstate(all="ignore"):
        m = np.clip(_lerp(1.0, u, g), 0.0, 1.0)
        th = np.asarray(g, dtype=np.float64) * np.asarray(theta, dtype=np.float64)
    if scalar:
        return float(m), float(th)
    return m, th


def gate(m, theta):
    """The gate ``a = m e^{i theta} = m cos(theta) + i m sin(theta)`` (complex; complex128 array
    for array input). ``(1, pi)``, ``(0, 0)``, ``(1, 0)`` are the gates -1, 0, +1."""
    scalar = np.ndim(m) == 0 and np.ndim(theta) == 0
    m = np.asarray(m, dtype=np.float64)
    theta = np.asarray(theta, dtype=np.float64)
    with np.errstate(all="ignore"):
        re = m * np.cos(theta)
        im = m * np.sin(theta)
    if scalar:
        return complex(float(re), float(im))
    out = np.empty(np.broadcast(re, im).shape, dtype=np.complex128)
    out.real = re
    out.imag = im
    return out


def _path_lanes(ar: np.ndarray, ai: np.ndarray):
    """Path product on real lanes: ``G[i, j] = G[i, j+1] * a[j+1]`` along each sub-diagonal, i.e.
    the product accumulated from ``k = i`` down to ``k = j + 1``. ``a[0]`` is never read."""
    n = ar.shape[0]
    gr = np.zeros((n, n), dtype=np.float64)
    gi = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    gr[idx, idx] = 1.0
    with np.errstate(all="ignore"):
        for d in range(1, n):
            i = idx[d:]
            j = i - d
            pr = gr[i, j + 1]
            pi = gi[i, j + 1]
            br = ar[j + 1]
            bi = ai[j + 1]
            gr[i, j] = pr * br - pi * bi
            gi[i, j] = pr * bi + pi * br
    return gr, gi


def _modulus_products(m: np.ndarray) -> np.ndarray:
    """``R[i, j] = prod_{k=j+1..i} m_k`` accumulated from ``k = i`` down (real)."""
    n = m.shape[0]
    r = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    r[idx, idx] = 1.0
    with np.errstate(all="ignore"):
        for d in range(1, n):
            i = idx[d:]
            j = i - d
            r[i, j] = r[i, j + 1] * m[j + 1]
    return r


def path_product(a) -> np.ndarray:
    """Path product ``G[i, j] = prod_{k=j+1..i} a_k`` (``G[i, i] = 1``, ``G[i, j] = 0`` for
    ``j > i``) of a complex gate sequence ``a`` of length ``n``: complex128 ``[n, n]``.

    Accumulated from ``k = i`` down to ``k = j + 1``; ``a[0]`` is never read.
    """
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"path_product expects a 1-D gate sequence, got shape {a.shape}")
    a = a.astype(np.complex128, copy=False)
    gr, gi = _path_lanes(np.ascontiguousarray(a.real), np.ascontiguousarray(a.imag))
    out = np.empty(gr.shape, dtype=np.complex128)
    out.real = gr
    out.imag = gi
    return out


def _as_float64(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind == "c":
        raise ValueError(f"{name} must be real")
    return arr.astype(np.float64, copy=False)


def _logits(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``s[i, j] = (sum_t q[i, t] k[j, t]) / sqrt(d)``, the sum accumulated sequentially over t."""
    n, d = q.shape
    acc = np.zeros((n, n), dtype=np.float64)
    with np.errstate(all="ignore"):
        for t in range(d):
            acc = acc + np.multiply.outer(q[:, t], k[:, t])
        return acc / math.sqrt(d)


def operator(q, k, u, theta, switches: Switches) -> np.ndarray:
    """The resolvent operator ``W``: complex128 ``[seq, seq]``, exactly 0 above the diagonal.

    ``q``, ``k``: real ``[seq, head_dim]``; ``u`` (raw gate magnitudes) and ``theta`` (phases):
    real ``[seq]``; ``switches``: :class:`Switches`. Raises :class:`NonFinite` on a non-finite
    input, switch, blended phase or causal logit, and :class:`ValueError` on a shape mismatch or
    ``head_dim = 0`` with ``seq > 0``.
    """
    q = _as_float64(q, "q")
    k = _as_float64(k, "k")
    u = _as_float64(u, "u")
    theta = _as_float64(theta, "theta")
    if q.ndim != 2:
        raise ValueError(f"q must be [seq, head_dim], got shape {q.shape}")
    if k.shape != q.shape:
        raise ValueError(f"k has shape {k.shape}, q has shape {q.shape}")
    n, d = q.shape
    if u.shape != (n,) or theta.shape != (n,):
        raise ValueError(f"u and theta must be [{n}], got {u.shape} and {theta.shape}")
    if n > 0 and d == 0:
        raise ValueError("head_dim = 0 with a non-empty sequence")

    beta, qk, g = (float(switches.beta), float(switches.qk), float(switches.g))
    if not (math.isfinite(beta) and math.isfinite(qk) and math.isfinite(g)):
        raise NonFinite("non-finite switch")
    for name, arr in (("q", q), ("k", k), ("u", u), ("theta", theta)):
        if not np.isfinite(arr).all():
            raise NonFinite(f"non-finite {name}")
    if n == 0:
        return np.zeros((0, 0), dtype=np.complex128)

    m, th = blend(u, theta, g)
    if not np.isfinite(th).all():
        raise NonFinite("blended phase g * theta overflows")
    with np.errstate(all="ignore"):
        ar = m * np.cos(th)
        ai = m * np.sin(th)
    gr, gi = _path_lanes(ar, ai)
    r = _modulus_products(m)

    causal = np.tril(np.ones((n, n), dtype=bool))
    if qk == 0.0:
        logit = np.zeros((n, n), dtype=np.float64)
    else:
        with np.errstate(all="ignore"):
            logit = qk * _logits(q, k)
        if not np.isfinite(logit[causal]).all():
            raise NonFinite("logit qk * s_ij overflows")

    live = causal & (r > 0.0)
    with np.errstate(all="ignore"):
        x = np.where(live, np.log(np.where(live, r, 1.0)) + logit, -np.inf)
        row_max = x.max(axis=1)  # finite: the diagonal is live in every row
        log_z = row_max + np.log(np.exp(x - row_max[:, None]).sum(axis=1))
        arg = np.where(causal, logit - beta * log_z[:, None], 0.0)
        scale = np.exp(arg)
        # Where exp(arg) overflows but G is small, the true value may still be finite:
        # evaluate (G e^{arg/2}) e^{arg/2}, which reads +-inf only when the true value does.
        over = np.isinf(scale)
        half = np.exp(np.where(over, 0.5 * arg, 0.0))
        wr = np.where(over, (gr * half) * half, gr * scale)
        wi = np.where(over, (gi * half) * half, gi * scale)
    # Dead entries are exactly 0; a lane of G that is exactly 0 keeps its (signed) zero.
    out = np.zeros((n, n), dtype=np.complex128)
    out.real = np.where(live & (gr != 0.0), wr, np.where(gr == 0.0, gr, 0.0))
    out.imag = np.where(live & (gi != 0.0), wi, np.where(gi == 0.0, gi, 0.0))
    return out


def readout(w, v) -> np.ndarray:
    """Readout ``O_i = sum_{j<=i} W_ij V_j``: complex ``w [seq, seq]``, real ``v [seq, value_dim]``
    -> complex128 ``[seq, value_dim]``. Not guarded against infinite entries of ``w``."""
    w = np.asarray(w).astype(np.complex128, copy=False)
    v = _as_float64(v, "v")
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"w must be [seq, seq], got shape {w.shape}")
    if v.ndim != 2 or v.shape[0] != w.shape[0]:
        raise ValueError(f"v must be [{w.shape[0]}, value_dim], got shape {v.shape}")
    out = np.empty((w.shape[0], v.shape[1]), dtype=np.complex128)
    out.real = np.ascontiguousarray(w.real) @ v
    out.imag = np.ascontiguousarray(w.imag) @ v
    return out


def chain_label(a, b) -> np.ndarray:
    """The gated chain ``y_0 = 0, y_i = a_i y_{i-1} + b_i``: complex ``a [n]``, real ``b [n]`` ->
    complex128 ``[n]``. ``a_0`` and ``b_0`` are not read."""
    a = np.asarray(a).astype(np.complex128, copy=False)
    b = _as_float64(b, "b")
    if a.ndim != 1 or b.shape != a.shape:
        raise ValueError(f"a and b must be [n] of one length, got {a.shape} and {b.shape}")
    n = a.shape[0]
    yr = np.zeros(n, dtype=np.float64)
    yi = np.zeros(n, dtype=np.float64)
    ar = a.real.tolist()
    ai = a.imag.tolist()
    bl = b.tolist()
    pr = pi = 0.0
    for i in range(1, n):
        pr, pi = ar[i] * pr - ai[i] * pi + bl[i], ar[i] * pi + ai[i] * pr
        yr[i] = pr
        yi[i] = pi
    out = np.empty(n, dtype=np.complex128)
    out.real = yr
    out.imag = yi
    return out
