r"""Causal depthwise convolution over time (the causal mixer of ``docs/drm.md`` section 7).

For x of shape ``[B, T, C]`` (time-major, channels last) and a depthwise kernel ``weight`` of
shape ``[C, 1, K]`` (the layout of ``torch.nn.Conv1d(C, C, K, groups=C)``):

    y[b, t, c] = bias[c] + \sum_{j=0}^{K-1} weight[c, 0, j] * x[b, t - (K-1-j) * dilation, c],

with x = 0 at negative times: only left padding (``dilation * (K - 1)`` steps), the
cross-correlation convention of torch's conv1d.  Output t depends on inputs at times <= t only,
so future positions never alter prefix outputs.

``causal_depthwise_conv1d_step`` is the same map for one new time step, carrying the last
``dilation * (K - 1)`` inputs as context (incremental decoding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_step",
    "causal_depthwise_conv1d_step_partials",
    "causal_depthwise_conv1d_partials",
    "conv_step_taps",
    "conv_context_size",
]


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


def conv_context_size(kernel_size: int, dilation: int = 1) -> int:
    """Number of past inputs the step function carries: dilation * (K - 1)."""
    return dilation * (kernel_size - 1)


def causal_depthwise_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    dilation: int = 1,
) -> torch.Tensor:
    """Causal depthwise conv over dim 1 of ``x`` [B, T, C]; weight [C, 1, K]; bias [C] or None.

    Returns [B, T, C].  Computed as K shifted multiply-adds over a left-padded copy of x (no
    transposes), which is exactly causal.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got {tuple(x.shape)}")
    if dilation < 1:
        raise ValueError("dilation must be >= 1")
    B, T, C = x.shape
    taps = _taps(weight, C).to(x.dtype)
    K = taps.shape[0]
    pad = dilation * (K - 1)
    xp = F.pad(x, (0, 0, pad, 0)) if pad > 0 else x
    y = xp[:, 0:T] * taps[0]
    for j in range(1, K):
        off = j * dilation
        y = torch.addcmul(y, xp[:, off : off + T], taps[j])
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


def causal_depthwise_conv1d_step(
    x_t: torch.Tensor,
    context: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    dilation: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of ``causal_depthwise_conv1d``.

    Args:
        x_t: the new input, [B, C].
        context: the last ``dilation * (K - 1)`` inputs, oldest first, [B, dilation*(K-1), C];
            zeros (or None, meaning zeros) at the start of a sequence.
    Returns:
        (y_t [B, C], new_context [B, dilation*(K-1), C]).
    """
    if x_t.dim() != 2:
        raise ValueError(f"x_t must be [B, C], got {tuple(x_t.shape)}")
    if dilation < 1:
        raise ValueError("dilation must be >= 1")
    B, C = x_t.shape
    taps = _taps(weight, C).to(x_t.dtype)
    K = taps.shape[0]
    L = dilation * (K - 1)
    if context is None:
        context = x_t.new_zeros(B, L, C)
    if context.shape != (B, L, C):
        raise ValueError(f"context must be [B, {L}, C] = {(B, L, C)}, got {tuple(context.shape)}")
    window = torch.cat([context.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)  # [B, L + 1, C]
    y = window[:, 0] * taps[0]
    for j in range(1, K):
        y = torch.addcmul(y, window[:, j * dilation], taps[j])
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y, window[:, 1:]


# --------------------------------------------------------------------------------------------
# The step by pending partial sums: the same products and additions as
# ``causal_depthwise_conv1d_step``, in the same order, grouped by input instead of by output.
# Output t sums its K terms oldest input first; input x_t is the newest term so far of every output
# it touches (t, t + dilation, ..., t + (K - 1) dilation), so adding it to all of them at once keeps
# each output's order. The state is the L = dilation (K - 1) outputs t .. t + L - 1 still open.


def conv_step_taps(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(first tap [C], the later taps newest first [K - 1, C]) of a depthwise weight [C, 1, K], for
    :func:`causal_depthwise_conv1d_step_partials` (compute them once, use them every step)."""
    taps = _taps(weight, weight.shape[0]).to(dtype)  # [K, C]
    return taps[0], taps[1:].flip(0)


def causal_depthwise_conv1d_step_partials(
    x_t: torch.Tensor,
    partials: torch.Tensor,
    taps: tuple[torch.Tensor, torch.Tensor],
    bias: torch.Tensor | None = None,
    dilation: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step from the open partial sums [B, L, C] of outputs t .. t + L - 1 (L >= 1): returns
    (y_t [B, C], the partial sums of outputs t + 1 .. t + L), bit-identical to
    :func:`causal_depthwise_conv1d_step` over the matching context."""
    first, later = taps
    touched = torch.addcmul(partials[:, ::dilation], x_t.unsqueeze(1), later)  # outputs t, t + dilation, ...
    y = touched[:, 0]
    if bias is not None:
        y = y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))
    opened = (x_t * first).unsqueeze(1)  # output t + L: its first term
    if dilation == 1:
        return y, torch.cat([touched[:, 1:], opened], dim=1)
    merged = partials.clone()
    merged[:, ::dilation] = touched
    return y, torch.cat([merged[:, 1:], opened], dim=1)


def causal_depthwise_conv1d_partials(
    context: torch.Tensor, taps: tuple[torch.Tensor, torch.Tensor], dilation: int = 1
) -> torch.Tensor:
    """The open partial sums [B, L, C] after the context [B, L, C] (oldest first) of
    :func:`causal_depthwise_conv1d_step`: the L context inputs replayed through the partial-sum step
    (every open output's terms come from the context, so whatever precedes the replay is dropped)."""
    partials = torch.zeros_like(context)
    for i in range(context.shape[1]):
        _, partials = causal_depthwise_conv1d_step_partials(context[:, i], partials, taps, None, dilation)
    return partials
