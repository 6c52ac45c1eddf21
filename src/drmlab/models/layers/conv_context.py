"""The decode state a causal convolution leaves behind after a whole sequence.

``drmlab.ops.causal_depthwise_conv1d_step`` carries the last ``dilation * (kernel - 1)`` inputs,
oldest first, zeros before the sequence starts (``docs/drm.md`` section 7). :func:`trailing_context`
gives that context from the parallel pass, so a prefill continues exactly where stepping would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def trailing_context(x: torch.Tensor, length: int) -> torch.Tensor:
    """The last ``length`` time steps of x [B, T, C] as [B, length, C], left-padded with zeros
    when T < length: the context the step function holds after consuming x."""
    if length == 0:
        return x[:, :0]
    padded = F.pad(x, (0, 0, max(0, length - x.shape[1]), 0))
    return padded[:, -length:]
