r"""The C backend of :func:`drmlab.ops.linear_scan`: the kernels of ``scan.c`` through ctypes.

``scan.c`` (plain C99, no torch headers) holds the forward m_t = f_t m_{t-1} + u_t and the
reverse-scan backward of ``docs/drm.md`` section 9 for float32, float64, complex64 and
complex128, on contiguous CPU buffers.  :mod:`drmlab.ops.ckernels` builds and loads it;
:func:`prepare` binds its symbols, checks its ABI version and runs every kernel once against the
pure-torch backend (a guard against a miscompile).  A call is split over ``torch.get_num_threads()``
threads: over batch rows when there are enough, else over blocks of 16 channels.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .. import ckernels, threads
from . import log_depth

__all__ = ["KERNEL", "SOURCE", "prepare", "forward", "backward", "unavailable", "DENSE_INPUTS", "C_DTYPES"]

SOURCE = Path(__file__).resolve().parent / "scan.c"
ABI_VERSION = 2
# Below this many elements per call the work is not split between threads.
PARALLEL_MIN_NUMEL = 1 << 16
# the kernels read dense [B, T, D] buffers
DENSE_INPUTS = True

C_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.complex64: "c64",
    torch.complex128: "c128",
}


def prepare(lib: ctypes.CDLL) -> None:
    """Bind the kernels' signatures, check the ABI version and self-test every dtype."""
    p, i = ctypes.c_void_p, ctypes.c_longlong
    for suffix in C_DTYPES.values():
        fwd = getattr(lib, f"drm_scan_fwd_{suffix}")
        fwd.restype, fwd.argtypes = None, [p] * 4 + [i] * 7
        bwd = getattr(lib, f"drm_scan_bwd_{suffix}")
        bwd.restype, bwd.argtypes = None, [p] * 7 + [i] * 7
    lib.drm_scan_abi_version.restype = ctypes.c_int
    lib.drm_scan_abi_version.argtypes = []
    if lib.drm_scan_abi_version() != ABI_VERSION:
        raise RuntimeError(f"scan.c ABI version {lib.drm_scan_abi_version()}, expected {ABI_VERSION}")
    _self_test(lib)


def _self_test(lib: ctypes.CDLL) -> None:
    """A tiny run of every kernel against the pure-torch backend."""
    gen = torch.Generator().manual_seed(0)
    for dtype in C_DTYPES:
        f, u, dm = (torch.randn(2, 5, 3, dtype=dtype, generator=gen) for _ in range(3))
        m0 = torch.randn(2, 3, dtype=dtype, generator=gen)
        ref = log_depth.forward(f, u, m0)
        got = _forward(lib, f, u, m0)
        ref_grads = log_depth.backward(f, ref, m0, dm, True, True)
        got_grads = _backward(lib, f, ref, m0, dm, True, True)
        tol = 1e-5 if dtype in (torch.float32, torch.complex64) else 1e-12
        for a, b in zip((ref, *ref_grads), (got, *got_grads)):
            if not torch.allclose(a, b, rtol=tol, atol=tol):
                raise RuntimeError(f"scan.c self-test failed for {dtype}")


KERNEL = ckernels.register(ckernels.CKernel("linear_scan", SOURCE, prepare))


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the C kernel cannot run on ``device`` / compute ``dtype``; None when it can."""
    if device.type != "cpu":
        return "the C kernel runs on CPU tensors only"
    if dtype not in C_DTYPES:
        return "the C kernel computes in float32, float64, complex64 or complex128 only"
    if ckernels.disabled_by_env():
        return f"disabled by {ckernels.DISABLE_ENV}"
    if not KERNEL.available():
        return KERNEL.status()["error"]
    return None


def _dense(x: torch.Tensor | None) -> torch.Tensor | None:
    """A contiguous buffer with conjugation and negation views resolved, or None."""
    if x is None:
        return None
    if x.is_complex():
        x = x.resolve_conj()
    return x.resolve_neg().contiguous()


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _pieces(B: int, D: int, n: int) -> list[tuple[int, int, int, int]]:
    """Disjoint (b0, b1, d0, d1) pieces of a [B, ., D] call for n threads: batch rows when
    B >= n, else blocks of 16 channels (whole cache lines, full vectors)."""
    if B >= n:
        edges = [B * k // n for k in range(n + 1)]
        return [(edges[k], edges[k + 1], 0, D) for k in range(n) if edges[k + 1] > edges[k]]
    blocks = (D + 15) // 16
    n = min(n, blocks)
    edges = [min(D, 16 * (blocks * k // n)) for k in range(n + 1)]
    edges[-1] = D
    return [(0, B, edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]


def _run(fn, args: tuple, B: int, T: int, D: int) -> None:
    """``fn(*args, B, T, D, b0, b1, d0, d1)`` over disjoint pieces on several threads."""
    n = threads.thread_count()
    pieces = [(0, B, 0, D)] if n == 1 or B * T * D < PARALLEL_MIN_NUMEL else _pieces(B, D, n)
    threads.run_pieces([functools.partial(fn, *args, B, T, D, *piece) for piece in pieces])


def _forward(lib: ctypes.CDLL, f, u, init):
    f, u, init = _dense(f), _dense(u), _dense(init)
    B, T, D = u.shape
    out = torch.empty((B, T, D), dtype=u.dtype)
    if out.numel() == 0:
        return out
    fn = getattr(lib, f"drm_scan_fwd_{C_DTYPES[u.dtype]}")
    _run(fn, (_ptr(f), _ptr(u), _ptr(init), _ptr(out)), B, T, D)
    return out


def _backward(lib: ctypes.CDLL, f, m, init, dm, need_f: bool, need_init: bool):
    f, m, init, dm = _dense(f), _dense(m), _dense(init), _dense(dm)
    B, T, D = m.shape
    du = torch.empty_like(m)
    df = torch.empty_like(m) if need_f else None
    dinit = torch.empty((B, D), dtype=m.dtype) if (need_init and init is not None) else None
    if m.numel() == 0:
        if dinit is not None:
            dinit.zero_()
        return du, df, dinit
    fn = getattr(lib, f"drm_scan_bwd_{C_DTYPES[m.dtype]}")
    _run(fn, (_ptr(f), _ptr(m), _ptr(init), _ptr(dm), _ptr(du), _ptr(df), _ptr(dinit)), B, T, D)
    return du, df, dinit


def forward(f: torch.Tensor, u: torch.Tensor, init: torch.Tensor | None) -> torch.Tensor:
    """The states m [B, T, D] (inputs: CPU [B, T, D] of one C dtype; init [B, D] or None)."""
    return _forward(KERNEL.library(), f, u, init)


def backward(
    f: torch.Tensor, m: torch.Tensor, init: torch.Tensor | None, dm: torch.Tensor, need_f: bool, need_init: bool
):
    """(du, df or None, dinit or None), as :func:`drmlab.ops.linear_scan.log_depth.backward`."""
    return _backward(KERNEL.library(), f, m, init, dm, need_f, need_init)
