r"""The gated delta rule: the fast-weight memory's recurrence (``docs/drm.md`` section V.2),

    o_t = S_{t-1}^T q_t,
    S_t = f_t S_{t-1} + g_t k_t (v_t - S_{t-1}^T k_t)^T = (f_t I - g_t k_t k_t^T) S_{t-1} + g_t k_t v_t^T,

for a state matrix S [d_k, d_v] per batch row (S_{-1} = init, zeros when None), scalar retention
f_t and write strength g_t per position.  The read at t sees the state *before* the write at t.
The delta rule itself is Widrow and Hoff's (1960) and Schlag, Irie and Schmidhuber's (2021,
"Linear Transformers Are Secretly Fast Weight Programmers"); the separate scalar retention f_t is
the fast-weight memory's (``../shared/notes/upstream-asm.md`` section 3.3).  Retention 1 everywhere
(``decay=None``) is the memory's non-decaying slow matrix C.

This package: :func:`delta_rule` (the dispatcher), :data:`BACKENDS`, and
:func:`delta_rule_reference` (:mod:`.reference`, the plain loop over time the tests hold every
backend to, forward and backward).  Backends:

* ``"torch"`` (:mod:`.chunked`; every device): the WY / UT-transform form, chunks of positions
  with one unit-triangular solve each, decay products formed by multiplication only (no division
  by cumulative products, no logarithm of a gate), differentiated by autograd.

Pure tensor operator: what makes a gate hard (a threshold with a straight-through gradient) is
the model's business, not this operator's.
"""

from __future__ import annotations

import torch

from ..backends import Backend, BackendTable
from . import chunked
from .reference import delta_rule_reference

__all__ = ["delta_rule", "delta_rule_reference", "BACKENDS"]

BACKENDS = BackendTable(
    "delta_rule",
    [
        Backend("torch", chunked, chunked.unavailable),
    ],
)


def _check_shapes(q, k, v, decay, write, init) -> None:
    if k.dim() != 3 or q.shape != k.shape:
        raise ValueError(
            f"delta_rule: q and k must be [B, T, d_k] of one shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    batch, length, d_k = k.shape
    if v.dim() != 3 or v.shape[:2] != (batch, length):
        raise ValueError(f"delta_rule: v must be [B, T, d_v] = [{batch}, {length}, d_v], got {tuple(v.shape)}")
    for name, gate in (("decay", decay), ("write", write)):
        if gate is not None and gate.shape != (batch, length):
            raise ValueError(f"delta_rule: {name} must be [B, T] = [{batch}, {length}], got {tuple(gate.shape)}")
    if init is not None and init.shape != (batch, d_k, v.shape[-1]):
        raise ValueError(
            f"delta_rule: init must be [B, d_k, d_v] = [{batch}, {d_k}, {v.shape[-1]}], got {tuple(init.shape)}"
        )
    tensors = [t for t in (q, k, v, decay, write, init) if t is not None]
    if any(t.device != v.device for t in tensors):
        raise ValueError("delta_rule: every input must be on one device")


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor | None,
    write: torch.Tensor,
    init: torch.Tensor | None = None,
    *,
    chunk: int = chunked.DEFAULT_CHUNK,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Reads and final state of the gated delta rule along dim 1 (time).

    Args:
        q: read queries ``[B, T, d_k]``.
        k: write keys ``[B, T, d_k]`` (the memory normalises them; the operator does not).
        v: values ``[B, T, d_v]``.
        decay: retention f_t ``[B, T]`` (0 forgets everything before t but what the write at t
            reads, 1 keeps it); None: 1 everywhere (no decay; cheaper: no decay products).
        write: write strength g_t ``[B, T]`` (0 writes nothing at t).
        init: the state before t = 0, ``[B, d_k, d_v]``; None means zeros.
        chunk: positions per chunk of the ``"torch"`` backend (a positive integer).
        backend: None / ``"auto"`` or ``"torch"``.

    Computed in float64 for float64 inputs and in float32 for every other floating dtype (bf16 and
    float16 included), with autocast off: the results have that dtype.  Differentiable in every
    input.  Returns ``(o [B, T, d_v], S_{T-1} [B, d_k, d_v])``.
    """
    _check_shapes(q, k, v, decay, write, init)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"delta_rule: chunk must be a positive integer, got {chunk!r}")
    dtype = (
        torch.float64
        if torch.float64 in [t.dtype for t in (q, k, v, decay, write, init) if t is not None]
        else torch.float32
    )
    impl = BACKENDS.choose(backend, v.device, dtype).impl
    batch, length, d_k = k.shape
    with torch.autocast(device_type=v.device.type, enabled=False):
        q, k, v, write = (t.to(dtype) for t in (q, k, v, write))
        decay = None if decay is None else decay.to(dtype)
        init = v.new_zeros(batch, d_k, v.shape[-1]) if init is None else init.to(dtype)
        if length == 0:
            return v.new_zeros(batch, 0, v.shape[-1]), init
        return impl.forward(q, k, v, decay, write, init, chunk)
