r"""The ``flash`` path of the resolvent operator (``docs/resolvent.md`` section 6.2): blockwise
online-softmax attention with the log-gate bias ``L_i - L_j`` and segment masks at closed gates,
in a custom autograd function whose backward recomputes the tiles, so neither pass holds more than
one ``[block_bh, block_q, block_k]`` score tile: O(S) memory, any switches.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from drmlab.resolvent.common import blend_gates, expand_heads, fixed_at, gate_sums, rescale_by_lse

__all__ = ["flash_resolvent"]


def _plan(start: torch.Tensor, S: int, bq: int, bk: int):
    """Per query block ``[i0, i1)``: its key blocks ``(j0, j1, seg)`` in descending order from
    the diagonal, clipped to ``j1 <= i1`` (causality) and starting no earlier than the smallest
    segment start of the block; ``seg`` says whether a segment mask is needed there."""
    nq = (S + bq - 1) // bq
    if torch.compiler.is_compiling():
        # A traced graph cannot branch on the segment starts (values): visit every key block up
        # to the diagonal, each with the segment mask. Same result to the bit: a block before
        # every row's segment start is masked whole and adds exact zeros (weight exp(-inf)).
        lo, hi = [0] * nq, [S] * nq
    else:
        pad = nq * bq - S
        st = start.reshape(-1, S)
        if pad:
            st = torch.cat([st, st[:, -1:].expand(-1, pad)], dim=1)
        st = st.reshape(-1, nq, bq)
        lo = st.amin(dim=(0, 2)).tolist()
        hi = st.amax(dim=(0, 2)).tolist()
    plan = []
    for qb in range(nq):
        i0, i1 = qb * bq, min(S, (qb + 1) * bq)
        blocks = []
        j1 = i1
        while j1 > lo[qb]:
            j0 = max(lo[qb], j1 - bk)
            blocks.append((j0, j1, j0 < hi[qb]))
            j1 = j0
        plan.append((i0, i1, blocks))
    return plan


# Exponent floor of the flash tiles: a weight below e^floor of its row's largest (e^-60 ~ 9e-27 in
# float32) is set to exactly 0, so the tiles never hold subnormals, which make CPU matmuls many
# times slower. The relative effect on a row is below S * e^floor.
_EXP_FLOOR = {torch.float32: -60.0, torch.float64: -600.0}


@functools.lru_cache(maxsize=64)
def _causal_bias_cached(offset, bq, width, dtype, device):
    iq = torch.arange(bq, device=device) + offset
    jk = torch.arange(width, device=device)
    bias = torch.zeros(bq, width, dtype=dtype, device=device)
    return bias.masked_fill_(jk[None, :] > iq[:, None], -math.inf)


def _causal_bias(i0, bq, c0, j1, dtype, device):
    """``[bq, j1 - c0]``: -inf above the diagonal (key > query), else 0, for queries ``i0 ..``
    and keys ``c0 .. j1``. Depends only on ``(i0 - c0, bq, j1 - c0)``, so it is cached. (Adding
    it is several times faster than ``masked_fill_`` on a strided tile.)"""
    # a traced graph builds the bias itself (a graph holds no cache; calling the lru_cache
    # wrapper there only makes Dynamo warn that it ignores it)
    build = _causal_bias_cached.__wrapped__ if torch.compiler.is_compiling() else _causal_bias_cached
    return build(i0 - c0, bq, j1 - c0, dtype, torch.device(device))


def _mask_block(x, st_q, i0, j0, j1, seg):
    """Set dead pairs of the score tile ``x [n, bq, j1 - j0]`` to -inf in place: the causal
    triangle (only where the tile reaches past ``i0``) and, if ``seg``, keys before the query's
    segment start."""
    bq = x.shape[1]
    if j1 - 1 > i0:
        c0 = max(i0, j0)  # first key column that can lie above the diagonal
        x[:, :, c0 - j0 :].add_(_causal_bias(i0, bq, c0, j1, x.dtype, x.device))
    if seg:
        jk = torch.arange(j0, j1, device=x.device)
        x.masked_fill_(jk[None, None, :] < st_q[:, :, None], -math.inf)


def _exp_block(x, shift, floor):
    """``exp(x - shift)`` in place, with arguments at or below ``floor`` (and -inf) giving 0."""
    if shift is not None:
        x.sub_(shift[:, :, None])
    F.threshold_(x, floor, -math.inf)
    return x.exp_()


def _flash_fwd_chunk(qf, kf, vf, Lf, sf, bq, bk, o, lse):
    """Forward of :class:`_GatedFlash` on a chunk of rows ``[n, S, *]`` of the flattened
    ``B * H``; writes ``o [n, S, e]`` and ``lse [n, S]``."""
    n, S, d = qf.shape
    e = vf.shape[-1]
    dt, dev = qf.dtype, qf.device
    ones = torch.ones(n, S, 1, dtype=dt, device=dev)
    q1 = torch.cat([qf, ones], dim=-1)  # [q, 1]
    v1 = torch.cat([vf, ones], dim=-1)  # [v, 1]: the row sum rides along with the values
    kt = torch.empty(n, d + 1, S, dtype=dt, device=dev)  # [k, bias]^T, keys contiguous
    kt[:, :d] = kf.transpose(1, 2)
    floor = torch.finfo(dt).min
    tiny = _EXP_FLOOR[dt]
    for i0, i1, blocks in _plan(sf, S, bq, bk):
        ref = Lf[:, i0 : i0 + 1]
        lo = blocks[-1][0]
        kt[:, d, lo:i1] = (ref - Lf[:, lo:i1]).to(dt)  # -(L_j - L_r)
        q_blk = q1[:, i0:i1]
        st_q = sf[:, i0:i1]
        m_run = acc = None
        for j0, j1, seg in blocks:
            x = torch.bmm(q_blk, kt[:, :, j0:j1])
            _mask_block(x, st_q, i0, j0, j1, seg)
            mx = x.amax(dim=-1)
            if m_run is None:
                m_new = mx.clamp_min(floor)
                _exp_block(x, m_new, tiny)
                acc = torch.bmm(x, v1[:, j0:j1])
            else:
                m_new = torch.maximum(m_run, mx)
                _exp_block(x, m_new, tiny)
                alpha = torch.exp(m_run - m_new)
                acc = torch.baddbmm(acc * alpha[:, :, None], x, v1[:, j0:j1])
            m_run = m_new
        l_run = acc[:, :, e]
        o[:, i0:i1] = acc[:, :, :e] / l_run[:, :, None]
        lse[:, i0:i1] = m_run + torch.log(l_run) + (Lf[:, i0:i1] - ref).to(dt)


def _flash_bwd_chunk(qf, kf, vf, Lf, sf, lsef, dof, delta, bq, bk, dq, dk1, dv):
    """Backward of :class:`_GatedFlash` on a chunk of rows; accumulates ``dq``, ``dk1`` (whose
    last column collects the column sums of ``ds``) and ``dv``."""
    n, S, d = qf.shape
    e = vf.shape[-1]
    dt, dev = qf.dtype, qf.device
    ones = torch.ones(n, S, 1, dtype=dt, device=dev)
    # [q, 1, -lse_rel] . [k, L_r - L_j, 1] = x_ij - lse_i: the shift rides in the matmul too
    q2 = torch.cat([qf, ones, ones], dim=-1)
    vt = torch.cat([vf, ones], dim=-1).transpose(1, 2).contiguous()  # [v, 1]^T
    do1 = torch.cat([dof, -delta[..., None]], dim=-1)  # [do, -D]: dp - D in one matmul
    kt = torch.empty(n, d + 2, S, dtype=dt, device=dev)
    kt[:, :d] = kf.transpose(1, 2)
    kt[:, d + 1] = 1.0
    tiny = _EXP_FLOOR[dt]
    for i0, i1, blocks in _plan(sf, S, bq, bk):
        ref = Lf[:, i0 : i0 + 1]
        lo = blocks[-1][0]
        kt[:, d, lo:i1] = (ref - Lf[:, lo:i1]).to(dt)
        q2[:, i0:i1, d + 1] = (Lf[:, i0:i1] - ref).to(dt) - lsef[:, i0:i1]
        q_blk = q2[:, i0:i1]
        q1_blk = q_blk[:, :, : d + 1]
        do_blk = do1[:, i0:i1]
        st_q = sf[:, i0:i1]
        dq_blk = dq[:, i0:i1]
        for j0, j1, seg in blocks:
            x = torch.bmm(q_blk, kt[:, :, j0:j1])
            _mask_block(x, st_q, i0, j0, j1, seg)
            p = _exp_block(x, None, tiny)
            # (in-place baddbmm_ on these strided views falls back to per-batch addmm_)
            dv[:, j0:j1] += torch.bmm(p.transpose(1, 2), do_blk[:, :, :e])
            ds = torch.bmm(do_blk, vt[:, :, j0:j1]).mul_(p)
            dq_blk += torch.bmm(ds, kf[:, j0:j1])
            dk1[:, j0:j1] += torch.bmm(ds.transpose(1, 2), q1_blk)


# Default tile budget of the flash path (elements of one [block_bh, block_q, block_k] score tile):
# 2^21 float32 = 8 MiB, so block_bh = 16 at block_q = 128, S >= 1024. Measured at B8 H6 S1024
# d64 fwd+bwd on a 2-core CPU, single-threaded CPU time against scaled_dot_product_attention:
# block_bh 8: 1.18x, 16: 1.27x, 48: 1.58x (smaller tiles stay in cache). On a loaded machine
# with 2 threads the per-op thread barriers favour fewer, larger tiles instead (wall time
# 2.1x at block_bh 48 against 5.5x at 16); pass block_bh explicitly there.
_TILE_ELEMENTS = 1 << 21


class _GatedFlash(torch.autograd.Function):
    """Blockwise attention with scores ``x_ij = q_i.k_j + L_i - L_j`` on live pairs
    (``start_i <= j <= i``). Returns ``o = softmax_j(x) v`` and ``lse = logsumexp_j x_ij``.

    Scores are formed relative to the query block's first position ``r``:
    ``x_ij = [q_i, 1].[k_j, L_r - L_j] + (L_i - L_r)``, the differences of ``L`` taken in
    float64, so a long decaying prefix costs no precision; the bias rides in the matmul as one
    extra column. Key blocks are visited from the diagonal backwards with an online softmax, so
    every row is finite after the first block. The work runs over chunks of ``block_bh`` rows of
    ``B * H`` (cache-sized tiles ``[block_bh, block_q, block_k]``). The backward recomputes each
    tile from ``(q, k, v, L, start, lse)``; nothing of size ``[S, S]`` is ever held.
    """

    @staticmethod
    def forward(ctx, q, k, v, L, start, bq, bk, bh):
        B, H, S, _ = q.shape
        e = v.shape[-1]
        qf, kf, vf, Lf, sf = _rows(B * H, S, q, k, v, L, start)
        o = torch.empty(B * H, S, e, dtype=q.dtype, device=q.device)
        lse = torch.empty(B * H, S, dtype=q.dtype, device=q.device)
        if bh is None:
            bh = max(1, _TILE_ELEMENTS // (bq * min(bk, S)))
        for c in _chunks(B * H, bh):
            _flash_fwd_chunk(qf[c], kf[c], vf[c], Lf[c], sf[c], bq, bk, o[c], lse[c])
        o = o.reshape(B, H, S, e)
        lse = lse.reshape(B, H, S)
        ctx.save_for_backward(q, k, v, L, start, o, lse)
        ctx.blocks = (bq, bk, bh)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, L, start, o, lse = ctx.saved_tensors
        bq, bk, bh = ctx.blocks
        B, H, S, d = q.shape
        e = v.shape[-1]
        BH = B * H
        dt, dev = q.dtype, q.device
        dof, delta, dlsef = _output_grads(do, dlse, o, BH, S, dt)
        qf, kf, vf, Lf, sf, lsef = _rows(BH, S, q, k, v, L, start, lse)
        dq = torch.zeros(BH, S, d, dtype=dt, device=dev)
        dk1 = torch.zeros(BH, S, d + 1, dtype=dt, device=dev)
        dv = torch.zeros(BH, S, e, dtype=dt, device=dev)
        for c in _chunks(BH, bh):
            _flash_bwd_chunk(qf[c], kf[c], vf[c], Lf[c], sf[c], lsef[c], dof[c], delta[c], bq, bk, dq[c], dk1[c], dv[c])
        # x_ij = ... + L_i - L_j: the row part of dL is sum_j ds_ij = dlse_i; the key part,
        # -sum_i ds_ij, was collected by the ones column of [q, 1] in dk1[..., d].
        dL = dlsef - dk1[..., d]
        grads = (dq, dk1[..., :d], dv, dL.to(L.dtype))
        return *(t.reshape(B, H, *t.shape[1:]) for t in grads), None, None, None, None


def _rows(BH, S, *xs):
    """Each ``[B, H, S, ...]`` tensor as ``[B * H, S, ...]`` rows."""
    return [x.reshape(BH, S, *x.shape[3:]) for x in xs]


def _chunks(n, size):
    """Slices of ``size`` rows covering ``range(n)``."""
    return [slice(c0, min(n, c0 + size)) for c0 in range(0, n, size)]


def _output_grads(do, dlse, o, BH, S, dt):
    """The incoming gradients as rows, and ``delta_i = do_i.o_i - dlse_i`` (the softmax
    backward's row term; an absent gradient is zero)."""
    e = o.shape[-1]
    if do is None:
        do = torch.zeros_like(o)
    dof = do.reshape(BH, S, e).to(dt)
    delta = (dof * o.reshape(BH, S, e)).sum(dim=-1)
    if dlse is not None:
        dlsef = dlse.reshape(BH, S).to(dt)
        delta = delta - dlsef
    else:
        dlsef = torch.zeros(BH, S, dtype=dt, device=o.device)
    return dof, delta, dlsef


def flash_resolvent(q, k, v, magnitude, phase, beta, qk, g, cdt, phase_free, block_q, block_k, block_bh):
    """``(Re O, Im O or None)`` in ``cdt``; the switches are ``[b, h]`` tensors. A phase-free head
    (``phase_free``) keeps the values as they are; otherwise they are widened to the cos/sin
    lanes of section 6.1."""
    B, H, S, d = q.shape
    e = v.shape[-1]
    m, th = blend_gates(magnitude.to(cdt), None if phase_free else phase.to(cdt), g)
    L, start, theta = gate_sums(m, th)
    L = expand_heads(L, B, H)
    start = expand_heads(start, B, H)
    qs = q.to(cdt) * (qk[..., None, None] / math.sqrt(d))
    vc = v.to(cdt)
    if theta is not None:
        theta = expand_heads(theta, B, H)
        c = torch.cos(theta).to(cdt)[..., None]
        s = torch.sin(theta).to(cdt)[..., None]
        vc = torch.cat([c * vc, s * vc], dim=-1)
    o, lse = _GatedFlash.apply(qs, k.to(cdt), vc, L, start, block_q, block_k, block_bh)
    if not fixed_at(beta, 1.0):
        o = rescale_by_lse(o, beta, lse)
    if theta is None:
        return o, None
    cc, ss = o[..., :e], o[..., e:]
    return c * cc + s * ss, s * cc - c * ss
