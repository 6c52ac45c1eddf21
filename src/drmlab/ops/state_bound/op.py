"""The fused state bound as ``torch.library`` custom operators, so autograd and ``torch.compile`` see one
opaque node (as :mod:`drmlab.ops.linear_scan.op` does for the scan).

``torch.ops.drmlab.state_bound(z, x, radius) -> (out, y, norms)``: out = B(z + x) (B(z) where x is None),
y = z + x where x is given (an empty tensor otherwise: the backward then reads z), the per-row norms |y|.
``torch.ops.drmlab.state_bound_backward(g, y, out, norms, radius) -> dy``. Under ``create_graph=True`` the
gradient is taken through the plain reference instead, so double backward works.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import c
from .reference import state_bound_reference

__all__ = ["state_bound_op", "state_bound_backward_op", "EagerStateBound"]


@torch.library.custom_op("drmlab::state_bound", mutates_args=())
def state_bound_op(z: Tensor, x: Tensor | None, radius: float) -> tuple[Tensor, Tensor, Tensor]:
    out, y, norms = c.forward(z, x, radius, keep_input=x is not None)
    return out, (y if y is not None else z.new_empty(0)), norms


@state_bound_op.register_fake
def _state_bound_fake(z, x, radius):
    return torch.empty_like(z), (torch.empty_like(z) if x is not None else z.new_empty(0)), z.new_empty(z.shape[:-1])


@torch.library.custom_op("drmlab::state_bound_backward", mutates_args=())
def state_bound_backward_op(g: Tensor, y: Tensor, out: Tensor, norms: Tensor, radius: float) -> Tensor:
    return c.backward(g, y.contiguous(), out, norms, radius)


@state_bound_backward_op.register_fake
def _state_bound_backward_fake(g, y, out, norms, radius):
    return torch.empty_like(y)


def _setup_context(ctx, inputs, output):
    z, x, radius = inputs
    out, y, norms = output
    ctx.radius, ctx.has_x = radius, x is not None
    ctx.save_for_backward(y if x is not None else z, out, norms, z, x)


def _backward(ctx, g, _gy, _gnorms, reverse=state_bound_backward_op):
    y, out, norms, z, x = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: differentiate the plain reference from the inputs
        with torch.enable_grad():
            total = z if x is None else z + x
            (dy,) = torch.autograd.grad(state_bound_reference(total, ctx.radius), total, g, create_graph=True)
    else:
        dy = reverse(g, y, out, norms, ctx.radius)
    need_z, need_x = ctx.needs_input_grad[:2]
    return (dy if need_z else None, dy if (need_x and ctx.has_x) else None, None)


state_bound_op.register_autograd(_backward, setup_context=_setup_context)


class EagerStateBound(torch.autograd.Function):
    """The same operator for eager calls, without the custom operator's dispatch (about 0.2 ms a call on one
    CPU thread, more than the kernels' own time at the DRM block shape); :func:`~drmlab.ops.state_bound`
    takes it unless ``torch.compile`` is tracing."""

    @staticmethod
    def forward(ctx, z, x, radius):
        out, y, norms = c.forward(z, x, radius, keep_input=x is not None)
        _setup_context(ctx, (z, x, radius), (out, y, norms))
        return out

    @staticmethod
    def backward(ctx, g):
        return _backward(ctx, g, None, None, reverse=c.backward)
