r"""The degenerate metric G = diag(d) + U U^T with d >= 0 (``docs/geometry.md`` section 8): its
kernel, its exact rank and its damped pseudo-inverse, batched and differentiable.

Z = {k : d_k = 0} is the floor's zero set, exactly as the construction gives it (no threshold).
Both terms of G are positive semi-definite, so

    ker G = {v : v_k = 0 outside Z,  U_Z^T v_Z = 0},      rank G = n - |Z| + rank(U_Z).

Here U_Z (the rows of U in Z) is taken to have its generic rank min(|Z|, r). Then
* |Z| <= r: U_Z has full row rank, col(U_Z) is all of R^Z and ker G = {0};
* |Z| > r: P_ker v = 1_Z v - A (A^T A)^{-1} A^T v with A = 1_Z U (the rows outside Z zeroed), an
  r x r Cholesky solve per sample.
A sample whose A^T A does not factor (U_Z below its generic rank) falls back, with the whole batch,
to the Moore-Penrose inverse of A^T A, which gives the same projector for any rank.

The damped pseudo-inverse G^+_lambda = sum over the nonzero eigenpairs q_i q_i^T / (sigma_i + lambda)
is (G + lambda I)^{-1} on range(G) and zero on ker G. Since G + lambda I leaves both invariant,

    G^+_lambda v = (G + lambda I)^{-1} (v - P_ker v),

one Woodbury solve (``woodbury_solve``; d + lambda > 0 needs lambda > 0) after the projection.
With a strictly positive floor, Z is empty and this is ``woodbury_solve`` exactly.

Shapes as :mod:`.diagonal_plus_low_rank`: d [*, n], U [*, n, r], v [*, L, n].
"""

from __future__ import annotations

import torch

from .diagonal_plus_low_rank import _check, woodbury_solve

__all__ = ["kernel_project", "pseudo_inverse_solve", "exact_rank"]


def exact_rank(d: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """rank G = n - |Z| + min(|Z|, r) per metric [*] (U_Z of generic rank; the module docstring)."""
    _check(d, U)
    zeros = (d == 0).sum(-1)
    return d.shape[-1] - zeros + zeros.clamp(max=U.shape[-1])


def _col_projection_solve(gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """(A^T A)^{-1} rhs by Cholesky; the whole batch uses the pseudo-inverse if a sample does not factor
    (both computed and selected without reading the values under ``torch.compile``)."""
    chol, info = torch.linalg.cholesky_ex(gram)
    if not torch.compiler.is_compiling() and not bool((info != 0).any()):
        return torch.cholesky_solve(rhs, chol)
    failed = (info != 0).any()
    r = gram.shape[-1]
    eye = torch.eye(r, dtype=gram.dtype, device=gram.device)
    chol, _ = torch.linalg.cholesky_ex(torch.where(failed, eye, gram))
    solved = torch.cholesky_solve(rhs, chol)
    # distinct eigenvalues keep the unused eigen-decomposition's gradient finite
    spread = torch.diag_embed(torch.arange(1, r + 1, dtype=gram.dtype, device=gram.device))
    pseudo = torch.linalg.pinv(torch.where(failed, gram, spread), hermitian=True) @ rhs
    return torch.where(failed, pseudo, solved)


def kernel_project(d: torch.Tensor, U: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """P_ker v, the orthogonal projection of v [*, L, n] onto ker G; zero where |Z| <= r."""
    _check(d, U)
    zero = (d == 0).to(v.dtype)  # [*, n]
    r = U.shape[-1]
    count = zero.sum(-1)  # |Z| [*]
    v_z = v * zero.unsqueeze(-2)
    if r == 0:
        return v_z
    has_kernel = count > r
    a = U * zero.unsqueeze(-1)  # [*, n, r]
    gram = a.mT @ a
    eye = torch.eye(r, dtype=gram.dtype, device=gram.device)
    gram = torch.where(has_kernel[..., None, None], 0.5 * (gram + gram.mT), eye)  # no kernel: a harmless matrix
    rhs = (v_z @ a).mT  # A^T v [*, r, L]
    batch = torch.broadcast_shapes(rhs.shape[:-2], gram.shape[:-2])
    x = _col_projection_solve(gram.expand(*batch, r, r), rhs.expand(*batch, *rhs.shape[-2:]))
    projected = v_z - (a @ x).mT
    return torch.where(has_kernel[..., None, None], projected, torch.zeros_like(projected))


def pseudo_inverse_solve(d: torch.Tensor, U: torch.Tensor, v: torch.Tensor, damping: float) -> torch.Tensor:
    """G^+_lambda v for v [*, L, n] (the module docstring), lambda = ``damping`` > 0."""
    if not damping > 0:
        raise ValueError(f"the damped pseudo-inverse needs damping > 0, got {damping!r}")
    return woodbury_solve(d, U, v - kernel_project(d, U, v), damping=damping)
