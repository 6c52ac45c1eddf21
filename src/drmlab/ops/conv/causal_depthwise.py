r"""Causal depthwise convolution over time (the causal mixer of ``docs/drm.md`` section 7).

For x of shape ``[B, T, C]`` (time-major, channels last) and a depthwise kernel ``weight`` of
shape ``[C, 1, K]`` (the layout of ``torch.nn.Conv1d(C, C, K, groups=C)``):

    y[b, t, c] = bias[c] + \sum_{j=0}^{K-1} weight[c, 0, j] * x[b, t - (K-1-j) * dilation, c],

with x = 0 at negative times: only left padding (``dilation * (K - 1)`` steps), the
cross-correlation convention of torch's conv1d.  Output t depends on inputs at times <= t only,
so future positions never alter prefix outputs.

``causal_depthwise_conv1d_step`` is the same map for one new time step, carrying the last
``dilation * (K - 1)`` inputs as context (incremental decoding).

Two forms of the whole-sequence map, with the same forward: ``causal_depthwise_conv1d_reference``
(:mod:`.reference`, beside the C kernel's :mod:`.c`, which holds itself to it) is K shifted
multiply-adds under autograd; ``causal_depthwise_conv1d`` runs them inside an autograd
Function whose backward gives the same gradients bit for bit without autograd's per-tap zero-filled
gradients of the padded input (each tap's slice backward writes a zero tensor of the padded size and
the K of them are summed). The backward repeats autograd's order: the input gradient starts from the
last tap and adds the taps' shifted products from the last to the first, with the zeros autograd
adds kept where they can change the sign of a zero; each tap's weight gradient is
``sum(grad * x_shifted)`` reduced as autograd reduces a broadcast, plus autograd's zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..fusion import fused_enabled
from . import c
from .reference import _check_input, _shifted_sum, _taps, causal_depthwise_conv1d_reference

__all__ = [
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_partials",
    "causal_depthwise_conv1d_reference",
    "causal_depthwise_conv1d_step",
    "causal_depthwise_conv1d_step_partials",
    "conv_step_taps",
    "conv_context_size",
]


def conv_context_size(kernel_size: int, dilation: int = 1) -> int:
    """Number of past inputs the step function carries: dilation * (K - 1)."""
    return dilation * (kernel_size - 1)


class _CausalDepthwiseConv(torch.autograd.Function):
    """The reference's forward with a backward that needs no zero-filled padded gradients (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dilation):
        ctx.save_for_backward(x, weight)
        ctx.dilation, ctx.has_bias = dilation, bias is not None
        taps = _taps(weight, x.shape[2])
        pad = dilation * (taps.shape[0] - 1)
        return _shifted_sum(F.pad(x, (0, 0, pad, 0)) if pad > 0 else x, taps, bias, dilation)

    @staticmethod
    def backward(ctx, grad):
        # x and the taps are taken again from the inputs, so a double backward sees them as functions of them
        x, weight = ctx.saved_tensors
        dilation = ctx.dilation
        taps = _taps(weight, x.shape[2])
        K = taps.shape[0]
        T = grad.shape[1]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad * taps[K - 1]  # the last tap's slice is x itself
            for j in range(K - 2, -1, -1):
                shift = min((K - 1 - j) * dilation, T)  # x[t] meets grad[t + shift] through tap j
                if shift < T:
                    grad_x[:, : T - shift].add_(grad[:, shift:] * taps[j])  # add_ on the view: no write-back copy
                grad_x[:, T - shift :].add_(0.0)  # autograd's zero fill there
        if ctx.needs_input_grad[1]:
            pad = dilation * (K - 1)
            xp = F.pad(x, (0, 0, pad, 0)) if pad > 0 else x
            rows = [(grad * xp[:, j * dilation : j * dilation + T]).sum_to_size(taps.shape[1]) for j in range(K)]
            grad_taps = torch.stack(rows)  # [K, C]
            if K > 1:
                grad_taps = grad_taps + 0.0  # the other taps' zero-filled gradients
            grad_weight = grad_taps.t().reshape(weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum_to_size(grad.shape[2])
        return grad_x, grad_weight, grad_bias, None


class _FusedCausalDepthwiseConv(torch.autograd.Function):
    """The map by the C kernels of ``depthwise.c`` (:mod:`.c`): forward and backward one pass each; equal
    to the reference to round-off (the weight gradient accumulates in double). A double backward
    differentiates the reference instead."""

    @staticmethod
    def forward(ctx, x, weight, bias, dilation):
        ctx.save_for_backward(x, weight, bias)
        ctx.dilation = dilation
        taps = _taps(weight, x.shape[2]).contiguous()
        return c.forward(x, taps, bias, dilation)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph=True
            inputs = [t for t, need in ((x, need_x), (weight, need_w), (bias, need_b)) if need]
            with torch.enable_grad():
                out = causal_depthwise_conv1d_reference(x, weight, bias, ctx.dilation)
                grads = iter(torch.autograd.grad(out, inputs, grad, create_graph=True))
            return (
                next(grads) if need_x else None,
                next(grads) if need_w else None,
                next(grads) if need_b else None,
                None,
            )
        taps = _taps(weight, x.shape[2]).contiguous()
        dx, dtaps, dbias = c.backward(grad, x, taps, ctx.dilation, need_x, need_w, need_b and bias is not None)
        dweight = dtaps.t().reshape(weight.shape) if need_w else None
        return dx, dweight, dbias, None


@torch.compiler.assume_constant_result
def _kernel_ready(dtype: torch.dtype) -> bool:
    """Built here, and past its first-use check (:mod:`drmlab.ops.self_check`)."""
    from ..self_check import fused_kernel_passes

    cpu = torch.device("cpu")
    return c.unavailable(cpu, dtype) is None and fused_kernel_passes("causal_depthwise_conv1d", cpu, dtype)


def _fused_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (
        fused_enabled()
        and not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None  # no fake tensors into the C kernel
        and x.device.type == "cpu"
        and x.dtype in c.C_DTYPES
        and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype)
        and _kernel_ready(x.dtype)
    )


def causal_depthwise_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    dilation: int = 1,
) -> torch.Tensor:
    """Causal depthwise conv over dim 1 of ``x`` [B, T, C]; weight [C, 1, K] (or [C, K]); bias [C] or None.

    Returns [B, T, C]. Where fused kernels are on (:mod:`drmlab.ops.fusion`), on CPU float32 / float64,
    by the C kernels (:class:`_FusedCausalDepthwiseConv`: within 1e-5 / 1e-12 relative of the reference,
    gradients included). Otherwise equal bit for bit (forward and gradients) to
    :func:`causal_depthwise_conv1d_reference`; with gradients, in eager mode and one dtype throughout,
    through the Function whose backward skips autograd's zero-filled slices (module docstring).
    """
    _check_input(x, dilation)
    _taps(weight, x.shape[2])  # the shape checks
    if _fused_applies(x, weight, bias):
        return _FusedCausalDepthwiseConv.apply(x, weight, bias, dilation)
    same_dtype = weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if not (tracked and same_dtype) or torch.compiler.is_compiling():
        return causal_depthwise_conv1d_reference(x, weight, bias, dilation)
    return _CausalDepthwiseConv.apply(x, weight, bias, dilation)


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
