r"""First-order linear scan: the selective-memory recurrence of ``docs/drm.md`` section 9,

    m_t = f_t \odot m_{t-1} + u_t,        t = 0 .. T-1,   m_{-1} = init (zeros when None),

along dim 1 of ``[B, T, D]`` tensors, real or complex.  It is the one scan shared by the DRM
memory, the SSM control, the selective-SSM mixer, Mamba's chunked selective scan and the
resolvent path-product corner.

Exactness: every backend composes the affine maps ``(f_2, u_2) o (f_1, u_1) = (f_2 f_1,
u_2 + f_2 u_1)`` -- one after the other, or pairwise (``"torch"``) -- forward and in its
reverse-scan backward.  Nothing is divided by a cumulative product of gates and no logarithm
of a gate is taken, so a zero gate cuts the past exactly and long sequences cannot overflow
(the pairwise products can, only for gates with |f| > 1: see :mod:`.log_depth`).
Every backend runs inside one custom operator, ``drmlab::linear_scan`` (:mod:`.op`, with its
gradient and a fake implementation), which autograd and ``torch.compile`` see: a compiled model
traces through the scan without a graph break.

This package: :func:`linear_scan` (the dispatcher), :data:`BACKENDS` (backend name ->
implementation, in the order ``"auto"`` tries them), :func:`backend_for`, and
:func:`linear_scan_reference` (:mod:`.reference`, the plain loop the tests hold every backend
to).  Backends:

* ``"c"`` (:mod:`.c`, kernel ``scan.c``): contiguous CPU buffers of float32, float64, complex64
  and complex128, split over ``torch.get_num_threads()`` threads; built on first use by
  :mod:`drmlab.ops.ckernels` (``DRMLAB_NO_CKERNEL=1`` switches it off,
  ``DRMLAB_REQUIRE_CKERNEL=1`` makes a failed build an error).
* ``"torch"`` (:mod:`.log_depth`): a log-depth scan from torch operations on any device --
  O(log T) dispatched operations and O(T) work, composing the affine steps pairwise (exact in
  the same sense: no division, no logarithm).
* ``"triton"`` (:mod:`.triton`): Triton kernels, one program per (batch row, channel block)
  walking time in registers; the default on CUDA when ``triton`` imports (``drmlab[gpu]``), on
  CPU tensors only by name under ``TRITON_INTERPRET=1`` (how the tests prove it exact).  Never
  run on a GPU in this repository's tests.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..backends import Backend, BackendTable
from . import c, log_depth
from . import triton as triton_scan
from .op import EagerLinearScan, choose_backend, linear_scan_op
from .reference import linear_scan_reference

__all__ = ["linear_scan", "backend_for", "linear_scan_reference", "BACKENDS"]

BACKENDS = BackendTable(
    "linear_scan",
    [
        Backend("c", c, c.unavailable, self_check=True),
        Backend("triton", triton_scan, triton_scan.unavailable, auto_devices=triton_scan.AUTO_DEVICES, self_check=True),
        Backend("torch", log_depth, log_depth.unavailable),
    ],
)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the scan runs in: complex64/128 for complex, float64 for float64, else float32
    (float16 and bfloat16 are computed in float32; integers in the default float dtype)."""
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return torch.float64 if dtype == torch.float64 else torch.float32


def backend_for(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """The backend ``linear_scan`` uses for inputs like ``tensor`` (of ``dtype`` when given)."""
    compute = _compute_dtype(dtype if dtype is not None else tensor.dtype)
    return BACKENDS.choose(None, tensor.device, compute).name


def linear_scan(
    f: torch.Tensor,
    u: torch.Tensor,
    init: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    r"""m_t = f_t * m_{t-1} + u_t along dim 1 (time) of ``[B, T, D]`` tensors.

    Args:
        f: gates, ``[B, T, D]`` or broadcastable to u's shape (e.g. ``[B, T, 1]``).
        u: inputs, ``[B, T, D]`` (f and u are broadcast against each other).
        init: state before t = 0, ``[B, D]`` (or broadcastable to it); None means zeros.
        backend: None / ``"auto"`` (the first of :data:`BACKENDS` that runs on these inputs:
            the C kernel on CPU when it is built, else torch) or a backend name; a named backend
            that cannot run here raises :class:`drmlab.ops.backends.BackendUnavailable` (a
            RuntimeError naming the backends that can).

    Real (float32, float64; float16 / bfloat16 computed in float32) or complex (complex64,
    complex128) inputs; mixed dtypes are promoted and the result has the promoted dtype.
    Differentiable in f, u and init; the gradient of a real f with complex u is real.
    Returns the states m, ``[B, T, D]``.
    """
    try:
        shape = torch.broadcast_shapes(f.shape, u.shape)
    except RuntimeError as exc:
        raise ValueError(f"f {tuple(f.shape)} and u {tuple(u.shape)} do not broadcast") from exc
    if len(shape) != 3:
        raise ValueError(f"f {tuple(f.shape)} and u {tuple(u.shape)} do not broadcast to a [B, T, D] shape")
    B, T, D = shape
    out_dtype = torch.promote_types(f.dtype, u.dtype)
    if init is not None:
        out_dtype = torch.promote_types(out_dtype, init.dtype)
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        out_dtype = torch.get_default_dtype()
    compute = _compute_dtype(out_dtype)
    if f.device != u.device or (init is not None and init.device != u.device):
        raise ValueError("linear_scan: f, u and init must be on one device")

    name = choose_backend(backend, u.device, compute)
    impl = BACKENDS.backends[name].impl
    fc = f.to(compute).expand(shape)
    uc = u.to(compute).expand(shape)
    ic = None if init is None else init.to(compute).expand(B, D)
    if impl.DENSE_INPUTS:
        fc, uc = fc.contiguous(), uc.contiguous()
        ic = None if ic is None else ic.contiguous()
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:  # traced, fake or counted
        out = linear_scan_op(fc, uc, ic, name)
    else:
        out = EagerLinearScan.apply(fc, uc, ic, name)
    return out if out.dtype == out_dtype else out.to(out_dtype)
