r"""The chunked torch backend of :func:`drmlab.ops.selective_scan` (any device).

Mamba's selective scan h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t, y_t = C_t . h_t (Gu & Dao,
2023, Algorithm 2) with time cut into chunks: each chunk is one :func:`drmlab.ops.linear_scan`
over the flattened (E, N) channels, started from the previous chunk's last state, with three
small autograd functions around it for the decay exp(dt A), the drive (dt x) B^T and the read-out
C . h.  ``recompute`` checkpoints each chunk (activation checkpointing).  Exact: no division by
cumulative gate products, no logarithm of a gate.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from ..linear_scan import linear_scan

__all__ = ["scan", "unavailable", "AUTO_CHUNK_ELEMENTS"]

# chunk=0 picks about this many state elements B * chunk * E * N per chunk
AUTO_CHUNK_ELEMENTS = 1 << 21


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Never: the chunked path runs wherever ``linear_scan`` does."""
    return None


class _Decay(torch.autograd.Function):
    """exp(dt A) as [B, L, E * N] from dt [B, L, E] and A [E, N]; the backward contracts over
    the state index with one einsum each for d dt and d A."""

    @staticmethod
    def forward(ctx, dt, A):
        b, length, e = dt.shape
        out = torch.mul(dt.unsqueeze(-1), A).exp_()
        ctx.save_for_backward(dt, A, out)
        return out.view(b, length, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        dt, A, out = ctx.saved_tensors
        w = torch.mul(grad.view(out.shape), out)  # d(dt A)
        return torch.einsum("blen,en->ble", w, A), torch.einsum("blen,ble->en", w, dt)


class _Drive(torch.autograd.Function):
    """(dt x) B as [B, L, E * N] from dtx [B, L, E] and Bm [B, L, N] (an outer product per
    position); the backward is two batched matrix products."""

    @staticmethod
    def forward(ctx, dtx, Bm):
        b, length, e = dtx.shape
        ctx.save_for_backward(dtx, Bm)
        return torch.mul(dtx.unsqueeze(-1), Bm.unsqueeze(2)).view(b, length, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        dtx, Bm = ctx.saved_tensors
        b, length, e = dtx.shape
        n, rows = Bm.shape[-1], b * length
        g = grad.reshape(rows, e, n)
        d_dtx = torch.bmm(g, Bm.reshape(rows, n, 1)).view(b, length, e)
        dB = torch.bmm(dtx.reshape(rows, 1, e), g).view(b, length, n)
        return d_dtx, dB


class _Readout(torch.autograd.Function):
    """y[b, t, e] = sum_n h[b, t, e, n] C[b, t, n] (one batched matrix-vector product) and the
    last state h[:, -1] (which starts the next chunk), from states [B, L, E * N]."""

    @staticmethod
    def forward(ctx, states, Cm):
        b, length, n = Cm.shape
        rows = b * length
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(states, Cm)
        y = torch.bmm(states.view(rows, -1, n), Cm.reshape(rows, n, 1)).view(b, length, -1)
        return y, states[:, -1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        states, Cm = ctx.saved_tensors
        b, length, n = Cm.shape
        rows = b * length
        if dy is None:
            dstates = torch.zeros_like(states)
            dC = torch.zeros_like(Cm)
        else:
            e = dy.shape[-1]
            dstates = torch.mul(dy.unsqueeze(-1), Cm.unsqueeze(2)).view(b, length, e * n)
            dC = torch.bmm(dy.reshape(rows, 1, e), states.view(rows, e, n)).view(b, length, n)
        if dlast is not None:
            dstates[:, -1] += dlast
        return dstates, dC


def _scan_chunk(dtx, dt, A, Bm, Cm, h):
    """One chunk of the selective scan: (y [B, L, E], last state [B, E * N])."""
    decay = _Decay.apply(dt, A)
    drive = _Drive.apply(dtx, Bm)
    return _Readout.apply(linear_scan(decay, drive, h), Cm)


def scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False):
    """The selective scan on :func:`drmlab.ops.linear_scan` (any device).

    Time is processed in chunks of ``chunk`` steps (0: about 2^21 state elements B * chunk * E * N
    per chunk), each a :func:`drmlab.ops.linear_scan` over the flattened (E, N) channels started
    from the previous chunk's last state, so the [B, chunk, E * N] temporaries stay in cache
    while the number of small operations stays low. For the backward each chunk keeps exp(dt A)
    and its states (O(B T E N) memory); with ``recompute`` it keeps only its inputs and the
    state entering it, O(B T (E + E N / chunk)), and recomputes the rest (activation
    checkpointing). Forward and gradient are exact; ``chunk`` and ``recompute`` change only
    speed and memory.
    """
    if chunk < 0:
        raise ValueError(f"chunk must be positive (0 = auto), got {chunk}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, dt, A, Bm, Cm = (t.to(dtype) for t in (x, dt, A, Bm, Cm))
    b, length, e = x.shape
    n = A.shape[1]
    if chunk == 0:
        chunk = max(1, AUTO_CHUNK_ELEMENTS // max(1, b * e * n))
    h = None if h0 is None else h0.to(dtype).reshape(b, e * n)
    if length == 0:
        return x.new_zeros(b, 0, e), (x.new_zeros(b, e, n) if h is None else h.view(b, e, n))
    checkpointing = recompute and torch.is_grad_enabled()
    ys = []
    # the scan runs in float32/float64 whatever autocast is active around the model
    with torch.autocast(device_type=x.device.type, enabled=False):
        # split (not slicing in a loop): its backward is one concatenation, where per-chunk
        # slices would each scatter into a zero-filled full-length gradient
        pieces = zip(*(t.split(chunk, dim=1) for t in (dt * x, dt, Bm, Cm)))
        for dtx_c, dt_c, B_c, C_c in pieces:
            if checkpointing:
                y, h = torch.utils.checkpoint.checkpoint(_scan_chunk, dtx_c, dt_c, A, B_c, C_c, h, use_reentrant=False)
            else:
                y, h = _scan_chunk(dtx_c, dt_c, A, B_c, C_c, h)
            ys.append(y)
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)
    return y, h.view(b, e, n)
