r"""The reference of the first-order linear scan (``docs/drm.md`` section 9): the recurrence

    m_t = f_t * m_{t-1} + u_t,    m_{-1} = init (zeros when None),

written as a plain loop over time with autograd through every step.  It runs in whatever dtype
it is given (the tests give it float64 / complex128) and is what every backend of
:func:`drmlab.ops.linear_scan` is checked against.
"""

from __future__ import annotations

import torch

__all__ = ["linear_scan_reference"]


def linear_scan_reference(f: torch.Tensor, u: torch.Tensor, init: torch.Tensor | None = None) -> torch.Tensor:
    """m_t = f_t * m_{t-1} + u_t along dim 1 of ``[B, T, D]`` (f and u broadcast against each
    other, init ``[B, D]`` or broadcastable), one step at a time in the inputs' dtype."""
    shape = torch.broadcast_shapes(f.shape, u.shape)
    f, u = f.expand(shape), u.expand(shape)
    if shape[1] == 0:
        dtype = torch.promote_types(f.dtype, u.dtype)
        dtype = dtype if init is None else torch.promote_types(dtype, init.dtype)
        return torch.zeros(shape, dtype=dtype, device=u.device)
    m = torch.zeros_like(u[:, 0]) if init is None else init.expand(shape[0], shape[2])
    outs = []
    for f_t, u_t in zip(f.unbind(1), u.unbind(1)):  # unbind: an O(T) backward, not O(T^2)
        m = f_t * m + u_t
        outs.append(m)
    return torch.stack(outs, dim=1)
