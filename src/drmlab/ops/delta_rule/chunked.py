r"""The chunked torch backend of :func:`drmlab.ops.delta_rule` (any device): the gated delta rule
``S_t = f_t S_{t-1} + g_t k_t (v_t - S_{t-1}^T k_t)^T``, ``o_t = S_{t-1}^T q_t`` (``docs/drm.md``
section V.2) over chunks of positions, a few batched matrix products and one triangular solve per
chunk instead of a step per position.

**Method** (the WY / UT-transform form of the delta rule; Yang et al., 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length", with the scalar retention f_t kept
as a separate factor).  Write each step as ``S_t = f_t S_{t-1} + k_t w_t^T`` with the *write
vector* ``w_t = g_t (v_t - S_{t-1}^T k_t)``.  Inside a chunk of C positions starting from S_0,

    S_{t-1} = a_t S_0 + sum_{i<t} D_{t,i} k_i w_i^T,
    a_t = prod_{j<t} f_j,      D_{t,i} = prod_{i<j<t} f_j,

so every write vector depends linearly on the earlier ones:

    w_t + g_t sum_{i<t} D_{t,i} (k_t . k_i) w_i = g_t (v_t - a_t S_0^T k_t),

i.e. ``(I + A) W = diag(g) (V - diag(a) K S_0)`` with ``A = diag(g) (D * K K^T)`` strictly lower
triangular: a unit lower-triangular system, solved at once by ``torch.linalg.solve_triangular``.
Then the reads and the state after the chunk are products of known matrices:

    O = diag(a) Q S_0 + (D * Q K^T) W,
    S_C = (prod_j f_j) S_0 + K^T diag(e) W,    e_i = prod_{j>i} f_j.

The gradient is autograd's through these products and the triangular solve (a hand-written
backward of the whole chunk measured no faster on these CPUs), except for the gap table's.

**Exactness.**  The decay products a, D, e are formed as running products of the gates, never as
ratios of cumulative products (``prod_{j<t} f_j / prod_{j<=i} f_j``) and never through logarithms:
:func:`gap_products` forms a [C + 2, C + 2] table of them by running products forward, and
backward by products of its own entries (its hand-written gradient).  So every decay product
through a zero retention f_t = 0 is exactly 0 (with g_t = 0 too, the past is cut exactly: no
gradient crosses t), a zero write g_t = 0 writes exactly nothing (its row of the system is zero),
and products of many small gates underflow to the exact limit, 0.  The result differs from the
sequential loop only in the order of rounding: tested against the float64 reference loop, forward
and backward (gradcheck included).

Cost per chunk: O(C^2 (d_k + d_v) + C d_k d_v) work in O(1) dispatched operations; the reads need
no [C, d_k, d_v] states.  Chunks follow one another in a Python loop (T / C of them).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["forward", "gap_products", "unavailable", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 64


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Never: plain torch operations run on every device and dtype."""
    return None


class _GapProducts(torch.autograd.Function):
    """X [B, n, n] with X[b, p, r] = prod_{r < j < p} gates[b, j] (r < p; 0 elsewhere) and its exact
    gradient: forward one running product down each column; backward, with
    prod_{r<j'<p, j'!=j} gates_j' = X[j, r] X[p, j] (no division by a gate),

        d gates_j = sum_{p, r} G[p, r] X[j, r] X[p, j] = sum_p X[p, j] (G X^T)[p, j].
    """

    @staticmethod
    def forward(ctx, gates):
        n = gates.shape[1]
        after = torch.ones(n, n, dtype=torch.bool, device=gates.device).tril(-1)  # [j, r]: j > r
        factors = torch.where(after, gates.unsqueeze(-1), torch.ones((), dtype=gates.dtype, device=gates.device))
        running = factors.cumprod(dim=1)  # running[b, j, r] = prod_{r < j' <= j} gates[b, j']
        table = torch.zeros_like(running)
        table[:, 1:] = running[:, :-1]  # X[p, r] = running[p - 1, r] ...
        table.mul_(after)  # ... for p > r only
        ctx.save_for_backward(table)
        return table

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (table,) = ctx.saved_tensors
        return (table * (grad @ table.transpose(-1, -2))).sum(dim=-2)


def gap_products(gates: torch.Tensor) -> torch.Tensor:
    """X [B, n, n] with X[b, p, r] = prod_{r < j < p} gates[b, j] for r < p, and 0 for r >= p.

    The product of the gates strictly between positions r and p (1 for neighbours): a running
    product (``cumprod``, multiplication only) forward, and a backward that never divides by a gate
    (:class:`_GapProducts`), so a zero gate gives exact zeros and exact gradients.
    """
    return _GapProducts.apply(gates)


def _chunk(q, k, v, decay, write, state):
    """One chunk: (reads [B, C, d_v], the state after it [B, d_k, d_v]) from q, k [B, C, d_k],
    v [B, C, d_v], decay (None: retention 1), write [B, C] and the state before it [B, d_k, d_v]."""
    if decay is None:  # every decay product is 1: D is the strictly lower mask, a = e = 1
        system = write.unsqueeze(-1) * (k @ k.transpose(-1, -2)).tril_(-1)
        w = torch.linalg.solve_triangular(
            system, write.unsqueeze(-1) * (v - k @ state), upper=False, unitriangular=True
        )
        reads = torch.baddbmm(q @ state, (q @ k.transpose(-1, -2)).tril_(-1), w)
        return reads, torch.baddbmm(state, k.transpose(-1, -2), w)
    length = decay.shape[1]
    one = decay.new_ones(decay.shape[0], 1)
    table = gap_products(torch.cat([one, decay, one], dim=1))  # positions: start, 0..C-1, end
    before, between = table[:, 1 : length + 1, 0], table[:, 1 : length + 1, 1 : length + 1]  # a_t, D_{t,i}
    after, total = table[:, length + 1, 1 : length + 1], table[:, length + 1, 0]  # e_i, prod f
    system = write.unsqueeze(-1) * (between * (k @ k.transpose(-1, -2)))  # A: strictly lower
    target = write.unsqueeze(-1) * (v - before.unsqueeze(-1) * (k @ state))
    # (I + A) W = target; the unit diagonal is implied (A's own diagonal is zero)
    w = torch.linalg.solve_triangular(system, target, upper=False, unitriangular=True)
    reads = torch.baddbmm(before.unsqueeze(-1) * (q @ state), between * (q @ k.transpose(-1, -2)), w)
    new_state = torch.baddbmm(total[:, None, None] * state, k.transpose(-1, -2), after.unsqueeze(-1) * w)
    return reads, new_state


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    write: torch.Tensor,
    init: torch.Tensor,
    chunk: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(reads [B, T, d_v], final state [B, d_k, d_v]) chunk by chunk; inputs of one dtype and
    device as the dispatcher prepares them (init given, zeros when the caller had none; decay None
    for a retention of 1 everywhere, which skips the decay products)."""
    length = write.shape[1]
    if length <= chunk:
        return _chunk(q, k, v, decay, write, init)
    state, reads = init, []
    for start in range(0, length, chunk):
        part = slice(start, min(start + chunk, length))
        out, state = _chunk(
            q[:, part], k[:, part], v[:, part], None if decay is None else decay[:, part], write[:, part], state
        )
        reads.append(out)
    return torch.cat(reads, dim=1), state
