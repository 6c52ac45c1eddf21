r"""The reference's refusals for the torch paths (``check_finite=True``; ``docs/resolvent.md``
section 6.5): the same :class:`~drmlab.resolvent.reference.NonFinite`, the same message, the same
order over every ``(b, h)`` slice.
"""

from __future__ import annotations

import math

import torch

from drmlab.resolvent.common import Switch, as_switch
from drmlab.resolvent.reference import NonFinite

__all__ = ["refuse_non_finite"]

# Elements of one logit chunk of the exact overflow check (float32: 16 MiB).
_CHECK_ELEMENTS = 1 << 22


def _all_finite(x: Switch) -> bool:
    if torch.is_tensor(x):
        return bool(torch.isfinite(x.detach()).all())
    return math.isfinite(float(x))


def _refuse_non_finite_inputs(q, k, magnitude, phase, beta, qk, g) -> None:
    if not (_all_finite(beta) and _all_finite(qk) and _all_finite(g)):
        raise NonFinite("non-finite switch")
    for name, x in (("q", q), ("k", k), ("u", magnitude), ("theta", phase)):
        if x is not None and not bool(torch.isfinite(x.detach()).all()):
            raise NonFinite(f"non-finite {name}")


def _suspect_slices(q, k, qk_t, cdt) -> torch.Tensor:
    """``[B, H]``: the slices whose logits might overflow. Every partial sum of ``q_i.k_j``, in any
    order of evaluation, is at most ``|q_i||k_j|``: when that bound (times ``|qk|``) is far inside
    the dtype's range, no logit can overflow. With ``qk = 0`` the logit is exactly 0."""
    q_norm = torch.linalg.vector_norm(q.detach().to(torch.float64), dim=-1).amax(-1)
    k_norm = torch.linalg.vector_norm(k.detach().to(torch.float64), dim=-1).amax(-1)
    bound = q_norm * k_norm * qk_t.to(torch.float64).abs().clamp_min(1.0)
    return (qk_t != 0) & ~(bound < torch.finfo(cdt).max / 4)


def _refuse_logit_overflow(q, k, qk_t, suspect, cdt) -> None:
    """The exact check of the suspect slices, over the causal logits in row chunks."""
    S, d = q.shape[-2:]
    qs, ks, scale = q.detach()[suspect].to(cdt), k.detach()[suspect].to(cdt), qk_t[suspect]
    rows = max(1, _CHECK_ELEMENTS // (qs.shape[0] * S))
    keys = torch.arange(S, device=q.device)
    for i0 in range(0, S, rows):
        i1 = min(S, i0 + rows)
        # the reference's order: s_ij = (q_i.k_j) / sqrt(d), then qk * s_ij
        logit = scale[:, None, None] * (torch.matmul(qs[:, i0:i1], ks[:, :i1].transpose(-1, -2)) / math.sqrt(d))
        causal = keys[None, :i1] <= torch.arange(i0, i1, device=q.device)[:, None]
        if not bool((torch.isfinite(logit) | ~causal).all()):
            raise NonFinite("logit qk * s_ij overflows")


@torch.no_grad()
def refuse_non_finite(q, k, magnitude, phase, beta, qk, g, cdt) -> None:
    """Raise :class:`NonFinite` where :func:`drmlab.resolvent.reference.operator` would refuse any
    ``(b, h)`` slice, with the reference's message, refusals taken in the reference's order."""
    _refuse_non_finite_inputs(q, k, magnitude, phase, beta, qk, g)
    B, H, S, _ = q.shape
    if S == 0:
        return
    if phase is not None:
        g_t = as_switch(g, B, H, cdt, q.device)
        if not bool(torch.isfinite(g_t[..., None] * phase.detach().to(cdt)).all()):
            raise NonFinite("blended phase g * theta overflows")
    qk_t = as_switch(qk, B, H, cdt, q.device).expand(B, H)
    suspect = _suspect_slices(q, k, qk_t, cdt)
    if bool(suspect.any()):
        _refuse_logit_overflow(q, k, qk_t, suspect, cdt)
