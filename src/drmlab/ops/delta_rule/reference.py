r"""The reference of the gated delta rule (``docs/drm.md`` section V.2): a plain loop over time.

For each batch row, with a state matrix S of shape [d_k, d_v] (S_{-1} = init, zeros when None),

    o_t = S_{t-1}^T q_t                                          (the read: before the write at t)
    S_t = f_t S_{t-1} + g_t k_t (v_t - S_{t-1}^T k_t)^T
        = (f_t I - g_t k_t k_t^T) S_{t-1} + g_t k_t v_t^T,

with f_t the retention (decay) and g_t the write strength, both scalars per position.  Each step
is evaluated as written, in the inputs' dtype (the tests give it float64), with autograd through
every step; it is what the fast path of :func:`drmlab.ops.delta_rule` is held to, forward and
backward.
"""

from __future__ import annotations

import torch

__all__ = ["delta_rule_reference"]


def delta_rule_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor | None,
    write: torch.Tensor,
    init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(reads o [B, T, d_v], final state S [B, d_k, d_v]) of the recurrence above, one position
    at a time: q, k [B, T, d_k], v [B, T, d_v], decay (None: 1 everywhere), write [B, T], init
    [B, d_k, d_v] or None."""
    batch, _, d_k = k.shape
    d_v = v.shape[-1]
    state = init if init is not None else v.new_zeros(batch, d_k, d_v)
    if decay is None:  # retention 1 everywhere
        decay = torch.ones_like(write)
    reads = []
    # unbind: one view per position, so the backward stays O(T) (indexing would be O(T^2))
    for q_t, k_t, v_t, f_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), decay.unbind(1), write.unbind(1)):
        reads.append(torch.einsum("bkv,bk->bv", state, q_t))
        recalled = torch.einsum("bkv,bk->bv", state, k_t)
        state = f_t[:, None, None] * state + g_t[:, None, None] * k_t[:, :, None] * (v_t - recalled)[:, None, :]
    out = torch.stack(reads, dim=1) if reads else v.new_zeros(batch, 0, d_v)
    return out, state
