r"""The selective scan of Mamba (Gu & Dao, 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", section 3 and Algorithm 2):

    h_t = exp(dt_t A) * h_{t-1} + (dt_t x_t) B_t,    y_t = C_t . h_t

per channel e (x, dt: [B, T, E]) and state index n (A: [E, N]; B_t, C_t: [B, T, N]).

Two implementations of the same map, with :func:`selective_scan_reference` (a plain loop over
time) beside them:

* ``"c"`` (CPU, float32 / float64): a fused C kernel (``csrc/selective_scan.c``, built with the
  linear-scan kernel of :mod:`drmlab.ops.scan`). The [B, T, E, N] tensors of states, decays
  exp(dt A) and drives (dt x) B are never materialised: the forward keeps the [N, E] state of one
  sequence in a running buffer and stores only y, the last state and the state entering every
  segment of ``K`` steps; the backward recomputes one segment at a time and runs the adjoint
  recurrence (formulas in the C file). Memory O(B T (E + N E / K)); sequences are split across
  ``torch.get_num_threads()`` threads. float32 uses a vectorisable exp (within 1.35 ulp; torch.exp: 1.03).
* ``"torch"`` (every device): time in chunks, each chunk one
  :func:`drmlab.ops.linear_scan` over the flattened (E, N) channels, with three small autograd
  functions for exp(dt A), the outer product (dt x) B^T and the read-out (``chunk``,
  ``recompute`` = activation checkpointing per chunk).

Both are exact recurrences: no division by cumulative gate products, no logarithm of a gate.
"""

from __future__ import annotations

import ctypes

import torch
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from . import scan as _scan
from .scan import linear_scan

__all__ = ["selective_scan", "selective_scan_reference", "selective_scan_backend"]

_C_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
# states + decays of one segment per thread: about this many elements
_SEGMENT_ELEMENTS = 1 << 17
_bound: set = set()


def _c_lib():
    """The loaded kernel library with the selective-scan symbols bound, or None."""
    if not _scan.c_kernel_available():
        return None
    lib = _scan._load_library()
    if id(lib) not in _bound:
        p, i = ctypes.c_void_p, ctypes.c_longlong
        for suf in _C_SUFFIX.values():
            fwd = getattr(lib, f"drm_sscan_fwd_{suf}")
            fwd.restype, fwd.argtypes = None, [p] * 9 + [i] * 7
            bwd = getattr(lib, f"drm_sscan_bwd_{suf}")
            bwd.restype, bwd.argtypes = None, [p] * 17 + [i] * 7
        lib.drm_expf_array.restype, lib.drm_expf_array.argtypes = None, [p, p, i]
        _bound.add(id(lib))
    return lib


