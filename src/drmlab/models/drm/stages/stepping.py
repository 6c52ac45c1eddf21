"""What the stages' fast one-token steps share (``docs/drm.md`` section A.4.5, "The fast step").

The fast step of a stage runs the same kernels on the same operands as its reference step
(:meth:`Stage.step_reference`), in the same order, so its results are bit-identical; it saves the
dispatches around them: quantities that are constant over a block (the transition's state part at
the block start, the Woodbury factors of the block-start metric, the mixer's dimD/rho part) are
computed once per block, matrix products run on [B, K] instead of [B, 1, K], and no-op casts and
autocast guards are skipped where they would do nothing. Where they would do something (under
autocast, or in a reduced precision) the model steps by the reference instead.
"""

from __future__ import annotations

import torch

from drmlab.ops.state_bound import fused_bound_applies, state_bound

from ..components import bound_state

FAST_STEP_DTYPES = (torch.float32, torch.float64)
_SCALARS: dict = {}


def scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-dim tensor of ``like``'s dtype and device, made once: ``x * scalar(a, x)`` runs
    the kernel of ``x * a`` on the same float (a 0-dim operand is the CPU-scalar case, as a Python
    number is) without wrapping and casting the number at every call."""
    key = (value, like.dtype, like.device)
    found = _SCALARS.get(key)
    if found is None:
        found = _SCALARS[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
    return found


def fast_step_supported(like: torch.Tensor) -> bool:
    """Whether the fast step equals the reference bit for bit here: a float32 or float64 state
    (every cast of the reference is then a no-op) and no autocast on its device."""
    return like.dtype in FAST_STEP_DTYPES and not _autocast_on(like.device.type)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (meta): nothing is autocast there
        return False


def bound(z: torch.Tensor, config) -> torch.Tensor:
    """B(z) as :meth:`~drmlab.models.drm.transition.Transition.bound` computes it: the fused
    :func:`~drmlab.ops.state_bound` where it applies, else :func:`~drmlab.models.drm.components.bound_state`
    kernel for kernel: the same norm (``Tensor.norm`` is ``linalg.vector_norm`` of order 2), the same
    reciprocal-times-radius for ``R / norm``, in place on fresh intermediates."""
    if not config.bounded_state:
        return z
    radius = config.state_clip_norm
    if config.toroidal_dims:
        return bound_state(z, radius, config.toroidal_dims)
    if fused_bound_applies(z):  # the fused bound, as Transition.bound takes it in the reference step
        return state_bound(z, radius)
    r = scalar(radius, z)
    scale = torch.linalg.vector_norm(z, 2, -1, True).clamp_min_(1e-8).reciprocal_().mul_(r).clamp_(max=1.0)
    return torch.tanh_(z.mul(scale).div_(r)).mul_(r)
