r"""The plain reference of the causal depthwise convolution (the map of :mod:`.causal_depthwise`): K
shifted multiply-adds over a left-padded copy of x, differentiated by autograd as they are, and the shape
checks and the taps' layout that every form of the map shares.  Imported by :mod:`.causal_depthwise` (its autograd
Functions, whose forward is these sums) and by :mod:`.c` (whose self-test holds the C kernel to it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_depthwise_conv1d_reference"]


def _taps(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """weight [C, 1, K] (or [C, K]) -> [K, C]."""
    if weight.dim() == 3:
        if weight.shape[1] != 1:
            raise ValueError(f"depthwise weight must be [C, 1, K], got {tuple(weight.shape)}")
        weight = weight[:, 0, :]
    elif weight.dim() != 2:
        raise ValueError(f"depthwise weight must be [C, 1, K], got {tuple(weight.shape)}")
    if weight.shape[0] != channels:
        raise ValueError(f"weight has {weight.shape[0]} channels, input has {channels}")
    if weight.shape[1] < 1:
        raise ValueError("kernel size must be >= 1")
    return weight.t()


def _check_input(x: torch.Tensor, dilation: int) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got {tuple(x.shape)}")
    if dilation < 1:
        raise ValueError("dilation must be >= 1")


def _shifted_sum(xp: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """y = sum_j taps[j] * xp[:, j * dilation : j * dilation + T] (+ bias) over the left-padded xp."""
    T = xp.shape[1] - dilation * (taps.shape[0] - 1)
    y = xp[:, 0:T] * taps[0]
    for j in range(1, taps.shape[0]):
        off = j * dilation
        y = torch.addcmul(y, xp[:, off : off + T], taps[j])
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


def causal_depthwise_conv1d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    dilation: int = 1,
) -> torch.Tensor:
    """Causal depthwise conv over dim 1 of ``x`` [B, T, C]; weight [C, 1, K]; bias [C] or None.

    Returns [B, T, C].  Computed as K shifted multiply-adds over a left-padded copy of x (no
    transposes), which is exactly causal; autograd differentiates the ops as they are.
    """
    _check_input(x, dilation)
    taps = _taps(weight, x.shape[2]).to(x.dtype)
    pad = dilation * (taps.shape[0] - 1)
    return _shifted_sum(F.pad(x, (0, 0, pad, 0)) if pad > 0 else x, taps, bias, dilation)
