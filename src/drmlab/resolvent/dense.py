r"""The ``dense`` path of the resolvent operator (``docs/resolvent.md`` section 6.2): the general
evaluation on ``[B, H, S, S]``, the exactness reference of the other torch paths, and
:func:`resolvent_weights`, the operator ``W`` itself.
"""

from __future__ import annotations

import math

import torch

from drmlab.resolvent.checks import refuse_non_finite
from drmlab.resolvent.common import Switch, as_switch, blend_gates, compute_dtype, gate_sums

__all__ = ["dense_resolvent", "resolvent_weights"]


def _dense_parts(q, k, magnitude, phase, beta, qk, g, cdt):
    """``|W|`` (masked, float cdt) and the phase difference (or None) on ``[B, H, S, S]``."""
    B, H, S, d = q.shape
    m, th = blend_gates(magnitude.to(cdt), None if phase is None else phase.to(cdt), g)
    L, start, theta = gate_sums(m, th)
    qc, kc = q.to(cdt), k.to(cdt)
    s = torch.matmul(qc, kc.transpose(-1, -2)) * (qk[..., None, None] / math.sqrt(d))
    bias = (L[..., :, None] - L[..., None, :]).to(cdt)
    i = torch.arange(S, device=q.device)
    live = (i[None, :] <= i[:, None]) & (i[None, :] >= start[..., :, None])
    x = torch.where(live, s + bias, torch.full((), -math.inf, dtype=cdt, device=q.device))
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)
    mag = torch.exp(x - beta[..., None, None] * log_z)
    phi = None
    if theta is not None:
        phi = theta[..., :, None] - theta[..., None, :]
    return mag, phi


def resolvent_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    magnitude: torch.Tensor,
    phase: torch.Tensor | None,
    beta: Switch,
    qk: Switch,
    g: Switch,
    *,
    check_finite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense operator ``W`` as real and imaginary parts, each ``[B, H, S, S]`` (exactly 0
    above the diagonal and on dead entries). Shapes and ``check_finite`` as in
    :func:`drmlab.resolvent.attention.resolvent_attention`."""
    B, H, S, _ = q.shape
    cdt = compute_dtype(q.dtype)
    if check_finite:
        refuse_non_finite(q, k, magnitude, phase, beta, qk, g, cdt)
    beta_t, qk_t, g_t = (as_switch(x, B, H, cdt, q.device) for x in (beta, qk, g))
    mag, phi = _dense_parts(q, k, magnitude, phase, beta_t, qk_t, g_t, cdt)
    if phi is None:
        return mag, torch.zeros_like(mag)
    return mag * torch.cos(phi).to(cdt), mag * torch.sin(phi).to(cdt)


def dense_resolvent(q, k, v, magnitude, phase, beta, qk, g, cdt):
    """``(Re O, Im O or None)`` in ``cdt``; the switches are ``[b, h]`` tensors, ``phase`` None for
    a phase-free head."""
    mag, phi = _dense_parts(q, k, magnitude, phase, beta, qk, g, cdt)
    vc = v.to(cdt)
    if phi is None:
        return torch.matmul(mag, vc), None
    re = torch.matmul(mag * torch.cos(phi).to(cdt), vc)
    im = torch.matmul(mag * torch.sin(phi).to(cdt), vc)
    return re, im
