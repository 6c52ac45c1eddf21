"""The C backend of :func:`drmlab.ops.state_bound`: ``bound.c`` through ctypes, forward and backward
over the rows of contiguous [rows, d] CPU buffers of float32 or float64, split over
``torch.get_num_threads()`` threads. :func:`prepare` checks the ABI version and runs both kernels once
against the plain reference (a guard against a miscompile)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .. import ckernels, threads
from .reference import state_bound_reference

__all__ = ["KERNEL", "forward", "backward", "unavailable", "C_DTYPES"]

SOURCE = Path(__file__).resolve().parent / "bound.c"
ABI_VERSION = 1
PARALLEL_MIN_NUMEL = 1 << 15  # below this many elements a call runs on one thread
C_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def prepare(lib: ctypes.CDLL) -> None:
    """Bind the kernels' signatures, check the ABI version and self-test both dtypes."""
    p, i, f = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double
    for suffix in C_DTYPES.values():
        fwd = getattr(lib, f"drm_bound_fwd_{suffix}")
        fwd.restype, fwd.argtypes = None, [p] * 5 + [f] + [i] * 3
        bwd = getattr(lib, f"drm_bound_bwd_{suffix}")
        bwd.restype, bwd.argtypes = None, [p] * 5 + [f] + [i] * 3
    lib.drm_bound_abi_version.restype, lib.drm_bound_abi_version.argtypes = ctypes.c_int, []
    if lib.drm_bound_abi_version() != ABI_VERSION:
        raise RuntimeError(f"bound.c ABI version {lib.drm_bound_abi_version()}, expected {ABI_VERSION}")
    with torch.enable_grad(), torch.autocast("cpu", enabled=False):  # first use may come under no_grad
        _self_test(lib)


def _self_test(lib: ctypes.CDLL) -> None:
    """Both kernels on rows inside, on and beyond the radius, against autograd through the reference."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in TOLERANCE.items():
        y = (
            torch.randn(6, 5, dtype=dtype, generator=gen)
            * torch.tensor([0.1, 0.5, 1.0, 2.0, 4.0, 0.0], dtype=dtype)[:, None]
        )
        g = torch.randn(6, 5, dtype=dtype, generator=gen)
        y_ref = y.clone().requires_grad_(True)
        ref = state_bound_reference(y_ref, 1.5)
        (ref_grad,) = torch.autograd.grad(ref, y_ref, g)
        out, _, norms = _forward(lib, y, None, 1.5, keep_input=False)
        got_grad = _backward(lib, g, y, out, norms, 1.5)
        for a, b in ((ref.detach(), out), (ref_grad, got_grad)):
            if not torch.allclose(a, b, rtol=tol, atol=tol):
                raise RuntimeError(f"bound.c self-test failed for {dtype}")


KERNEL = ckernels.register(ckernels.CKernel("state_bound", SOURCE, prepare, native=True))


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the C kernel cannot run on ``device`` / ``dtype``; None when it can."""
    return KERNEL.unavailable_on(device, dtype, C_DTYPES)


def _run(fn, args: tuple, rows: int, d: int) -> None:
    """``fn(*args, d, r0, r1)`` over disjoint row ranges on several threads."""
    n = threads.thread_count()
    if n == 1 or rows * d < PARALLEL_MIN_NUMEL:
        fn(*args, d, 0, rows)
        return
    n = min(n, rows)
    edges = [rows * k // n for k in range(n + 1)]
    threads.run_pieces([functools.partial(fn, *args, d, edges[k], edges[k + 1]) for k in range(n)])


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _forward(lib, z: torch.Tensor, x: torch.Tensor | None, radius: float, keep_input: bool):
    z = z.contiguous()
    x = None if x is None else x.contiguous()
    d = z.shape[-1]
    rows = z.numel() // d if d else 0
    out = torch.empty_like(z)
    y = torch.empty_like(z) if keep_input else None
    norms = torch.empty(z.shape[:-1], dtype=z.dtype)
    if out.numel():
        fn = getattr(lib, f"drm_bound_fwd_{C_DTYPES[z.dtype]}")
        _run(fn, (_ptr(z), _ptr(x), _ptr(y), _ptr(out), _ptr(norms), float(radius)), rows, d)
    return out, y, norms


def _backward(lib, g, y, out, norms, radius: float) -> torch.Tensor:
    g = g.contiguous()
    d = y.shape[-1]
    rows = y.numel() // d if d else 0
    dy = torch.empty_like(y)
    if dy.numel():
        fn = getattr(lib, f"drm_bound_bwd_{C_DTYPES[y.dtype]}")
        _run(fn, (_ptr(g), _ptr(y), _ptr(out), _ptr(norms), _ptr(dy), float(radius)), rows, d)
    return dy


def forward(z, x, radius: float, keep_input: bool):
    """(B(z + x) or B(z), z + x when ``keep_input`` and x is given (else None), the row norms)."""
    return _forward(KERNEL.library(), z, x, radius, keep_input)


def backward(g, y, out, norms, radius: float) -> torch.Tensor:
    """The gradient of B at y (the sum z + x where there was one) for the output gradient g."""
    return _backward(KERNEL.library(), g, y, out, norms, radius)
