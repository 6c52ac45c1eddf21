r"""Diagonal-plus-low-rank metric algebra (``docs/drm.md`` sections 4 and 5).

The relational metric is  G = D + U U^T  with  D = diag(d),  d > 0,  U of shape [n, r].

* ``woodbury_solve``: (G + \lambda I)^{-1} v through the Woodbury identity

      (D' + U U^T)^{-1} = D'^{-1} - D'^{-1} U (I_r + U^T D'^{-1} U)^{-1} U^T D'^{-1},
      D' = D + \lambda I,

  with a Cholesky factorisation of the r x r capacitance matrix I_r + U^T D'^{-1} U (its
  eigenvalues are >= 1, so it is always well conditioned when d + \lambda > 0).
* ``metric_energy``:  E(v) = v^T G v = \sum_k d_k v_k^2 + ||U^T v||^2.
* ``metric_dense``:   the dense matrix G.
* ``coupling_matrix``: C = V G V^T, i.e. C_ij = V_i^T G V_j for the rows V_i of V.

Shapes: d [*, n], U [*, n, r] (r may be 0), v [*, L, n] (L vectors per batch element); leading
dimensions broadcast.
"""

from __future__ import annotations

import torch

__all__ = ["woodbury_solve", "metric_energy", "metric_dense", "coupling_matrix"]


def _check(d: torch.Tensor, U: torch.Tensor) -> None:
    if d.dim() < 1 or U.dim() < 2:
        raise ValueError(f"expected d [*, n] and U [*, n, r], got {tuple(d.shape)}, {tuple(U.shape)}")
    if U.shape[-2] != d.shape[-1]:
        raise ValueError(f"U [*, n, r] has n={U.shape[-2]}, d has n={d.shape[-1]}")


def woodbury_solve(
    d: torch.Tensor,
    U: torch.Tensor,
    v: torch.Tensor,
    damping: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    r"""(diag(d) + U U^T + damping I)^{-1} v for v [*, L, n]; returns [*, L, n].

    ``d + damping`` must be positive.  ``damping`` is a float or a tensor broadcastable to d
    (e.g. shape [*, 1]).  Differentiable in d, U, v (and a tensor damping).
    """
    _check(d, U)
    if v.dim() < 2 or v.shape[-1] != d.shape[-1]:
        raise ValueError(f"v must be [*, L, n] with n={d.shape[-1]}, got {tuple(v.shape)}")
    dd = d + damping  # [*, n]
    w = v / dd.unsqueeze(-2)  # D'^{-1} v, [*, L, n]
    r = U.shape[-1]
    if r == 0:
        return w
    Ud = U / dd.unsqueeze(-1)  # D'^{-1} U, [*, n, r]
    eye = torch.eye(r, dtype=U.dtype, device=U.device)
    cap = eye + U.mT @ Ud  # I + U^T D'^{-1} U, [*, r, r]
    cap = 0.5 * (cap + cap.mT)
    chol = torch.linalg.cholesky(cap)
    rhs = (w @ U).mT  # U^T D'^{-1} v, [*, r, L]
    batch = torch.broadcast_shapes(rhs.shape[:-2], chol.shape[:-2])
    x = torch.cholesky_solve(rhs.expand(*batch, *rhs.shape[-2:]), chol.expand(*batch, r, r))  # [*, r, L]
    return w - (Ud @ x).mT


def metric_energy(d: torch.Tensor, U: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r"""v^T G v = \sum_k d_k v_k^2 + ||U^T v||^2 for v [*, L, n]; returns [*, L]."""
    _check(d, U)
    diag = (v * v * d.unsqueeze(-2)).sum(-1)
    if U.shape[-1] == 0:
        return diag
    return diag + (v @ U).square().sum(-1)


def metric_dense(d: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The dense metric G = diag(d) + U U^T, [*, n, n], exactly symmetric: the product is
    symmetrised, since a BLAS need not return U U^T symmetric to the bit (seen on one CPU)."""
    _check(d, U)
    low_rank = U @ U.mT
    return torch.diag_embed(d) + 0.5 * (low_rank + low_rank.mT)


def coupling_matrix(V: torch.Tensor, d: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    r"""C = V G V^T for V [*, k, n] (rows are the directions V_i); returns [*, k, k],
    exactly symmetric."""
    _check(d, U)
    if V.shape[-1] != d.shape[-1]:
        raise ValueError(f"V must be [*, k, n] with n={d.shape[-1]}, got {tuple(V.shape)}")
    c = (V * d.unsqueeze(-2)) @ V.mT
    if U.shape[-1] > 0:
        vu = V @ U  # [*, k, r]
        c = c + vu @ vu.mT
    return 0.5 * (c + c.mT)
