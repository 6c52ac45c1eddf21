r"""Degenerate diagonal-plus-low-rank metrics: exact kernel, damped pseudo-inverse, numerical rank
(``docs/geometry.md`` section 1).

The metric is G = diag(gamma) + U U^T with gamma >= 0 and U of shape [d, r]. Where the floor of
gamma vanishes (the set Z = {k : gamma_k = 0}, as the construction gives it, no threshold), G has
a genuine kernel

    ker G = {v : v_k = 0 for k not in Z,  U_Z^T v_Z = 0},

because both terms are positive semi-definite. Its dimension is |Z| - rank(U_Z); the exact rank of
G is d - |Z| + rank(U_Z), where rank(U_Z) is r when U_Z has full column rank (the generic case; we
check it with the singular values of the |Z| x r block and report the margin).

The damped pseudo-inverse used for naturalisation is

    G^+_lambda = sum over the nonzero eigenpairs (sigma_i, q_i) of q_i q_i^T / (sigma_i + lambda),

which is (G + lambda I)^{-1} on the range of G and zero on its kernel, and tends to the
Moore-Penrose inverse as lambda -> 0. It is applied without forming G: since G + lambda I + P_ker
leaves the range and the kernel invariant,

    G^+_lambda v = (G + lambda I + P_ker)^{-1} P_range v,

and G + lambda I + P_ker = diag(gamma + lambda + 1_Z) + [U, Q_Z] diag(I_r, -I_k) [U, Q_Z]^T
(Q_Z an orthonormal basis of col(U_Z), embedded in R^d) is inverted by the general Woodbury identity.
The cost is O(d (r + k)^2) per vector; it is exact for every lambda >= 0, lambda = 0 included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drmlab.ops import metric_dense

__all__ = [
    "RANK_TOLERANCES",
    "KernelSplit",
    "damped_pinv_apply",
    "exact_rank",
    "kernel_basis",
    "kernel_project",
    "kernel_split",
    "naturalize_degenerate",
    "numerical_rank",
]

# Relative tolerances at which numerical ranks are reported (each labelled approximate).
RANK_TOLERANCES = (1e-2, 1e-4, 1e-6)


@dataclass
class KernelSplit:
    """The exact kernel structure of one G = diag(gamma) + U U^T (gamma >= 0, d x r U).

    ``zero``: the floor's zero set Z (bool [d]); ``basis_z``: Q_Z [|Z|, k], orthonormal basis of
    col(U_Z); ``kernel_z``: [|Z|, |Z| - k], orthonormal basis of its complement in R^Z, i.e. the
    kernel of G restricted to Z; ``margin``: the smallest kept singular value of U_Z over the
    largest (1.0 when k = 0): how far U_Z is from losing a column.
    """

    zero: torch.Tensor
    basis_z: torch.Tensor
    kernel_z: torch.Tensor
    margin: float

    @property
    def kernel_dim(self) -> int:
        return int(self.kernel_z.shape[1])

    @property
    def rank(self) -> int:
        return int(self.zero.numel() - self.kernel_dim)


def _check(gamma: torch.Tensor, U: torch.Tensor) -> None:
    if gamma.dim() != 1 or U.dim() != 2 or U.shape[0] != gamma.shape[0]:
        raise ValueError(f"expected gamma [d] and U [d, r], got {tuple(gamma.shape)} and {tuple(U.shape)}")
    if bool((gamma < 0).any()):
        raise ValueError("gamma must be >= 0: G = diag(gamma) + U U^T is then positive semi-definite")


def kernel_split(gamma: torch.Tensor, U: torch.Tensor, rank_rtol: float | None = None) -> KernelSplit:
    """The exact kernel of diag(gamma) + U U^T for one metric (gamma [d] >= 0, U [d, r]).

    rank(U_Z) is decided on the singular values of the |Z| x r block with relative tolerance
    ``rank_rtol`` (default: max(|Z|, r) x machine epsilon, the LAPACK convention); for a U_Z of full
    column rank this is exact, and ``margin`` says by how much.
    """
    _check(gamma, U)
    zero = gamma == 0
    u_z = U[zero]
    nz, r = u_z.shape
    if nz == 0 or r == 0:
        return KernelSplit(zero, u_z.new_zeros(nz, 0), torch.eye(nz, dtype=U.dtype, device=U.device), 1.0)
    left, sv, _ = torch.linalg.svd(u_z, full_matrices=True)
    rtol = rank_rtol if rank_rtol is not None else max(nz, r) * torch.finfo(U.dtype).eps
    keep = int((sv > rtol * sv[0]).sum()) if float(sv[0]) > 0 else 0
    margin = float(sv[keep - 1] / sv[0]) if keep else 1.0
    return KernelSplit(zero, left[:, :keep], left[:, keep:], margin)


def kernel_basis(gamma: torch.Tensor, U: torch.Tensor, split: KernelSplit | None = None) -> torch.Tensor:
    """An orthonormal basis [d, m] of ker G (m = |Z| - rank(U_Z)); G K = 0 up to rounding."""
    split = split or kernel_split(gamma, U)
    basis = U.new_zeros(gamma.shape[0], split.kernel_dim)
    basis[split.zero] = split.kernel_z
    return basis


def kernel_project(v: torch.Tensor, split: KernelSplit) -> torch.Tensor:
    """P_ker v for v [..., d]: the Z-coordinates minus their part in col(U_Z); zero elsewhere."""
    out = torch.zeros_like(v)
    vz = v[..., split.zero]
    q = split.basis_z
    out[..., split.zero] = vz - (vz @ q) @ q.mT
    return out


def exact_rank(gamma: torch.Tensor, U: torch.Tensor) -> int:
    """rank(G) = d - |Z| + rank(U_Z) (section 1); d when the floor is strictly positive."""
    return kernel_split(gamma, U).rank


def damped_pinv_apply(
    gamma: torch.Tensor, U: torch.Tensor, v: torch.Tensor, damping: float = 0.0, split: KernelSplit | None = None
) -> torch.Tensor:
    """G^+_lambda v for v [..., d] (the module docstring's formula); damping lambda >= 0."""
    if damping < 0:
        raise ValueError(f"damping must be >= 0, got {damping}")
    split = split or kernel_split(gamma, U)
    d = gamma.shape[0]
    v_range = v - kernel_project(v, split)
    delta = gamma + damping + split.zero.to(gamma.dtype)  # > 0 everywhere
    q = U.new_zeros(d, split.basis_z.shape[1])
    q[split.zero] = split.basis_z
    a = torch.cat([U, q], dim=1)  # [d, r + k]
    sign = torch.cat([U.new_ones(U.shape[1]), -U.new_ones(q.shape[1])])
    if a.shape[1] == 0:
        return v_range / delta
    w = v_range / delta
    a_d = a / delta.unsqueeze(-1)
    capacitance = torch.diag(1.0 / sign) + a.mT @ a_d  # S^-1 + A^T D^-1 A
    rhs = (w @ a).reshape(-1, a.shape[1])  # [N, r + k]
    x = torch.linalg.solve(capacitance, rhs.mT).mT.reshape(*w.shape[:-1], a.shape[1])
    return w - x @ a_d.mT


def naturalize_degenerate(
    u: torch.Tensor, gamma: torch.Tensor, U: torch.Tensor, strength: float, damping: float
) -> torch.Tensor:
    """Naturalisation through the damped pseudo-inverse: (1 - s) u + s G^+_lambda u.

    The kernel part of u is removed by the pseudo-inverse (a direction of zero cost carries no
    metric information), unlike (G + lambda I)^-1, which would amplify it by 1 / lambda."""
    if strength <= 0:
        return u
    return (1.0 - strength) * u + strength * damped_pinv_apply(gamma, U, u, damping)


def numerical_rank(eigenvalues: torch.Tensor, tolerances=RANK_TOLERANCES) -> dict[str, torch.Tensor]:
    """Approximate ranks of PSD matrices from their eigenvalues [..., d]: for each relative tolerance
    tau, #{sigma_i > tau max_j sigma_j}. The keys name the tolerance ('rank_rtol_1e-04'): a
    numerical rank is an approximation, never the exact rank of a degenerate metric."""
    top = eigenvalues.amax(-1, keepdim=True).clamp_min(torch.finfo(eigenvalues.dtype).tiny)
    return {f"rank_rtol_{tau:.0e}": (eigenvalues > tau * top).sum(-1) for tau in tolerances}


def dense(gamma: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The dense G = diag(gamma) + U U^T (exactly symmetric)."""
    return metric_dense(gamma, U)
