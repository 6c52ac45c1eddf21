r"""The C backend of :func:`drmlab.ops.selective_scan`: the fused kernels of ``selective_scan.c``.

Mamba's selective scan h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t, y_t = C_t . h_t (Gu & Dao,
2023, Algorithm 2) on CPU in float32 or float64, without materialising the [B, T, E, N] states,
decays exp(dt A) or drives (dt x) B: the forward keeps the [N, E] state of one sequence in a
running buffer and stores only y, the last state and the state entering every segment of ``K``
steps; the backward recomputes one segment at a time and runs the adjoint recurrence (formulas
in the C file).  Memory O(B T (E + N E / K)); sequences are split over
``torch.get_num_threads()`` threads.  float32 uses a vectorisable exp (within 1.35 ulp;
torch.exp: 1.03).  :mod:`drmlab.ops.ckernels` builds and loads the kernel, for this processor
(``native=True``); :func:`prepare` binds its symbols.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .. import ckernels, threads
from .op import fused_scan

__all__ = ["KERNEL", "SOURCE", "prepare", "scan", "forward", "backward", "saved_shape", "unavailable", "C_DTYPES"]

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


KERNEL = ckernels.register(ckernels.CKernel("selective_scan", SOURCE, prepare, native=True))


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run on ``device`` / compute ``dtype``; None when it can."""
    return KERNEL.unavailable_on(device, dtype, C_DTYPES)


def _segment_length(T: int, S: int) -> int:
    return max(1, min(T, max(8, SEGMENT_ELEMENTS // (2 * S))))


def _batch_pieces(n_items: int) -> list[tuple[int, int]]:
    n = max(1, min(threads.thread_count(), n_items))
    edges = [n_items * k // n for k in range(n + 1)]
    return [(edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]


def _ptr(t):
    return None if t is None else t.data_ptr()


def saved_shape(b: int, length: int, e: int, n: int) -> tuple[int, int, int, int]:
    """The shape of what :func:`forward` keeps for the backward: the state entering every
    segment, [B, segments, N, E]."""
    k = _segment_length(length, n * e)
    return (b, -(-length // k), n, e)


def forward(x, dt, A, Bm, Cm, h0, need_grad: bool):
    """The fused forward on contiguous inputs of one C dtype (x, dt [B, T, E]; A [E, N]; Bm, Cm
    [B, T, N]; h0 [B, E, N] or None; T > 0): (y [B, T, E], h_{T-1} [B, E, N], the segment
    states of :func:`saved_shape` when ``need_grad``, else an empty tensor)."""
    lib = KERNEL.library()
    b, length, e = x.shape
    n = A.shape[1]
    At = A.t().contiguous()
    h0t = None if h0 is None else h0.transpose(1, 2).contiguous()
    k = _segment_length(length, n * e)
    y = torch.empty_like(x)
    h_last = x.new_empty(b, n, e)
    ck = x.new_empty(saved_shape(b, length, e, n)) if need_grad else x.new_empty(0)
    fn = getattr(lib, f"drm_sscan_fwd_{C_DTYPES[x.dtype]}")
    args = tuple(map(_ptr, (x, dt, At, Bm, Cm, h0t, y, h_last, ck if need_grad else None))) + (b, length, e, n, k)
    threads.run_pieces([functools.partial(fn, *args, b0, b1) for b0, b1 in _batch_pieces(b)])
    return y, h_last.transpose(1, 2).contiguous(), ck


def backward(x, dt, A, Bm, Cm, h0, ck, dy, dh_last):
    """(dx, ddt, dA, dB, dC, dh0) from the inputs of :func:`forward`, its segment states ``ck``
    and the output gradients (dy [B, T, E]; dh_last [B, E, N] or None); dh0 is an empty tensor
    when h0 is None.  Each segment is recomputed from its entering state, then the adjoint
    recurrence runs back through it (formulas in the C file)."""
    lib = KERNEL.library()
    b, length, e = x.shape
    n = A.shape[1]
    k = _segment_length(length, n * e)
    if ck.shape != saved_shape(b, length, e, n):
        raise RuntimeError(
            f"selective_scan C backward: segment states {tuple(ck.shape)}, expected "
            f"{saved_shape(b, length, e, n)} (SEGMENT_ELEMENTS changed between forward and backward?)"
        )
    At = A.t().contiguous()
    dy = dy.contiguous()
    dh_last = None if dh_last is None else dh_last.transpose(1, 2).contiguous()
    dx, ddt = torch.empty_like(x), torch.empty_like(dt)
    dB, dC = torch.empty_like(Bm), torch.empty_like(Cm)
    dh0 = x.new_empty(b, n, e) if h0 is not None else None
    pieces = _batch_pieces(b)
    # each thread its own dA accumulator and workspaces
    dA = x.new_zeros(len(pieces), n, e)
    work = x.new_empty(len(pieces), 2, k, n, e)
    g = x.new_empty(len(pieces), n, e)
    fn = getattr(lib, f"drm_sscan_bwd_{C_DTYPES[x.dtype]}")
    shared = tuple(map(_ptr, (x, dt, At, Bm, Cm, ck, dy, dh_last, dx, ddt)))
    threads.run_pieces(
        [
            functools.partial(
                fn, *shared, *map(_ptr, (dA[i], dB, dC, dh0, work[i, 0], work[i, 1], g[i])), b, length, e, n, k, b0, b1
            )
            for i, (b0, b1) in enumerate(pieces)
        ]
    )
    dh0 = x.new_empty(0) if dh0 is None else dh0.transpose(1, 2).contiguous()
    return dx, ddt, dA.sum(0).t().contiguous(), dB, dC, dh0


def scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False):
    """(y [B, T, E], h_{T-1} [B, E, N]) from checked inputs with B, T > 0 (the layout of
    :func:`drmlab.ops.selective_scan`), through the custom operator ``drmlab::selective_scan``
    (:mod:`.op`: its gradient and fake implementation; one opaque node under ``torch.compile``).
    ``chunk`` and ``recompute`` tune the chunked torch path only: the kernel picks its own
    segment length and always recomputes."""
    return fused_scan(x, dt, A, Bm, Cm, h0, "c")
