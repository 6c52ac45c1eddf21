"""The plain bound operator B(y) = R tanh(y min(1, R / max(|y|, 1e-8)) / R) (``docs/drm.md`` sections 6
and A.3.8) from torch operations: the reference every fused path is held to, differentiable by autograd."""

from __future__ import annotations

import torch


def state_bound_reference(y: torch.Tensor, radius: float) -> torch.Tensor:
    """B(y) over the last dimension: a norm clip to radius R per state vector, then a soft clamp."""
    norm = y.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    clipped = y * torch.clamp(radius / norm, max=1.0)
    return radius * torch.tanh(clipped / radius)
