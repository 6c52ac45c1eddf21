r"""The linear scan as a ``torch.library`` custom operator, shared by every backend: the one
place where :func:`drmlab.ops.linear_scan` meets autograd and ``torch.compile``.

``torch.ops.drmlab.linear_scan(f, u, init, backend)`` computes the recurrence of
``docs/drm.md`` section 9, m_t = f_t m_{t-1} + u_t, on the named backend (inputs already
broadcast to one ``[B, T, D]`` shape and one compute dtype by the dispatcher; ``init`` [B, D] or
None).  Its gradient is the reverse scan

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   du_t = g_t,   df_t = g_t conj(m_{t-1}),
    dinit = conj(f_0) g_0

(torch's convention for complex gradients), run by the second operator
``torch.ops.drmlab.linear_scan_backward(f, m, init, dm, need_f, backend) -> (du, df)`` on the
same backend; ``dinit`` is one multiplication in torch.  Under ``create_graph=True`` the
backward is written instead with differentiable pieces -- itself a linear scan, run backwards
in time through the forward operator -- so double backward works too.  What autograd keeps for
the backward is the gates f, the states m (the output) and init: O(B T D).

Why custom operators: each has a fake (meta) implementation that gives its output's shape,
dtype and device without running it, and the gradient above is registered with
``register_autograd``, so ``torch.compile(model, fullgraph=True)`` traces a model through the
scan as one opaque node (the C kernel behind ctypes, the log-depth scan's strided in-place
updates and a Triton kernel alike) instead of breaking the graph around it; AOT autograd
places the backward operator in the backward graph.  Eager calls dispatch to the same backends
as before, with the same numbers.

A backend module supplies ``forward(f, u, init) -> m`` (a new tensor) and ``backward(f, m,
init, dm, need_f, need_init) -> (du, df or None, dinit or None)``, and ``DENSE_INPUTS`` (True:
it reads contiguous buffers only).  The backend is looked up by name in
:data:`drmlab.ops.linear_scan.BACKENDS` when the operator runs (through
:func:`drmlab.ops.backends.table_of`: the package that builds the table imports this module);
:func:`choose_backend` resolves ``"auto"`` to a name once per trace (a compiled graph holds the name
as a constant).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..backends import table_of

__all__ = ["linear_scan_op", "linear_scan_backward_op", "EagerLinearScan", "choose_backend", "result_dtype"]


def _backend(name: str, like: Tensor):
    """The backend module called ``name``, checked to run on ``like``'s device and dtype (it
    loads the C kernel on first use; the table is built in the package ``__init__``)."""
    return table_of("linear_scan").choose(name, like.device, like.dtype).impl


@torch.compiler.assume_constant_result
def choose_backend(name: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The name of the backend that runs ``linear_scan`` for ``name`` (None / ``"auto"`` or a
    backend name) on ``device`` with compute ``dtype``; raises as
    :meth:`drmlab.ops.backends.BackendTable.choose`.  Under ``torch.compile`` the answer is taken
    once, at trace time (building the C kernel on first use is no part of a graph)."""
    return table_of("linear_scan").choose(name, device, dtype).name


