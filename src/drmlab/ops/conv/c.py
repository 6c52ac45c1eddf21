"""The C backend of :func:`drmlab.ops.causal_depthwise_conv1d`: ``depthwise.c`` through ctypes, the forward
and the whole backward (input, taps and bias gradients) in one pass each over contiguous [B, T, C] CPU
buffers of float32 or float64, split over ``torch.get_num_threads()`` threads by channel blocks.
:func:`prepare` checks the ABI version and runs both kernels once against the plain reference."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .. import ckernels, threads
from .reference import causal_depthwise_conv1d_reference

__all__ = ["KERNEL", "forward", "backward", "unavailable", "C_DTYPES"]

SOURCE = Path(__file__).resolve().parent / "depthwise.c"
ABI_VERSION = 1
PARALLEL_MIN_NUMEL = 1 << 15
C_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def prepare(lib: ctypes.CDLL) -> None:
    """Bind the kernels' signatures, check the ABI version and self-test both dtypes."""
    p, i = ctypes.c_void_p, ctypes.c_longlong
    for suffix in C_DTYPES.values():
        fwd = getattr(lib, f"drm_dwconv_fwd_{suffix}")
        fwd.restype, fwd.argtypes = None, [p] * 4 + [i] * 7
        bwd = getattr(lib, f"drm_dwconv_bwd_{suffix}")
        bwd.restype, bwd.argtypes = ctypes.c_int, [p] * 6 + [i] * 7
    lib.drm_dwconv_abi_version.restype, lib.drm_dwconv_abi_version.argtypes = ctypes.c_int, []
    if lib.drm_dwconv_abi_version() != ABI_VERSION:
        raise RuntimeError(f"depthwise.c ABI version {lib.drm_dwconv_abi_version()}, expected {ABI_VERSION}")
    with torch.enable_grad(), torch.autocast("cpu", enabled=False):  # first use may come under no_grad
        _self_test(lib)


def _self_test(lib: ctypes.CDLL) -> None:
    gen = torch.Generator().manual_seed(0)
    for dtype in C_DTYPES:
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        x = torch.randn(2, 7, 5, dtype=dtype, generator=gen, requires_grad=True)
        w = torch.randn(5, 1, 3, dtype=dtype, generator=gen, requires_grad=True)
        bias = torch.randn(5, dtype=dtype, generator=gen, requires_grad=True)
        g = torch.randn(2, 7, 5, dtype=dtype, generator=gen)
        ref = causal_depthwise_conv1d_reference(x, w, bias, dilation=2)
        ref_grads = torch.autograd.grad(ref, (x, w, bias), g)
        taps = w.detach()[:, 0].t().contiguous()
        got = _forward(lib, x.detach(), taps, bias.detach(), 2)
        got_grads = _backward(lib, g, x.detach(), taps, 2, True, True, True)
        got_grads = (got_grads[0], got_grads[1].t().reshape(w.shape), got_grads[2])
        for a, b in zip((ref.detach(), *ref_grads), (got, *got_grads)):
            if not torch.allclose(a, b, rtol=tol, atol=tol):
                raise RuntimeError(f"depthwise.c self-test failed for {dtype}")


KERNEL = ckernels.register(ckernels.CKernel("causal_depthwise_conv1d", SOURCE, prepare, native=True))


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the C kernel cannot run on ``device`` / ``dtype``; None when it can."""
    return KERNEL.unavailable_on(device, dtype, C_DTYPES)


def _pieces(C: int, numel: int) -> list[tuple[int, int]]:
    """Disjoint channel ranges, whole 16-channel blocks, one per thread."""
    n = threads.thread_count()
    blocks = (C + 15) // 16
    n = 1 if numel < PARALLEL_MIN_NUMEL else min(n, blocks)
    edges = [min(C, 16 * (blocks * k // n)) for k in range(n + 1)]
    edges[-1] = C
    return [(edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _forward(lib, x: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    x = x.contiguous()
    B, T, C = x.shape
    K = taps.shape[0]
    y = torch.empty_like(x)
    if y.numel():
        fn = getattr(lib, f"drm_dwconv_fwd_{C_DTYPES[x.dtype]}")
        args = (_ptr(x), _ptr(taps), _ptr(bias), _ptr(y), B, T, C, K, dilation)
        threads.run_pieces([functools.partial(fn, *args, c0, c1) for c0, c1 in _pieces(C, x.numel())])
    return y


def _backward(lib, g, x, taps, dilation: int, need_x: bool, need_taps: bool, need_bias: bool):
    g, x = g.contiguous(), x.contiguous()
    B, T, C = x.shape
    K = taps.shape[0]
    dx = torch.empty_like(x) if need_x else None
    dtaps = torch.zeros_like(taps) if need_taps else None
    dbias = torch.zeros(C, dtype=x.dtype) if need_bias else None
    if x.numel():
        fn = getattr(lib, f"drm_dwconv_bwd_{C_DTYPES[x.dtype]}")
        args = (_ptr(g), _ptr(x), _ptr(taps), _ptr(dx), _ptr(dtaps), _ptr(dbias), B, T, C, K, dilation)
        codes = []
        threads.run_pieces(
            [functools.partial(lambda *a: codes.append(fn(*a)), *args, c0, c1) for c0, c1 in _pieces(C, x.numel())]
        )
        if any(codes):
            raise MemoryError("causal_depthwise_conv1d: the C kernel could not allocate its weight-gradient scratch")
    elif dx is not None:
        dx.zero_()
    return dx, dtaps, dbias


def forward(x, taps, bias, dilation: int) -> torch.Tensor:
    """y [B, T, C] from x [B, T, C], taps [K, C] (contiguous), bias [C] or None."""
    return _forward(KERNEL.library(), x, taps, bias, dilation)


def backward(g, x, taps, dilation: int, need_x: bool, need_taps: bool, need_bias: bool):
    """(dx or None, dtaps [K, C] or None, dbias or None) for the output gradient g."""
    return _backward(KERNEL.library(), g, x, taps, dilation, need_x, need_taps, need_bias)
