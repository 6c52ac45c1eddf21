r"""The reference of Mamba's selective scan (Gu & Dao, 2023, "Mamba: Linear-Time Sequence
Modeling with Selective State Spaces", section 3 and Algorithm 2):

    h_t = exp(dt_t A) * h_{t-1} + (dt_t x_t) B_t,    y_t = C_t . h_t,

written as a plain loop over time with autograd through every step, in the inputs' dtype.  Every
backend of :func:`drmlab.ops.selective_scan` is checked against it.
"""

from __future__ import annotations

import torch

__all__ = ["selective_scan_reference"]


def selective_scan_reference(x, dt, A, Bm, Cm, h0=None):
    """x, dt: [B, T, E]; A: [E, N]; Bm, Cm: [B, T, N]; h0: [B, E, N] or None (zeros).
    Returns (y [B, T, E], h_{T-1} [B, E, N])."""
    b, length, e = x.shape
    h = x.new_zeros(b, e, A.shape[1]) if h0 is None else h0
    ys = []
    for t in range(length):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h
