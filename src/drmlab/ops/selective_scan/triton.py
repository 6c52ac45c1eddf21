r"""The Triton backend ("triton") of :func:`drmlab.ops.selective_scan`: Mamba's selective scan
(Gu & Dao, 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", section 3
and Algorithm 2) fused into two Triton kernels that never store the [B, T, E, N] states,

    h_t[e, n] = exp(dt_t[e] A[e, n]) h_{t-1}[e, n] + (dt_t[e] x_t[e]) B_t[n],
    y_t[e]    = sum_n C_t[n] h_t[e, n],

the same map, outputs and gradients as the C kernel (``selective_scan.c``, whose comment holds
the adjoint recurrence this module mirrors):

    g_t = dh_t + dy_t C_t + exp(dt_{t+1} A) g_{t+1}          (g_{T-1} starts from dh_last)
    dC_t[n] = sum_e dy_t[e] h_t[e, n]     dB_t[n] = sum_e g_t[e, n] dt_t[e] x_t[e]
    d(dt x)_t[e] = sum_n g_t[e, n] B_t[n]     w = g_t h_{t-1} exp(dt_t A)
    dA[e, n] += w dt_t[e]     d dt_t[e] = sum_n w A[e, n] + d(dt x)_t[e] x_t[e]
    dx_t[e] = d(dt x)_t[e] dt_t[e]     dh0 = exp(dt_0 A) g_0.

**Layout of the work.**  One program per (sequence b, block of :data:`BLOCK_E` channels) walks
time with the [BLOCK_E, N] state in registers (N padded to a power of two, the padding masked).
The forward writes y, the last state and -- when a gradient is wanted -- the state entering
every segment of K steps (K = :func:`segment_length`, about sqrt(T)).  The backward walks the
segments from the last: it recomputes the segment's K states from its saved entering state into
a per-sequence workspace [K + 1, E, N] (each program writes and reads back only its own
channels, a ``debug_barrier`` between), then runs the adjoint recurrence back through the
segment with g in registers.  dB and dC sum over all channels, so each channel block writes its
partial sum and the host adds the blocks; dA sums over the batch, so each sequence writes its
own and the host adds them (a fixed order: deterministic, no atomics).  Memory beyond inputs and
outputs: B E N (T / K + K + 1) elements, O(B E N sqrt(T)).

**Dtypes.**  The kernels compute in float64 for float64 inputs, else float32 (bfloat16 /
float16 inputs are loaded as they are and accumulated in float32 when :func:`forward` is called
with them; :func:`scan`, the dispatcher's entry, first casts to float32 as the C backend does,
because the custom operator promises outputs of the inputs' dtype).  ``tl.exp`` is Triton's
exponential: compiled for sm_90, its float32 form is the hardware approximation ``ex2.approx``
after a multiplication by log2(e) (read from the PTX; its error on a GPU is unmeasured here --
the C kernel's float32 exp is within 1.35 ulp) and its float64 form an inlined polynomial.

**Where it runs, and what has been run.**  As the Triton linear scan
(:mod:`drmlab.ops.linear_scan.triton`, whose helpers this module shares): on CUDA tensors when
``triton`` imports, where ``"auto"`` takes it, and on CPU tensors by name only under
``TRITON_INTERPRET=1``.  Nothing of this module has run on a GPU: ``tests/ops/test_ops_triton.py``
runs both kernels under the interpreter on small CPU tensors against the float64 reference loop
(forward and backward, several segments, odd T, E not a multiple of the block, N padded, h0)
and compiles them to PTX and cubins for sm_90 / sm_80 without a GPU.  Compiled-GPU behaviour --
results, register use of the [BLOCK_E, N] tiles, the workspace's write-then-read inside one
program, speed, the choice of :data:`BLOCK_E` -- is unverified.
"""

from __future__ import annotations

import math

import torch

from ..linear_scan.triton import AUTO_DEVICES, FP_FUSION, jit_kernels, triton_unavailable
from .op import fused_scan

__all__ = [
    "scan",
    "forward",
    "backward",
    "saved_shape",
    "segment_length",
    "unavailable",
    "AUTO_DEVICES",
    "BLOCK_E",
    "SEGMENT_STEPS",
    "TILE_ELEMENTS",
]

# channels per program at most (a power of two) ...
BLOCK_E = 64
# ... and at most this many state elements (BLOCK_E x padded N) per program
TILE_ELEMENTS = 2048
# steps per recompute segment; 0 picks about sqrt(T) (checkpoints and workspace balanced)
SEGMENT_STEPS = 0

