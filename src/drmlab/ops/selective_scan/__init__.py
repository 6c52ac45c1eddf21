r"""The selective scan of Mamba (Gu & Dao, 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", section 3 and Algorithm 2):

    h_t = exp(dt_t A) * h_{t-1} + (dt_t x_t) B_t,    y_t = C_t . h_t

per channel e (x, dt: [B, T, E]) and state index n (A: [E, N]; B_t, C_t: [B, T, N]).

This package: :func:`selective_scan` (the dispatcher), :data:`BACKENDS` (backend name ->
implementation, in the order ``"auto"`` tries them), :func:`selective_scan_backend`, and
:func:`selective_scan_reference` (:mod:`.reference`, the plain loop over time the tests hold
every backend to).  Backends:

* ``"c"`` (:mod:`.c`, kernel ``selective_scan.c``; CPU, float32 / float64): fused, never stores
  the [B, T, E, N] states; built on first use by :mod:`drmlab.ops.ckernels`.
* ``"torch"`` (:mod:`.chunked`; every device): time in chunks, each one
  :func:`drmlab.ops.linear_scan` over the flattened (E, N) channels.
* ``"triton"`` (:mod:`.triton`): the fused scan as Triton kernels (states in registers, one
  saved state per segment, the backward recomputing each segment as the C kernel does); the
  default on CUDA when ``triton`` imports, on CPU tensors only by name under
  ``TRITON_INTERPRET=1`` (how the tests prove it exact).  Never run on a GPU in this
  repository's tests; it runs inside ``drmlab::selective_scan`` too.

All are exact recurrences: no division by cumulative gate products, no logarithm of a gate.
The C kernel runs inside the custom operator ``drmlab::selective_scan`` (:mod:`.op`, with its
gradient and a fake implementation); the torch path is torch operations around the
``drmlab::linear_scan`` operator.  Either way ``torch.compile(model, fullgraph=True)`` traces a
model through the scan without a graph break.
"""

from __future__ import annotations

import torch

from ..backends import Backend, BackendTable
from . import c, chunked
from . import triton as triton_scan
from .chunked import AUTO_CHUNK_ELEMENTS
from .op import choose_backend
from .reference import selective_scan_reference

__all__ = ["selective_scan", "selective_scan_reference", "selective_scan_backend", "BACKENDS", "AUTO_CHUNK_ELEMENTS"]

BACKENDS = BackendTable(
    "selective_scan",
    [
        Backend("c", c, c.unavailable, self_check=True),
        Backend("triton", triton_scan, triton_scan.unavailable, auto_devices=triton_scan.AUTO_DEVICES, self_check=True),
        Backend("torch", chunked, chunked.unavailable),
    ],
)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def selective_scan_backend(x: torch.Tensor) -> str:
    """The backend :func:`selective_scan` takes for inputs like ``x`` under ``"auto"``."""
    return BACKENDS.choose(None, x.device, _compute_dtype(x)).name


def selective_scan(x, dt, A, Bm, Cm, h0=None, *, chunk: int = 0, recompute: bool = False, backend: str = "auto"):
    """The selective scan y_t = C_t . h_t, h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t.

    x, dt: [B, T, E]; A: [E, N]; Bm, Cm: [B, T, N]; h0: [B, E, N] or None (zeros).
    Returns (y [B, T, E], h_{T-1} [B, E, N]) in float32 or float64 (the promoted input dtype; the
    scan runs outside any autocast). ``backend``: ``"auto"`` (the first of :data:`BACKENDS` that
    runs here: the C kernel on CPU when it is built, else torch) or a backend name (one that
    cannot run here raises :class:`drmlab.ops.backends.BackendUnavailable`); ``chunk`` and
    ``recompute`` tune the torch path.
    """
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
    impl = BACKENDS.backends[choose_backend(backend, x.device, _compute_dtype(x))].impl
    if length == 0 or b == 0:  # nothing to scan: the torch path returns the empty y and h0
        impl = chunked
    return impl.scan(x, dt, A, Bm, Cm, h0, chunk=chunk, recompute=recompute)
