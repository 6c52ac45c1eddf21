r"""The Levi-Civita connection of a metric (``docs/geometry.md`` section 4): the metric as the
instruments see it and its Christoffel symbols.

A metric is given as a :class:`Metric`: ``apply(z, v) = G(z) v`` (differentiable in z) and
``solve(z, w) = G(z)^{-1} w``, for one state z [d]. Two ways to the connection:

* :func:`christoffel` (small d): the full tensor Gamma^l_ij = 1/2 g^lm (d_i g_mj + d_j g_mi - d_m g_ij)
  from the forward-mode Jacobian of the dense metric, d^3 numbers.
* :func:`christoffel_contract` (any d): Gamma(z)[u, w] = g^-1 (1/2 (D_u G) w + 1/2 (D_w G) u
  - 1/2 grad_z (u^T G w)), two Jacobian-vector products and one vector-Jacobian product through the
  metric, never the d^3 tensor.

:func:`geodesic_residual` is the geodesic equation a + Gamma[v, v] on a discrete path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


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