def _dense(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()


def result_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the states for inputs of ``dtype``: complex and float64 as they are, every
    other floating dtype float32 (the dispatcher passes the compute dtype already)."""
    return dtype if dtype.is_complex or dtype == torch.float64 else torch.float32


def _forward(f: Tensor, u: Tensor, init: Tensor | None, backend: str) -> Tensor:
    impl = _backend(backend, u)
    if impl.DENSE_INPUTS:
        f, u, init = _dense(f), _dense(u), _dense(init)
    out = impl.forward(f, u, init)
    # a fresh contiguous tensor of the result dtype: what the fake below promises the compiler
    return out.to(result_dtype(u.dtype)).contiguous()


@torch.library.custom_op("drmlab::linear_scan", mutates_args=())
def linear_scan_op(f: Tensor, u: Tensor, init: Tensor | None, backend: str) -> Tensor:
    """m [B, T, D] from f, u [B, T, D] (one shape and dtype; broadcast views allowed) and init
    [B, D] or None, on the named backend."""
    return _forward(f, u, init, backend)


@linear_scan_op.register_fake
def _linear_scan_fake(f, u, init, backend):
    return torch.empty(u.shape, dtype=result_dtype(u.dtype), device=u.device)


def _reverse(
    f: Tensor, m: Tensor, init: Tensor | None, dm: Tensor, need_f: bool, backend: str
) -> tuple[Tensor, Tensor]:
    impl = _backend(backend, m)
    if impl.DENSE_INPUTS:
        f, m, init = _dense(f), _dense(m), _dense(init)
    dm = dm.contiguous()
    du, df, _ = impl.backward(f, m, init, dm, need_f, False)
    dtype = result_dtype(m.dtype)
    return du.to(dtype).contiguous(), (df.to(dtype).contiguous() if need_f else m.new_empty(0, dtype=dtype))


@torch.library.custom_op("drmlab::linear_scan_backward", mutates_args=())
def linear_scan_backward_op(
    f: Tensor, m: Tensor, init: Tensor | None, dm: Tensor, need_f: bool, backend: str
) -> tuple[Tensor, Tensor]:
    """(du, df) of the reverse scan on the named backend; df is an empty tensor when not
    ``need_f``."""
    return _reverse(f, m, init, dm, need_f, backend)


@linear_scan_backward_op.register_fake
def _linear_scan_backward_fake(f, m, init, dm, need_f, backend):
    du = torch.empty(m.shape, dtype=result_dtype(m.dtype), device=m.device)
    return du, (torch.empty_like(du) if need_f else du.new_empty(0))


def _conj(x: Tensor) -> Tensor:
    return x.conj() if x.is_complex() else x


def _setup_context(ctx, inputs, output):
    f, _, init, backend = inputs
    ctx.backend = backend
    ctx.has_init = init is not None
    ctx.save_for_backward(f, output, init)


def _backward(ctx, dm, reverse=linear_scan_backward_op):
    f, m, init = ctx.saved_tensors
    need_f, need_u, need_init = ctx.needs_input_grad[:3]
    need_init = need_init and ctx.has_init
    if m.shape[1] == 0:  # no time steps: nothing flows back
        du, df = torch.zeros_like(m), torch.zeros_like(m)
        dinit = torch.zeros_like(init) if need_init else None
    elif torch.is_grad_enabled():  # create_graph=True: a differentiable reverse scan
        du, df, dinit = _differentiable_backward(f, m, init, dm, ctx.backend)
    else:
        du, df = reverse(f, m, init, dm, bool(need_f), ctx.backend)
        dinit = _conj(f[:, 0]) * du[:, 0] if need_init else None
    return (df if need_f else None, du if need_u else None, dinit if need_init else None, None)


def _differentiable_backward(f, m, init: Tensor | None, dm, backend: str):
    """The reverse scan from differentiable operations: g is the forward scan, run backwards in
    time, with the gates shifted by one step (g_t's gate is conj(f_{t+1}))."""
    fc = _conj(f)
    f_next = torch.cat([fc[:, 1:], torch.zeros_like(fc[:, :1])], dim=1)
    g = linear_scan_op(f_next.flip(1), dm.flip(1), None, backend).flip(1)
    mc = _conj(m)
    first = torch.zeros_like(mc[:, :1]) if init is None else _conj(init).unsqueeze(1)
    df = g * torch.cat([first, mc[:, :-1]], dim=1)
    dinit = fc[:, 0] * g[:, 0] if init is not None else None
    return g, df, dinit


linear_scan_op.register_autograd(_backward, setup_context=_setup_context)


class EagerLinearScan(torch.autograd.Function):
    """The same operator for eager calls: the backend and the gradient above without the custom operator's
    dispatch (about 0.2 ms a call on one CPU thread, as much as the C kernels' own time at the DRM memory's
    block shape). ``linear_scan`` takes it unless ``torch.compile`` is tracing; the numbers are the same."""

    @staticmethod
    def forward(ctx, f, u, init, backend):
        out = _forward(f, u, init, backend)
        _setup_context(ctx, (f, u, init, backend), out)
        return out

    @staticmethod
    def backward(ctx, dm):
        return _backward(ctx, dm, reverse=_reverse)
