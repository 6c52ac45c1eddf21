r"""The pure-torch backend of :func:`drmlab.ops.linear_scan` (any device): a loop over time.

Forward (``docs/drm.md`` section 9): m_t = f_t * m_{t-1} + u_t, one fused multiply-add over
[B, D] per step, written into a preallocated output.  Backward: the reverse scan

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   g_{T-1} = dm_{T-1},
    du_t = g_t,   df_t = g_t conj(m_{t-1}),   dinit = conj(f_0) g_0,

also one multiply-add per step.  No cumulative product of gates is formed, so a zero gate cuts
the past exactly and long sequences cannot overflow.  Inputs: [B, T, D] tensors of one dtype
(broadcast views are read directly); init [B, D] or None.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["forward", "backward", "unavailable", "DENSE_INPUTS"]

# reads broadcast (stride-0) views as they are
DENSE_INPUTS = False


def unavailable(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Never: torch runs the loop on every device and dtype."""
    return None


def forward(f: torch.Tensor, u: torch.Tensor, init: Optional[torch.Tensor]) -> torch.Tensor:
    """The states m [B, T, D]."""
    B, T, D = u.shape
    out = torch.empty((B, T, D), dtype=u.dtype, device=u.device)
    if T == 0:
        return out
    fs, us, outs = f.unbind(1), u.unbind(1), out.unbind(1)
    if init is None:
        outs[0].copy_(us[0])
    else:
        torch.addcmul(us[0], fs[0], init, out=outs[0])
    for t in range(1, T):
        torch.addcmul(us[t], fs[t], outs[t - 1], out=outs[t])
    return out


def backward(f: torch.Tensor, m: torch.Tensor, init: Optional[torch.Tensor], dm: torch.Tensor,
             need_f: bool, need_init: bool):
    """(du, df or None, dinit or None) from the gates f, the states m and their gradient dm."""
    B, T, D = m.shape
    du = torch.empty_like(m)
    if T == 0:
        dinit = torch.zeros_like(init) if (need_init and init is not None) else None
        return du, (torch.empty_like(m) if need_f else None), dinit
    fc = f.conj() if f.is_complex() else f
    fs, gs, us = fc.unbind(1), dm.unbind(1), du.unbind(1)
    us[T - 1].copy_(gs[T - 1])
    for t in range(T - 2, -1, -1):
        torch.addcmul(gs[t], fs[t + 1], us[t + 1], out=us[t])
    df = None
    if need_f:
        mc = m.conj() if m.is_complex() else m
        df = torch.empty_like(m)
        torch.mul(du[:, 1:], mc[:, :-1], out=df[:, 1:])
        if init is None:
            df[:, 0].zero_()
        else:
            torch.mul(du[:, 0], init.conj() if init.is_complex() else init, out=df[:, 0])
    dinit = None
    if need_init and init is not None:
        dinit = fc[:, 0] * du[:, 0]
    return du, df, dinit
