r"""The autograd function of :func:`drmlab.ops.linear_scan`, shared by every backend.

A backend supplies ``forward(f, u, init) -> m`` and ``backward(f, m, init, dm, need_f,
need_init) -> (du, df, dinit)``, the reverse scan of ``docs/drm.md`` section 9:

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   du_t = g_t,   df_t = g_t conj(m_{t-1}),
    dinit = conj(f_0) g_0

(torch's convention for complex gradients: the gradient of y = f m with respect to m is
grad_y conj(f)).  Under ``create_graph=True`` the same reverse scan is written with
differentiable pieces, itself a linear scan on the same backend, so double backward works too.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["LinearScanFunction"]


class LinearScanFunction(torch.autograd.Function):
    """Inputs: f, u of one shape [B, T, D] and one dtype; init [B, D] or None; the backend."""

    @staticmethod
    def forward(ctx, f, u, init, backend):
        out = backend.forward(f, u, init)
        ctx.backend = backend
        ctx.has_init = init is not None
        ctx.save_for_backward(f, out, init)
        return out

    @staticmethod
    def backward(ctx, dm):
        f, m, init = ctx.saved_tensors
        need_f, need_u, need_init = ctx.needs_input_grad[:3]
        need_init = need_init and ctx.has_init
        if torch.is_grad_enabled():
            du, df, dinit = _differentiable_backward(f, m, init, dm, ctx.backend)
        else:
            du, df, dinit = ctx.backend.backward(f, m, init, dm, need_f, need_init)
        return (df if need_f else None, du if need_u else None,
                dinit if need_init else None, None)


def _differentiable_backward(f, m, init: Optional[torch.Tensor], dm, backend):
    """The reverse scan from differentiable operations (used under ``create_graph=True``)."""
    if m.shape[1] == 0:
        return torch.zeros_like(m), torch.zeros_like(m), (
            None if init is None else torch.zeros_like(init))
    fc = f.conj() if f.is_complex() else f
    f_next = torch.cat([fc[:, 1:], torch.zeros_like(fc[:, :1])], dim=1)
    g = LinearScanFunction.apply(f_next.flip(1), dm.flip(1), None, backend).flip(1)
    mc = m.conj() if m.is_complex() else m
    if init is None:
        prev = torch.cat([torch.zeros_like(mc[:, :1]), mc[:, :-1]], dim=1)
    else:
        ic = init.conj() if init.is_complex() else init
        prev = torch.cat([ic.unsqueeze(1), mc[:, :-1]], dim=1)
    df = g * prev
    dinit = fc[:, 0] * g[:, 0] if init is not None else None
    return g, df, dinit
