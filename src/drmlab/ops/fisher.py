r"""The Fisher information of a categorical pulled back through a Jacobian (``docs/geometry.md``
sections 3 and 9).

With logits l [V], p = softmax(l), F = diag(p) - p p^T (the Fisher-Rao metric in logit coordinates)
and J = dl/dz [V, d],

    G_pb = J^T F J = J^T diag(p) J - (J^T p)(J^T p)^T                         (``fisher_pullback``)
         = B^T B,   B = diag(sqrt p) (J - 1 p^T J)                             (``fisher_factor``)

since (I - p 1^T) diag(p) (I - 1 p^T) = diag(p) - p p^T when 1^T p = 1. sqrt p is taken as
exp(log_softmax(l) / 2), whose gradient stays finite where p underflows to 0.

Shapes: jac [*, V, d], logits [*, V].
"""

from __future__ import annotations

import torch

__all__ = ["fisher_pullback", "fisher_factor"]


def _check(jac: torch.Tensor, logits: torch.Tensor) -> None:
    if jac.dim() < 2 or jac.shape[:-1] != logits.shape:
        raise ValueError(f"expected jac [*, V, d] and logits [*, V], got {tuple(jac.shape)} and {tuple(logits.shape)}")


def fisher_pullback(jac: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """G_pb = J^T (diag p - p p^T) J [*, d, d], exactly symmetric."""
    _check(jac, logits)
    p = torch.softmax(logits, dim=-1)
    jp = (jac * p.unsqueeze(-1)).sum(-2)  # J^T p, [*, d]
    g = jac.mT @ (jac * p.unsqueeze(-1)) - jp.unsqueeze(-1) * jp.unsqueeze(-2)
    return 0.5 * (g + g.mT)


def fisher_factor(jac: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """B = diag(sqrt p) (J - 1 p^T J) [*, V, d], so that B^T B = G_pb."""
    _check(jac, logits)
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    centred = jac - (jac * p.unsqueeze(-1)).sum(-2, keepdim=True)  # J - 1 (p^T J)
    return (0.5 * log_p).exp().unsqueeze(-1) * centred