def selective_scan_backend(x: torch.Tensor) -> str:
    """``"c"`` or ``"torch"``: the path :func:`selective_scan` takes for inputs like ``x``."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    if x.device.type != "cpu" or dtype not in _C_SUFFIX:
        return "torch"
    return "c" if _c_lib() is not None else "torch"


def _segment_length(T: int, S: int) -> int:
    return max(1, min(T, max(8, _SEGMENT_ELEMENTS // (2 * S))))


def _split(n_items: int) -> list[tuple[int, int]]:
    n = max(1, min(_scan._num_threads(), n_items))
    edges = [n_items * k // n for k in range(n + 1)]
    return [(edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]


def _run(fn, pieces, per_piece_args):
    """fn(*per_piece_args(k), b0, b1) for every piece, the first on this thread."""
    if len(pieces) == 1:
        fn(*per_piece_args(0), *pieces[0])
        return
    pool = _scan._get_pool(len(pieces) - 1)
    futures = [pool.submit(fn, *per_piece_args(k), *pieces[k]) for k in range(1, len(pieces))]
    fn(*per_piece_args(0), *pieces[0])
    for fut in futures:
        fut.result()


def _ptr(t):
    return None if t is None else t.data_ptr()


class _SelectiveScanC(torch.autograd.Function):
    """The fused C kernel. Inputs contiguous, one dtype: x, dt [B, T, E]; At [N, E]; Bm, Cm
    [B, T, N]; h0 [B, N, E] or None. Outputs y [B, T, E] and the last state [B, N, E]."""

    @staticmethod
    def forward(ctx, x, dt, At, Bm, Cm, h0):
        lib = _c_lib()
        b, length, e = x.shape
        n = At.shape[0]
        k = _segment_length(length, n * e)
        nseg = -(-length // k)
        y = torch.empty_like(x)
        h_last = x.new_empty(b, n, e)
        need_grad = any(ctx.needs_input_grad)
        ck = x.new_empty(b, nseg, n, e) if need_grad else None
        fn = getattr(lib, f"drm_sscan_fwd_{_C_SUFFIX[x.dtype]}")
        args = tuple(map(_ptr, (x, dt, At, Bm, Cm, h0, y, h_last, ck))) + (b, length, e, n, k)
        _run(fn, _split(b), lambda i: args)
        ctx.segment = k
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(x, dt, At, Bm, Cm, ck)
        return y, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        x, dt, At, Bm, Cm, ck = ctx.saved_tensors
        lib = _c_lib()
        b, length, e = x.shape
        n, k = At.shape[0], ctx.segment
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dh_last = None if dh_last is None else dh_last.contiguous()
        dx, ddt = torch.empty_like(x), torch.empty_like(dt)
        dB, dC = torch.empty_like(Bm), torch.empty_like(Cm)
        dh0 = x.new_empty(b, n, e) if ctx.has_h0 else None
        pieces = _split(b)
        dA = x.new_zeros(len(pieces), n, e)
        work = x.new_empty(len(pieces), 2, k, n, e)
        g = x.new_empty(len(pieces), n, e)
        fn = getattr(lib, f"drm_sscan_bwd_{_C_SUFFIX[x.dtype]}")
        shared = tuple(map(_ptr, (x, dt, At, Bm, Cm, ck, dy, dh_last, dx, ddt)))

        def args(i):
            return shared + tuple(map(_ptr, (dA[i], dB, dC, dh0, work[i, 0], work[i, 1], g[i]))) + (
                b, length, e, n, k)

        _run(fn, pieces, args)
        return dx, ddt, dA.sum(0), dB, dC, dh0


def selective_scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False,
                   backend: str = "auto"):
    """The selective scan y_t = C_t . h_t, h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t.

    x, dt: [B, T, E]; A: [E, N]; Bm, Cm: [B, T, N]; h0: [B, E, N] or None (zeros).
    Returns (y [B, T, E], h_{T-1} [B, E, N]) in float32 or float64 (the promoted input dtype; the
    scan runs outside any autocast). ``backend``: ``"auto"`` (the C kernel on CPU when it is
    built, else torch), ``"c"`` or ``"torch"``; ``chunk`` and ``recompute`` tune the torch path.
    """
    if backend not in ("auto", "c", "torch"):
        raise ValueError(f"backend must be 'auto', 'c' or 'torch', got {backend!r}")
    if x.dim() != 3 or dt.shape != x.shape:
        raise ValueError(f"x and dt must be [B, T, E] of one shape, got {tuple(x.shape)} and {tuple(dt.shape)}")
    b, length, e = x.shape
    if A.dim() != 2 or A.shape[0] != e:
        raise ValueError(f"A must be [E={e}, N], got {tuple(A.shape)}")
    n = A.shape[1]
    for name, t in (("Bm", Bm), ("Cm", Cm)):
        if t.shape != (b, length, n):
            raise ValueError(f"{name} must be [B, T, N] = {(b, length, n)}, got {tuple(t.shape)}")
    if h0 is not None and h0.shape != (b, e, n):
        raise ValueError(f"h0 must be [B, E, N] = {(b, e, n)}, got {tuple(h0.shape)}")
    available = selective_scan_backend(x)
    chosen = available if backend == "auto" else backend
    if chosen == "c" and available != "c":
        raise RuntimeError("the C selective-scan kernel is not available for these inputs "
                           f"(device {x.device.type}, dtype {x.dtype}; drmlab.ops.scan.c_kernel_status())")
    if chosen == "torch" or length == 0 or b == 0:
        return _torch_selective_scan(x, dt, A, Bm, Cm, h0, chunk=chunk, recompute=recompute)
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type="cpu", enabled=False):
        x, dt, Bm, Cm = (t.to(dtype).contiguous() for t in (x, dt, Bm, Cm))
        At = A.to(dtype).t().contiguous()
        h0t = None if h0 is None else h0.to(dtype).transpose(1, 2).contiguous()
        y, h_last = _SelectiveScanC.apply(x, dt, At, Bm, Cm, h0t)
    return y, h_last.transpose(1, 2)


class _Decay(torch.autograd.Function):
    """exp(dt A) as [B, L, E * N] from dt [B, L, E] and A [E, N]; the backward contracts over
    the state index with one einsum each for d dt and d A."""

    @staticmethod
    def forward(ctx, dt, A):
        b, length, e = dt.shape
        out = torch.mul(dt.unsqueeze(-1), A).exp_()
        ctx.save_for_backward(dt, A, out)
        return out.view(b, length, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        dt, A, out = ctx.saved_tensors
        w = torch.mul(grad.view(out.shape), out)  # d(dt A)
        return torch.einsum("blen,en->ble", w, A), torch.einsum("blen,ble->en", w, dt)


class _Drive(torch.autograd.Function):
    """(dt x) B as [B, L, E * N] from dtx [B, L, E] and Bm [B, L, N] (an outer product per
    position); the backward is two batched matrix products."""

    @staticmethod
    def forward(ctx, dtx, Bm):
        b, length, e = dtx.shape
        ctx.save_for_backward(dtx, Bm)
        return torch.mul(dtx.unsqueeze(-1), Bm.unsqueeze(2)).view(b, length, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        dtx, Bm = ctx.saved_tensors
        b, length, e = dtx.shape
        n, rows = Bm.shape[-1], b * length
        g = grad.reshape(rows, e, n)
        d_dtx = torch.bmm(g, Bm.reshape(rows, n, 1)).view(b, length, e)
        dB = torch.bmm(dtx.reshape(rows, 1, e), g).view(b, length, n)
        return d_dtx, dB


class _Readout(torch.autograd.Function):
    """y[b, t, e] = sum_n h[b, t, e, n] C[b, t, n] (one batched matrix-vector product) and the
    last state h[:, -1] (which starts the next chunk), from states [B, L, E * N]."""

    @staticmethod
    def forward(ctx, states, Cm):
        b, length, n = Cm.shape
        rows = b * length
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(states, Cm)
        y = torch.bmm(states.view(rows, -1, n), Cm.reshape(rows, n, 1)).view(b, length, -1)
        return y, states[:, -1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        states, Cm = ctx.saved_tensors
        b, length, n = Cm.shape
        rows = b * length
        if dy is None:
            dstates = torch.zeros_like(states)
            dC = torch.zeros_like(Cm)
        else:
            e = dy.shape[-1]
            dstates = torch.mul(dy.unsqueeze(-1), Cm.unsqueeze(2)).view(b, length, e * n)
            dC = torch.bmm(dy.reshape(rows, 1, e), states.view(rows, e, n)).view(b, length, n)
        if dlast is not None:
            dstates[:, -1] += dlast
        return dstates, dC


AUTO_CHUNK_ELEMENTS = 1 << 21


def _scan_chunk(dtx, dt, A, Bm, Cm, h):
    """One chunk of the selective scan: (y [B, L, E], last state [B, E * N])."""
    decay = _Decay.apply(dt, A)
    drive = _Drive.apply(dtx, Bm)
    return _Readout.apply(linear_scan(decay, drive, h), Cm)


def _torch_selective_scan(x, dt, A, Bm, Cm, h0=None, chunk: int = 0, recompute: bool = False):
    """The selective scan on :func:`drmlab.ops.linear_scan` (any device).

    Time is processed in chunks of ``chunk`` steps (0: about 2^21 state elements B * chunk * E * N
    per chunk), each a :func:`drmlab.ops.linear_scan` over the flattened (E, N) channels started
    from the previous chunk's last state, so the [B, chunk, E * N] temporaries stay in cache
    while the number of small operations stays low. For the backward each chunk keeps exp(dt A)
    and its states (O(B T E N) memory); with ``recompute`` it keeps only its inputs and the
    state entering it, O(B T (E + E N / chunk)), and recomputes the rest (activation
    checkpointing). Forward and gradient are exact; ``chunk`` and ``recompute`` change only
    speed and memory.
    """
    if chunk < 0:
        raise ValueError(f"chunk must be positive (0 = auto), got {chunk}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, dt, A, Bm, Cm = (t.to(dtype) for t in (x, dt, A, Bm, Cm))
    b, length, e = x.shape
    n = A.shape[1]
    if chunk == 0:
        chunk = max(1, AUTO_CHUNK_ELEMENTS // max(1, b * e * n))
    h = None if h0 is None else h0.to(dtype).reshape(b, e * n)
    if length == 0:
        return x.new_zeros(b, 0, e), (x.new_zeros(b, e, n) if h is None else h.view(b, e, n))
    checkpointing = recompute and torch.is_grad_enabled()
    ys = []
    # the scan runs in float32/float64 whatever autocast is active around the model
    with torch.autocast(device_type=x.device.type, enabled=False):
        # split (not slicing in a loop): its backward is one concatenation, where per-chunk
        # slices would each scatter into a zero-filled full-length gradient
        pieces = zip(*(t.split(chunk, dim=1) for t in (dt * x, dt, Bm, Cm)))
        for dtx_c, dt_c, B_c, C_c in pieces:
            if checkpointing:
                y, h = torch.utils.checkpoint.checkpoint(_scan_chunk, dtx_c, dt_c, A, B_c, C_c, h,
                                                         use_reentrant=False)
            else:
                y, h = _scan_chunk(dtx_c, dt_c, A, B_c, C_c, h)
            ys.append(y)
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)
    return y, h.view(b, e, n)


def selective_scan_reference(x, dt, A, Bm, Cm, h0=None):
    """The selective scan written as a plain loop over time (the reference of the tests)."""
    b, length, e = x.shape
    h = x.new_zeros(b, e, A.shape[1]) if h0 is None else h0
    ys = []
    for t in range(length):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h


