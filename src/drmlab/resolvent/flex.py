r"""The ``flex`` path of the resolvent operator (``docs/resolvent.md`` section 6.2): the phase-free
gated head through ``torch.nn.attention.flex_attention``, the log-gate bias ``L_i - L_j`` as its
``score_mod`` and a block-sparse mask built from the segment starts, so no ``[S, S]`` tensor is
built on a GPU. **The CUDA path was not run on a GPU when written**; on a CPU only the forward runs.
"""

from __future__ import annotations

import math
import warnings

import torch

from drmlab.resolvent.common import blend_gates, expand_heads, fixed_at, gate_sums, rescale_by_lse

__all__ = ["flex_available", "flex_resolvent", "gated_flex_attention", "segment_block_mask"]


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

    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=block_size, mask_mod=live, seq_lengths=(S, S))


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
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, L)):
        raise ValueError(
            "path='flex' has no backward on the CPU in this torch (flex_attention "
            "refuses it); use path='flash', or run under torch.no_grad()"
        )
    dt = q.dtype
    L = L.expand(B, H, S).contiguous()
    start = start.expand(B, H, S).contiguous()
    if dt == torch.float64:
        L_hi: torch.Tensor | None = None
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
        o, aux = flex(q, k, v, score_mod=gate_bias, block_mask=mask, scale=1.0, return_aux=AuxRequest(lse=True))
    return o, aux.lse.to(dt)


def flex_resolvent(q, k, v, magnitude, beta, qk, g, cdt, block_size):
    """``(Re O, None)`` of a phase-free head in ``cdt`` through :func:`gated_flex_attention`: the
    same ``L`` and segment starts as ``dense`` and ``flash``, the same ``Z^(1 - beta)`` rescale."""
    B, H, _, d = q.shape
    m, _ = blend_gates(magnitude.to(cdt), None, g)
    L, start, _ = gate_sums(m, None)
    qs = q.to(cdt) * (qk[..., None, None] / math.sqrt(d))
    o, lse = gated_flex_attention(
        qs, k.to(cdt), v.to(cdt), expand_heads(L, B, H), expand_heads(start, B, H), block_size
    )
    if not fixed_at(beta, 1.0):
        o = rescale_by_lse(o, beta, lse)
    return o, None
