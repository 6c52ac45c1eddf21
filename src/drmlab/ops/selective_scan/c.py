r"""The C backend of :func:`drmlab.ops.selective_scan`: the fused kernels of ``selective_scan.c``.

Mamba's selective scan h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t, y_t = C_t . h_t (Gu & Dao,
2023, Algorithm 2) on CPU in float32 or float64, without materialising the [B, T, E, N] states,
decays exp(dt A) or drives (dt x) B: the forward keeps the [N, E] state of one sequence in a
running buffer and stores only y, the last state and the state entering every segment of ``K``
steps; the backward recomputes one segment at a time and runs the adjoint recurrence (formulas
in the C file).  Memory O(B T (E + N E / K)); sequences are split over
``torch.get_num_threads()`` threads.  float32 uses a vectorisable exp (within 1.35 ulp;
torch.exp: 1.03).  :mod:`drmlab.ops.ckernels` builds and loads the kernel; :func:`prepare` binds
its symbols.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from .. import ckernels, threads

__all__ = ["KERNEL", "SOURCE", "prepare", "scan", "unavailable", "C_DTYPES"]

SOURCE = Path(__file__).resolve().parent / "selective_scan.c"
C_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
# states + decays of one segment per thread: about this many elements
SEGMENT_ELEMENTS = 1 << 17


def prepare(lib: ctypes.CDLL) -> None:
    """Bind the signatures of the forward, backward and float32 exp kernels."""
    p, i = ctypes.c_void_p, ctypes.c_longlong
    for suffix in C_DTYPES.values():
        fwd = getattr(lib, f"drm_sscan_fwd_{suffix}")
        fwd.restype, fwd.argtypes = None, [p] * 9 + [i] * 7
        bwd = getattr(lib, f"drm_sscan_bwd_{suffix}")
        bwd.restype, bwd.argtypes = None, [p] * 17 + [i] * 7
    lib.drm_expf_array.restype, lib.drm_expf_array.argtypes = None, [p, p, i]


KERNEL = ckernels.register(ckernels.CKernel("selective_scan", SOURCE, prepare))


def unavailable(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Why the kernel cannot run on ``device`` / compute ``dtype``; None when it can."""
    if device.type != "cpu":
        return "the C kernel runs on CPU tensors only"
    if dtype not in C_DTYPES:
        return "the C kernel computes in float32 or float64 only"
    if ckernels.disabled_by_env():
        return f"disabled by {ckernels.DISABLE_ENV}"
    if not KERNEL.available():
        return KERNEL.status()["error"]
    return None


def _segment_length(T: int, S: int) -> int:
    return max(1, min(T, max(8, SEGMENT_ELEMENTS // (2 * S))))


def _batch_pieces(n_items: int) -> list[tuple[int, int]]:
    n = max(1, min(threads.thread_count(), n_items))
    edges = [n_items * k // n for k in range(n + 1)]
    return [(edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]


def _ptr(t):
    return None if t is None else t.data_ptr()


class _SelectiveScanC(torch.autograd.Function):
    """The fused C kernel. Inputs contiguous, one dtype: x, dt [B, T, E]; At [N, E]; Bm, Cm
    [B, T, N]; h0 [B, N, E] or None. Outputs y [B, T, E] and the last state [B, N, E]."""

    @staticmethod
    def forward(ctx, x, dt, At, Bm, Cm, h0):
        lib = KERNEL.library()
        b, length, e = x.shape
        n = At.shape[0]
        k = _segment_length(length, n * e)
        nseg = -(-length // k)
        y = torch.empty_like(x)
        h_last = x.new_empty(b, n, e)
        need_grad = any(ctx.needs_input_grad)
        ck = x.new_empty(b, nseg, n, e) if need_grad else None
        fn = getattr(lib, f"drm_sscan_fwd_{C_DTYPES[x.dtype]}")
        args = tuple(map(_ptr, (x, dt, At, Bm, Cm, h0, y, h_last, ck))) + (b, length, e, n, k)
        threads.run_pieces([functools.partial(fn, *args, b0, b1) for b0, b1 in _batch_pieces(b)])
        ctx.segment = k
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(x, dt, At, Bm, Cm, ck)
        return y, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        x, dt, At, Bm, Cm, ck = ctx.saved_tensors
        lib = KERNEL.library()
        b, length, e = x.shape
        n, k = At.shape[0], ctx.segment
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dh_last = None if dh_last is None else dh_last.contiguous()
        dx, ddt = torch.empty_like(x), torch.empty_like(dt)
        dB, dC = torch.empty_like(Bm), torch.empty_like(Cm)
        dh0 = x.new_empty(b, n, e) if ctx.has_h0 else None
        pieces = _batch_pieces(b)
        # each thread its own dA accumulator and workspaces
        dA = x.new_zeros(len(pieces), n, e)
        work = x.new_empty(len(pieces), 2, k, n, e)
        g = x.new_empty(len(pieces), n, e)
        fn = getattr(lib, f"drm_sscan_bwd_{C_DTYPES[x.dtype]}")
        shared = tuple(map(_ptr, (x, dt, At, Bm, Cm, ck, dy, dh_last, dx, ddt)))
        threads.run_pieces([
            functools.partial(fn, *shared, *map(_ptr, (dA[i], dB, dC, dh0, work[i, 0], work[i, 1], g[i])),
                              b, length, e, n, k, b0, b1)
            for i, (b0, b1) in enumerate(pieces)
        ])
        return dx, ddt, dA.sum(0), dB, dC, dh0


def scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False):
    """(y [B, T, E], h_{T-1} [B, E, N]) from checked inputs with B, T > 0 (the layout of
    :func:`drmlab.ops.selective_scan`).  ``chunk`` and ``recompute`` tune the chunked torch path
    only: the kernel picks its own segment length and always recomputes."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type="cpu", enabled=False):
        x, dt, Bm, Cm = (t.to(dtype).contiguous() for t in (x, dt, Bm, Cm))
        At = A.to(dtype).t().contiguous()
        h0t = None if h0 is None else h0.to(dtype).transpose(1, 2).contiguous()
        y, h_last = _SelectiveScanC.apply(x, dt, At, Bm, Cm, h0t)
    return y, h_last.transpose(1, 2)
