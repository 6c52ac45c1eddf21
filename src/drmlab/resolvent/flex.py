r"""The phase-free gated head through ``torch.nn.attention.flex_attention``
(``docs/resolvent.md`` section 6, the ``flex`` path).

One job: evaluate ``o_i = sum_j softmax_j(x_ij) v_j`` and ``lse_i = logsumexp_j x_ij`` for the
scores of the phase-free resolvent head,

    x_ij = q_i.k_j + L_i - L_j     on live pairs  start_i <= j <= i,   else -inf,

without ever building an ``[S, S]`` tensor on a GPU. ``L`` is the running sum of log gate
magnitudes and ``start_i`` the last closed gate at or before ``i`` (both from
``drmlab.resolvent.torch._gate_sums``, so a closed gate is treated exactly as the ``dense`` and
``flash`` paths treat it: a segment boundary, never a ``log 0``). The log-gate difference is the
``score_mod``; causality and the segments are the ``mask_mod``; the block-sparse ``BlockMask`` is
built directly from ``start`` (per query block, the live key blocks form one contiguous range from
the block of the smallest segment start up to the diagonal block), so no ``[S, S]`` boolean mask
is evaluated either.

Precision: in float32 ``L`` is split into ``L_hi = fl32(L)`` and ``L_lo = fl32(L - L_hi)``, and the
score adds ``(L_hi_i - L_hi_j) + (L_lo_i - L_lo_j)``: the bias is then the float64 difference
rounded to about one float32 ulp, as in the ``dense`` path, however large ``|L|`` grows along a
decaying sequence. The gradient reaches ``L`` through ``L_lo`` (``L_hi`` is a detached copy).
Unlike the ``flash`` path no weight floor of ``e^-60`` is applied (flex computes every live
weight).

Where it runs:

* CUDA: ``flex_attention`` compiled (``torch.compile``; inside an outer compiled graph it is called
  directly), forward and backward, gradients to ``q``, ``k``, ``v`` and ``L`` (flex supports
  gradients of captured ``score_mod`` buffers and of ``lse``). **None of this was run on a GPU
  when it was written**: the CUDA path is untested code; the first GPU session must run
  ``tests/test_resolvent_torch.py`` (its CUDA tests) and ``benchmarks/bench_resolvent.py``.
* CPU: eager ``flex_attention`` forward only (torch 2.13 has no CPU backward: inputs that require
  grad raise ``ValueError``). The eager CPU forward is torch's reference ("math") implementation,
  which materialises the scores: on a CPU this path is a correctness check, not an O(S) kernel.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

__all__ = ["flex_available", "gated_flex_attention", "segment_block_mask"]


def flex_available() -> bool:
    """True when this torch has ``torch.nn.attention.flex_attention`` (torch >= 2.5)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def segment_block_mask(start: torch.Tensor, block_size: int):
    """The ``BlockMask`` of live pairs ``start_i <= j <= i`` for ``start`` of shape ``[B, H, S]``.

    Per query block ``qb`` (rows ``[qb bs, (qb + 1) bs)``) the key blocks from
    ``min(start) // bs`` to ``qb`` all hold a live pair (the row with the smallest start sees every
    key from its start to its own position), and no other block does, so ``kv_num_blocks`` and
    ``kv_indices`` follow from a block minimum of ``start``; every listed block is partial (the
    ``mask_mod`` masks inside it). Tensor operations only, so it traces under ``torch.compile``.
    """
    from torch.nn.attention.flex_attention import BlockMask

    B, H, S = start.shape
    nq = (S + block_size - 1) // block_size
    pad = nq * block_size - S
    st = start
    if pad:
        st = torch.cat([st, st[..., -1:].expand(B, H, pad)], dim=-1)
    first = st.reshape(B, H, nq, block_size).amin(dim=-1) // block_size  # first live key block
    qb = torch.arange(nq, device=start.device)
    kv_num_blocks = (qb - first + 1).to(torch.int32)
    kb = torch.arange(nq, device=start.device)
    kv_indices = (first[..., None] + kb).clamp(max=nq - 1).to(torch.int32)

    def live(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= start[b, h, q_idx])

    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=block_size,
                                    mask_mod=live, seq_lengths=(S, S))


_COMPILED: dict = {}


def _flex_call(device_type: str):
    """``flex_attention``, compiled once per process on a GPU (eager flex on CUDA would
    materialise the scores); called directly inside an outer compiled graph and on a CPU."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    if "cuda" not in _COMPILED:
        _COMPILED["cuda"] = torch.compile(flex_attention)
    return _COMPILED["cuda"]


def gated_flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    L: torch.Tensor,
    start: torch.Tensor,
    block_size: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` for scores ``q_i.k_j + L_i - L_j`` on live pairs ``start_i <= j <= i``.

    Args:
        q, k: ``[B, H, S, d]`` (the content scale, e.g. ``qk / sqrt(d)``, already folded into q).
        v: ``[B, H, S, e]``.
        L: ``[B, H, S]`` float64 running log-gate sums (may require grad).
        start: ``[B, H, S]`` integer segment starts.
        block_size: sparsity block of the ``BlockMask`` (query and key positions).

    Returns ``o [B, H, S, e]`` and the natural-log ``lse [B, H, S]`` in q's dtype.
    """
    from torch.nn.attention.flex_attention import AuxRequest

    B, H, S, _ = q.shape
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, L)
    ):
        raise ValueError("path='flex' has no backward on the CPU in this torch (flex_attention "
                         "refuses it); use path='flash', or run under torch.no_grad()")
    dt = q.dtype
    L = L.expand(B, H, S).contiguous()
    start = start.expand(B, H, S).contiguous()
    if dt == torch.float64:
        L_hi: Optional[torch.Tensor] = None
        L_lo = L
    else:
        L_hi = L.detach().to(dt)
        L_lo = (L - L_hi.to(L.dtype)).to(dt)

    if L_hi is None:
        def gate_bias(score, b, h, q_idx, kv_idx):
            return score + (L_lo[b, h, q_idx] - L_lo[b, h, kv_idx])
    else:
        def gate_bias(score, b, h, q_idx, kv_idx):
            hi = L_hi[b, h, q_idx] - L_hi[b, h, kv_idx]
            lo = L_lo[b, h, q_idx] - L_lo[b, h, kv_idx]
            return score + (hi + lo)

    mask = segment_block_mask(start, block_size)
    flex = _flex_call(q.device.type)
    with warnings.catch_warnings():
        # eager flex on a CPU warns that it is unfused; that is this path's documented CPU role
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        o, aux = flex(q, k, v, score_mod=gate_bias, block_mask=mask, scale=1.0,
                      return_aux=AuxRequest(lse=True))
    return o, aux.lse.to(dt)