# ``triton.language``, bound by jit_kernels on first use (importing this module imports no triton)
tl = None
_KERNELS: dict = {}


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton selective scan cannot run on ``device`` / compute ``dtype``; None when it can."""
    if dtype not in (torch.float32, torch.float64):
        return "the Triton selective scan computes in float32 or float64 only"
    return triton_unavailable(device)


def segment_length(length: int) -> int:
    """Steps per recompute segment for a sequence of ``length`` steps."""
    k = SEGMENT_STEPS if SEGMENT_STEPS > 0 else math.isqrt(max(length - 1, 0)) + 1
    return max(1, min(k, max(length, 1)))


def saved_shape(b: int, length: int, e: int, n: int) -> tuple[int, int, int, int]:
    """What :func:`forward` keeps for the backward: the state entering every segment,
    [B, segments, E, N]."""
    return (b, -(-length // segment_length(length)), e, n)


# --------------------------------------------------------------------------- the kernels
# Plain functions here, built by jit_kernels on first use.  All tensors are dense: x, dt, y
# [B, T, E]; A [E, N]; Bm, Cm [B, T, N]; states [B, ., E, N].  Offsets are formed from the
# 64-bit sequence index first, so no product overflows 32 bits.


def _forward_kernel(
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    h0_ptr,
    y_ptr,
    hlast_ptr,
    ck_ptr,
    T,
    E,
    N,
    K,
    NSEG,
    HAS_H0: tl.constexpr,
    SAVE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """y and the last state for one sequence and BLOCK_E channels; with SAVE, the state entering
    each segment of K steps into ck [B, NSEG, E, N]."""
    b = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    n = tl.arange(0, BLOCK_N)
    mask_e = e < E
    mask_n = n < N
    mask = mask_e[:, None] & mask_n[None, :]
    en = e[:, None] * N + n[None, :]
    A = tl.load(A_ptr + en, mask=mask, other=0.0).to(ACC)
    h = tl.zeros([BLOCK_E, BLOCK_N], dtype=ACC)
    if HAS_H0:
        h = tl.load(h0_ptr + b * E * N + en, mask=mask, other=0.0).to(ACC)
    x_ptrs = x_ptr + b * T * E + e
    dt_ptrs = dt_ptr + b * T * E + e
    y_ptrs = y_ptr + b * T * E + e
    b_ptrs = B_ptr + b * T * N + n
    c_ptrs = C_ptr + b * T * N + n
    ck_ptrs = ck_ptr + b * NSEG * E * N + en
    for s in range(NSEG):
        if SAVE:
            tl.store(ck_ptrs, h.to(ck_ptr.dtype.element_ty), mask=mask)
            ck_ptrs += E * N
        for _ in range(tl.minimum(K, T - s * K)):
            dt = tl.load(dt_ptrs, mask=mask_e, other=0.0).to(ACC)
            x = tl.load(x_ptrs, mask=mask_e, other=0.0).to(ACC)
            Bt = tl.load(b_ptrs, mask=mask_n, other=0.0).to(ACC)
            Ct = tl.load(c_ptrs, mask=mask_n, other=0.0).to(ACC)
            h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * Bt[None, :]
            y = tl.sum(h * Ct[None, :], axis=1)
            tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask_e)
            x_ptrs += E
            dt_ptrs += E
            y_ptrs += E
            b_ptrs += N
            c_ptrs += N
    tl.store(hlast_ptr + b * E * N + en, h.to(hlast_ptr.dtype.element_ty), mask=mask)


def _backward_kernel(
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    ck_ptr,
    dy_ptr,
    dhlast_ptr,
    dx_ptr,
    ddt_ptr,
    dA_ptr,
    dB_ptr,
    dC_ptr,
    dh0_ptr,
    ws_ptr,
    T,
    E,
    N,
    K,
    NSEG,
    NBLK,
    HAS_DHLAST: tl.constexpr,
    HAS_H0: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The adjoint recurrence for one sequence and BLOCK_E channels, segment by segment from
    the last.  Writes dx, ddt [B, T, E]; the block's partial dB, dC [B, T, NBLK, N]; the
    sequence's dA [B, E, N]; dh0 [B, E, N] when HAS_H0.  ws [B, K + 1, E, N] is the workspace
    (slot 0: the state entering the segment; slot j + 1: the state after its step j)."""
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    e = blk * BLOCK_E + tl.arange(0, BLOCK_E)
    n = tl.arange(0, BLOCK_N)
    mask_e = e < E
    mask_n = n < N
    mask = mask_e[:, None] & mask_n[None, :]
    en = e[:, None] * N + n[None, :]
    A = tl.load(A_ptr + en, mask=mask, other=0.0).to(ACC)
    g = tl.zeros([BLOCK_E, BLOCK_N], dtype=ACC)
    if HAS_DHLAST:
        g = tl.load(dhlast_ptr + b * E * N + en, mask=mask, other=0.0).to(ACC)
    dA = tl.zeros([BLOCK_E, BLOCK_N], dtype=ACC)
    ws = ws_ptr + b * (K + 1) * E * N + en
    for i in range(NSEG):
        s = NSEG - 1 - i
        t0 = s * K
        steps = tl.minimum(K, T - t0)
        # recompute the segment's states from the one that entered it
        h = tl.load(ck_ptr + (b * NSEG + s) * E * N + en, mask=mask, other=0.0).to(ACC)
        tl.store(ws, h.to(ws_ptr.dtype.element_ty), mask=mask)
        for j in range(steps):
            t = t0 + j
            dt = tl.load(dt_ptr + (b * T + t) * E + e, mask=mask_e, other=0.0).to(ACC)
            x = tl.load(x_ptr + (b * T + t) * E + e, mask=mask_e, other=0.0).to(ACC)
            Bt = tl.load(B_ptr + (b * T + t) * N + n, mask=mask_n, other=0.0).to(ACC)
            h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * Bt[None, :]
            tl.store(ws + (j + 1) * E * N, h.to(ws_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()  # the workspace is read back below
        # the adjoint recurrence, backwards through the segment
        for i2 in range(steps):
            j = steps - 1 - i2
            t = t0 + j
            dt = tl.load(dt_ptr + (b * T + t) * E + e, mask=mask_e, other=0.0).to(ACC)
            x = tl.load(x_ptr + (b * T + t) * E + e, mask=mask_e, other=0.0).to(ACC)
            dy = tl.load(dy_ptr + (b * T + t) * E + e, mask=mask_e, other=0.0).to(ACC)
            Bt = tl.load(B_ptr + (b * T + t) * N + n, mask=mask_n, other=0.0).to(ACC)
            Ct = tl.load(C_ptr + (b * T + t) * N + n, mask=mask_n, other=0.0).to(ACC)
            h_t = tl.load(ws + (j + 1) * E * N, mask=mask, other=0.0).to(ACC)
            h_prev = tl.load(ws + j * E * N, mask=mask, other=0.0).to(ACC)
            decay = tl.exp(dt[:, None] * A)
            gv = g + dy[:, None] * Ct[None, :]  # g_t
            part = ((b * T + t) * NBLK + blk) * N + n
            tl.store(dC_ptr + part, tl.sum(dy[:, None] * h_t, axis=0).to(dC_ptr.dtype.element_ty), mask=mask_n)
            tl.store(dB_ptr + part, tl.sum(gv * (dt * x)[:, None], axis=0).to(dB_ptr.dtype.element_ty), mask=mask_n)
            d_dtx = tl.sum(gv * Bt[None, :], axis=1)  # d(dt x)_t
            w = gv * h_prev * decay
            dA += w * dt[:, None]
            ddt = tl.sum(w * A, axis=1) + d_dtx * x
            tl.store(ddt_ptr + (b * T + t) * E + e, ddt.to(ddt_ptr.dtype.element_ty), mask=mask_e)
            tl.store(dx_ptr + (b * T + t) * E + e, (d_dtx * dt).to(dx_ptr.dtype.element_ty), mask=mask_e)
            g = gv * decay  # carried to t - 1
        tl.debug_barrier()  # before the next segment overwrites the workspace
    tl.store(dA_ptr + b * E * N + en, dA.to(dA_ptr.dtype.element_ty), mask=mask)
    if HAS_H0:
        tl.store(dh0_ptr + b * E * N + en, g.to(dh0_ptr.dtype.element_ty), mask=mask)


def _kernels() -> dict:
    if not _KERNELS:
        _KERNELS.update(jit_kernels(globals(), ["_forward_kernel", "_backward_kernel"]))
    return _KERNELS


# --------------------------------------------------------------------------- host side


def _blocks(e: int, n: int) -> tuple[int, int]:
    """(BLOCK_E, BLOCK_N): N padded to a power of two, E cut into power-of-two blocks."""
    block_n = 1 << max(0, (n - 1).bit_length())
    block_e = min(BLOCK_E, 1 << max(0, (e - 1).bit_length()), max(1, TILE_ELEMENTS // block_n))
    return block_e, block_n


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def forward(x, dt, A, Bm, Cm, h0, need_grad: bool):
    """(y [B, T, E], h_{T-1} [B, E, N], the segment states of :func:`saved_shape` when
    ``need_grad``, else an empty tensor) from contiguous x, dt [B, T, E], A [E, N], Bm, Cm
    [B, T, N], h0 [B, E, N] or None (T > 0); outputs in float64 for float64 x, else float32."""
    kernels = _kernels()
    b, length, e = x.shape
    n = A.shape[1]
    dtype = _compute(x.dtype)
    k = segment_length(length)
    nseg = -(-length // k)
    y = torch.empty((b, length, e), dtype=dtype, device=x.device)
    h_last = torch.empty((b, e, n), dtype=dtype, device=x.device)
    ck = (
        torch.empty(saved_shape(b, length, e, n), dtype=dtype, device=x.device)
        if need_grad
        else torch.empty(0, dtype=dtype, device=x.device)
    )
    block_e, block_n = _blocks(e, n)
    if e == 0:  # no channels: nothing to launch
        return y, h_last, ck
    kernels["_forward_kernel"][(b, -(-e // block_e))](
        x,
        dt,
        A,
        Bm,
        Cm,
        h0 if h0 is not None else h_last,
        y,
        h_last,
        ck if need_grad else y,
        length,
        e,
        n,
        k,
        nseg,
        HAS_H0=h0 is not None,
        SAVE=need_grad,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32,
        BLOCK_E=block_e,
        BLOCK_N=block_n,
        enable_fp_fusion=FP_FUSION,
    )
    return y, h_last, ck


def backward(x, dt, A, Bm, Cm, h0, saved, dy, dh_last):
    """(dx, ddt, dA, dB, dC, dh0) from the inputs of :func:`forward`, its segment states
    ``saved`` and the output gradients (dy [B, T, E]; dh_last [B, E, N] or None); dh0 is an
    empty tensor when h0 is None."""
    kernels = _kernels()
    b, length, e = x.shape
    n = A.shape[1]
    dtype = _compute(x.dtype)
    k = segment_length(length)
    nseg = -(-length // k)
    if saved.shape != saved_shape(b, length, e, n):
        raise RuntimeError(
            f"selective_scan Triton backward: segment states {tuple(saved.shape)}, "
            f"expected {saved_shape(b, length, e, n)} (SEGMENT_STEPS changed between "
            "forward and backward?)"
        )
    block_e, block_n = _blocks(e, n)
    nblk = -(-e // block_e)
    new = {"dtype": dtype, "device": x.device}
    dx, ddt = torch.empty((b, length, e), **new), torch.empty((b, length, e), **new)
    dB_parts, dC_parts = torch.empty((b, length, nblk, n), **new), torch.empty((b, length, nblk, n), **new)
    dA_parts = torch.empty((b, e, n), **new)
    dh0 = torch.empty((b, e, n), **new) if h0 is not None else torch.empty(0, **new)
    work = torch.empty((b, k + 1, e, n), **new)
    dy = dy.contiguous()
    dh_last = None if dh_last is None else dh_last.contiguous()
    if e == 0:  # no channels: B and C receive no gradient
        return dx, ddt, dA_parts.sum(0), dB_parts.sum(2), dC_parts.sum(2), dh0
    kernels["_backward_kernel"][(b, nblk)](
        x,
        dt,
        A,
        Bm,
        Cm,
        saved,
        dy,
        dh_last if dh_last is not None else dy,
        dx,
        ddt,
        dA_parts,
        dB_parts,
        dC_parts,
        dh0 if h0 is not None else dx,
        work,
        length,
        e,
        n,
        k,
        nseg,
        nblk,
        HAS_DHLAST=dh_last is not None,
        HAS_H0=h0 is not None,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32,
        BLOCK_E=block_e,
        BLOCK_N=block_n,
        enable_fp_fusion=FP_FUSION,
    )
    return dx, ddt, dA_parts.sum(0), dB_parts.sum(2), dC_parts.sum(2), dh0


def scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False):
    """(y [B, T, E], h_{T-1} [B, E, N]) from checked inputs with B, T > 0 (the layout of
    :func:`drmlab.ops.selective_scan`), through the custom operator ``drmlab::selective_scan``
    (its gradient and fake implementation: :mod:`.op`).  ``chunk`` and ``recompute`` tune the
    chunked torch path only: these kernels pick their own segment length and always recompute."""
    return fused_scan(x, dt, A, Bm, Cm, h0, "triton")
