r"""The bound operator of ``docs/drm.md`` sections 6 and A.3.8 over the last dimension,

    B(y) = R \tanh(y \min(1, R / \max(|y|, 10^{-8})) / R),      y = z (+ x),

applied after every stage of the DRM block path. :func:`state_bound` is the dispatcher: the fused C
kernel (:mod:`.c`, ``bound.c``: one pass per state vector forward, one backward, the residual sum z + x
taken inside) on CPU float32 / float64 where it is built and fused kernels are on
(:mod:`drmlab.ops.fusion`), else :func:`state_bound_reference` (:mod:`.reference`, plain torch, autograd).
The two agree to round-off: 1e-5 relative in float32 (a rational tanh), 1e-12 in float64.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..fusion import fused_enabled
from . import c
from .reference import state_bound_reference

__all__ = ["state_bound", "state_bound_reference", "fused_bound_applies"]


@torch.compiler.assume_constant_result
def _kernel_ready(device: torch.device, dtype: torch.dtype) -> bool:
    """Built here, and past its first-use check (:mod:`drmlab.ops.self_check`)."""
    from ..self_check import fused_kernel_passes

    return c.unavailable(device, dtype) is None and fused_kernel_passes("state_bound", device, dtype)


def fused_bound_applies(z: torch.Tensor, x: torch.Tensor | None = None) -> bool:
    """Whether :func:`state_bound` takes the fused kernel for these operands."""
    if not fused_enabled() or z.dtype not in c.C_DTYPES or z.device.type != "cpu" or z.dim() == 0:
        return False
    if x is not None and (x.shape != z.shape or x.dtype != z.dtype or x.device != z.device):
        return False
    return _kernel_ready(z.device, z.dtype)


def state_bound(z: torch.Tensor, radius: float, x: torch.Tensor | None = None) -> torch.Tensor:
    """B(z + x) (B(z) without x) over the last dimension; x of z's shape (broadcasting sums go in as z)."""
    if fused_bound_applies(z, x):
        from .op import EagerStateBound, state_bound_op

        if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:  # traced, fake or counted
            return state_bound_op(z, x, float(radius))[0]
        return EagerStateBound.apply(z, x, float(radius))
    return state_bound_reference(z if x is None else z + x, radius)
