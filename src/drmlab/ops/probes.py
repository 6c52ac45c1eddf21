r"""The first-use probes of the checked operators (:mod:`drmlab.ops.self_check`).

A probe ``probe(backend, device, dtype)`` runs its operator on a small fixed input through one backend,
forward and gradient, and returns the largest relative error of the output and every gradient
(:func:`~drmlab.ops.self_check.relative_error`) against the operator's plain reference, run in float64 /
complex128 on the same rounded inputs.

The probes sit above the operators they run (each imports its operator on use), and this module lists them
in :data:`drmlab.ops.self_check.PROBES`, where the check looks a probe up: the check itself knows no
operator, so the backend dispatcher (:mod:`drmlab.ops.backends`) that every operator imports can import it.
``drmlab.ops`` imports this module, so the table is filled before any operator runs.
"""

from __future__ import annotations

import math

import torch

from .self_check import PROBES, relative_error


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(36)


def _leaves(tensors, dtype, device):
    """(the inputs rounded to ``dtype`` on ``device`` as leaves, the same rounded values widened
    to float64 / complex128 on the CPU as the reference's leaves)."""
    got, ref = [], []
    for t in tensors:
        rounded = t.to(dtype)
        got.append(rounded.to(device).requires_grad_())
        wide = torch.complex128 if rounded.is_complex() else torch.float64
        ref.append(rounded.to(wide).requires_grad_())
    return got, ref


def _linear_scan_probe(backend: str, device: torch.device, dtype: torch.dtype) -> float:
    from .linear_scan import linear_scan, linear_scan_reference

    gen, shape = _generator(), (2, 13, 5)
    if dtype.is_complex:
        mag = torch.rand(shape, generator=gen, dtype=torch.float64)
        f = torch.polar(mag, 2 * math.pi * torch.rand(shape, generator=gen, dtype=torch.float64))
        u, dm = (torch.randn(shape, generator=gen, dtype=torch.complex128) for _ in range(2))
        init = torch.randn(shape[0], shape[2], generator=gen, dtype=torch.complex128)
    else:
        f = torch.sigmoid(2 * torch.randn(shape, generator=gen, dtype=torch.float64))
        u, dm = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(2))
        init = torch.randn(shape[0], shape[2], generator=gen, dtype=torch.float64)
    leaves, refs = _leaves((f, u, init), dtype, device)
    dm = dm.to(dtype)
    out = linear_scan(*leaves, backend=backend)
    grads = torch.autograd.grad(out, leaves, dm.to(device))
    ref = linear_scan_reference(*refs)
    ref_grads = torch.autograd.grad(ref, refs, dm.to(ref.dtype))
    return max(relative_error(a, b) for a, b in zip((out, *grads), (ref, *ref_grads)))


def _selective_scan_probe(backend: str, device: torch.device, dtype: torch.dtype) -> float:
    from .selective_scan import selective_scan, selective_scan_reference

    gen = _generator()
    b, length, e, n = 2, 13, 5, 3
    x = torch.randn(b, length, e, generator=gen, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(b, length, e, generator=gen, dtype=torch.float64))
    A = -2 * torch.rand(e, n, generator=gen, dtype=torch.float64)
    Bm, Cm = (torch.randn(b, length, n, generator=gen, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(b, e, n, generator=gen, dtype=torch.float64)
    dy = torch.randn(b, length, e, generator=gen, dtype=torch.float64).to(dtype)
    dh = torch.randn(b, e, n, generator=gen, dtype=torch.float64).to(dtype)
    leaves, refs = _leaves((x, dt, A, Bm, Cm, h0), dtype, device)
    y, h = selective_scan(*leaves, backend=backend)
    grads = torch.autograd.grad((y * dy.to(device)).sum() + (h * dh.to(device)).sum(), leaves)
    y_ref, h_ref = selective_scan_reference(*refs)
    ref_grads = torch.autograd.grad((y_ref * dy.double()).sum() + (h_ref * dh.double()).sum(), refs)
    return max(relative_error(a, b) for a, b in zip((y, h, *grads), (y_ref, h_ref, *ref_grads)))


def _state_bound_probe(backend: str, device: torch.device, dtype: torch.dtype) -> float:
    from .state_bound.op import EagerStateBound
    from .state_bound.reference import state_bound_reference

    gen = _generator()
    y = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    y = y * torch.tensor([0.0, 0.1, 0.5, 1.5, 3.0, 9.0], dtype=torch.float64)[:, None]
    x = 0.01 * torch.randn(6, 9, generator=gen, dtype=torch.float64)
    g = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    leaves, refs = _leaves((y, x), dtype, device)
    out = EagerStateBound.apply(leaves[0], leaves[1], 2.0)
    grads = torch.autograd.grad(out, leaves, g.to(dtype).to(device))
    ref = state_bound_reference(refs[0] + refs[1], 2.0)
    ref_grads = torch.autograd.grad(ref, refs, g.to(dtype).double())
    return max(relative_error(a, b) for a, b in zip((out, *grads), (ref, *ref_grads)))


def _depthwise_conv_probe(backend: str, device: torch.device, dtype: torch.dtype) -> float:
    from .conv.causal_depthwise import _FusedCausalDepthwiseConv
    from .conv.reference import causal_depthwise_conv1d_reference

    gen = _generator()
    x = torch.randn(2, 11, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(5, 1, 4, generator=gen, dtype=torch.float64)
    bias = torch.randn(5, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 11, 5, generator=gen, dtype=torch.float64)
    leaves, refs = _leaves((x, w, bias), dtype, device)
    out = _FusedCausalDepthwiseConv.apply(*leaves, 2)
    grads = torch.autograd.grad(out, leaves, g.to(dtype).to(device))
    ref = causal_depthwise_conv1d_reference(*refs, dilation=2)
    ref_grads = torch.autograd.grad(ref, refs, g.to(dtype).double())
    return max(relative_error(a, b) for a, b in zip((out, *grads), (ref, *ref_grads)))


PROBES.update(
    {
        "linear_scan": _linear_scan_probe,
        "selective_scan": _selective_scan_probe,
        "state_bound": _state_bound_probe,
        "causal_depthwise_conv1d": _depthwise_conv_probe,
    }
)
