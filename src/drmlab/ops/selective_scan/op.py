r"""Mamba's selective scan as a ``torch.library`` custom operator, for the backends that run it
as one fused kernel (today the C kernel, :mod:`.c`).

``torch.ops.drmlab.selective_scan(x, dt, A, Bm, Cm, h0, need_grad, backend) -> (y, h_last,
saved)`` computes (Gu & Dao, 2023, "Mamba", section 3 and Algorithm 2)

    h_t = exp(dt_t A) * h_{t-1} + (dt_t x_t) B_t,    y_t = C_t . h_t

for x, dt [B, T, E], A [E, N], Bm, Cm [B, T, N], h0 [B, E, N] or None, all contiguous and of one
compute dtype; h_last = h_{T-1} [B, E, N].  ``saved`` is what the kernel keeps for its
backward (for the C kernel the state entering every segment; an empty tensor when not
``need_grad``); it carries no gradient.  The gradient is the second operator
``torch.ops.drmlab.selective_scan_backward(x, dt, A, Bm, Cm, h0, saved, dy, dh_last, backend)
-> (dx, ddt, dA, dB, dC, dh0)`` (dh0 empty when h0 is None), the kernel's adjoint recurrence.

Why custom operators: with a fake (meta) implementation for each and the gradient registered
with ``register_autograd``, ``torch.compile(model, fullgraph=True)`` traces a Mamba model
through the scan as one opaque node (the ctypes kernel and its thread pool are no part of a
graph) instead of breaking the graph; AOT autograd puts the backward operator in the backward
graph.  The gradient is first-order only (the kernel's adjoint is not itself differentiated).

A backend module that runs through this operator supplies ``forward(x, dt, A, Bm, Cm, h0,
need_grad) -> (y, h_last, saved)``, ``backward(x, dt, A, Bm, Cm, h0, saved, dy, dh_last) ->
(dx, ddt, dA, dB, dC, dh0)`` and ``saved_shape(B, T, E, N)``, and is looked up by name in
:data:`drmlab.ops.selective_scan.BACKENDS` when the operator runs (through
:func:`drmlab.ops.backends.table_of`: the package that builds the table imports this module, and so
do the fused backends that run through it).  The chunked torch backend
does not need it: it is made of torch operations and :func:`drmlab.ops.linear_scan` (itself a
custom operator), which the compiler traces.  :func:`choose_backend` resolves ``"auto"`` to a
backend name once per trace.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..backends import table_of

__all__ = ["selective_scan_op", "selective_scan_backward_op", "choose_backend"]


def _backend(name: str, like: Tensor | None = None):
    """The backend module called ``name``; with ``like``, checked to run on its device and dtype
    (which loads the C kernel on first use).  The table is built in the package ``__init__``."""
    table = table_of("selective_scan")
    return table.backends[name].impl if like is None else table.choose(name, like.device, like.dtype).impl


@torch.compiler.assume_constant_result
def choose_backend(name: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The name of the backend that runs the selective scan for ``name`` (None / ``"auto"`` or a
    backend name) on ``device`` with compute ``dtype``; raises as
    :meth:`drmlab.ops.backends.BackendTable.choose`.  Under ``torch.compile`` it is asked once,
    at trace time."""
    return table_of("selective_scan").choose(name, device, dtype).name


def _result_dtype(dtype: torch.dtype) -> torch.dtype:
    """Outputs and gradients are float64 for float64 inputs, else float32 (the callers pass
    contiguous inputs of that compute dtype already)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("drmlab::selective_scan", mutates_args=())
def selective_scan_op(
    x: Tensor, dt: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, h0: Tensor | None, need_grad: bool, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(y [B, T, E], h_last [B, E, N], saved) on the named fused backend (T > 0)."""
    y, h_last, saved = _backend(backend, x).forward(x, dt, A, Bm, Cm, h0, need_grad)
    dtype = _result_dtype(x.dtype)
    return tuple(t.to(dtype).contiguous() for t in (y, h_last, saved))


def fused_scan(
    x: Tensor, dt: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, h0: Tensor | None, backend: str
) -> tuple[Tensor, Tensor]:
    """(y, h_last) of a fused backend (``"c"`` or ``"triton"``) through :func:`selective_scan_op`:
    inputs made contiguous in the compute dtype (float64 stays, everything else float32), autocast
    off, the saved segment states only when a gradient will be asked for."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, Bm, Cm = (t.to(dtype).contiguous() for t in (x, dt, A, Bm, Cm))
        h0 = None if h0 is None else h0.to(dtype).contiguous()
        need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, dt, A, Bm, Cm, h0))
        y, h_last, _ = selective_scan_op(x, dt, A, Bm, Cm, h0, need_grad, backend)
    return y, h_last


@selective_scan_op.register_fake
def _selective_scan_fake(x, dt, A, Bm, Cm, h0, need_grad, backend):
    b, length, e = x.shape
    n = A.shape[1]
    saved = _backend(backend).saved_shape(b, length, e, n) if need_grad else (0,)
    dtype = _result_dtype(x.dtype)
    return tuple(x.new_empty(shape, dtype=dtype) for shape in ((b, length, e), (b, e, n), saved))


@torch.library.custom_op("drmlab::selective_scan_backward", mutates_args=())
def selective_scan_backward_op(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None,
    saved: Tensor,
    dy: Tensor,
    dh_last: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, ddt, dA, dB, dC, dh0) on the named fused backend; dh0 is empty when h0 is None."""
    grads = _backend(backend, x).backward(x, dt, A, Bm, Cm, h0, saved, dy, dh_last)
    dtype = _result_dtype(x.dtype)
    return tuple(g.to(dtype).contiguous() for g in grads)


@selective_scan_backward_op.register_fake
def _selective_scan_backward_fake(x, dt, A, Bm, Cm, h0, saved, dy, dh_last, backend):
    dtype = _result_dtype(x.dtype)
    shapes = [t.shape for t in (x, dt, A, Bm, Cm)] + [(0,) if h0 is None else h0.shape]
    return tuple(x.new_empty(shape, dtype=dtype) for shape in shapes)


def _setup_context(ctx, inputs, output):
    x, dt, A, Bm, Cm, h0, _, backend = inputs
    ctx.backend = backend
    ctx.has_h0 = h0 is not None
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)
    # no None among the saved tensors: they are x, dt, A, Bm, Cm, saved (and h0 when given)
    ctx.save_for_backward(x, dt, A, Bm, Cm, output[2], *((h0,) if h0 is not None else ()))


def _backward(ctx, dy, dh_last, _dsaved):
    x, dt, A, Bm, Cm, saved, *rest = ctx.saved_tensors
    h0 = rest[0] if ctx.has_h0 else None
    if dy is None and dh_last is None:
        return (None,) * 8
    if dy is None:
        dy = torch.zeros_like(x)
    dx, ddt, dA, dB, dC, dh0 = selective_scan_backward_op(x, dt, A, Bm, Cm, h0, saved, dy, dh_last, ctx.backend)
    return dx, ddt, dA, dB, dC, (dh0 if ctx.has_h0 else None), None, None


selective_scan_op.register_autograd(_backward, setup_context=_setup_context)
