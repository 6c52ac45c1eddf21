r"""Batched, differentiable torch resolvent operator (``docs/resolvent.md`` section 6).

Public entry point: :func:`resolvent_attention`. Per batch element and head it evaluates the
head of ``docs/resolvent.md`` section 1 (:mod:`drmlab.resolvent.reference` is the float64 numpy
reference)::

    m_k  = clamp(lerp(1, u_k, g), 0, 1),  th'_k = g theta_k,  a_k = m_k e^{i th'_k}
    G_ij = prod_{k=j+1..i} a_k,  R_ij = |G_ij|,  Z_i = sum_{j<=i} R_ij e^{qk s_ij}
    W_ij = G_ij e^{qk s_ij} / Z_i^beta  (j <= i),   O_i = sum_j W_ij v_j,   s_ij = q_i.k_j / sqrt(d)

No complex dtype is needed in the attention paths: for ``j <= i`` with no closed gate in
``(j, i]``, ``G_ij = exp(L_i - L_j) e^{i(Theta_i - Theta_j)}`` with ``L`` the running sum of
``log m_k`` and ``Theta`` the running sum of ``th'_k`` (``k >= 1``; ``a_0`` is never read), and a
closed gate (``m_k = 0``) is a segment boundary: pairs on different sides of it are masked, so
the zero is exact and no ``log 0`` is ever taken. The phase is carried as real cos/sin lanes::

    Re O_i = cos Th_i C_i + sin Th_i S_i,  Im O_i = sin Th_i C_i - cos Th_i S_i,
    C_i = sum_j P_ij cos Th_j v_j,  S_i = sum_j P_ij sin Th_j v_j,  P_ij = |W_ij|

so the gated head is attention with the additive bias ``L_i - L_j``, segment masking at closed
gates, values widened to ``[cos Th v, sin Th v]``, and the output scaled by ``Z_i^{1 - beta}``.

Paths (``path=``):

* ``"dense"``: materialises ``[B, H, S, S]``; general, the exactness reference (float64 agrees
  with the numpy reference to 1e-12).
* ``"sdpa"``: ``g = 0`` and ``beta = 1`` (the softmax corner; ``qk`` is folded into ``q``):
  ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal=True``.
* ``"flash"``: any switches. Blockwise online-softmax attention with the log-gate bias and
  segment masking, in a custom autograd function whose backward recomputes the tiles, so neither
  pass holds more than one ``[block_bh, block_q, block_k]`` score tile (``block_bh`` rows of
  ``B * H``): O(S) memory, never ``[S, S]``. With no phase (``theta' = 0``) the values are not
  widened (the phase-free fast path). Inside a tile a weight below ``e^-60`` (float32;
  ``e^-600`` in float64) of its row's largest is set to 0 (relative effect below
  ``S * 1e-26``), which keeps subnormals, and the many-fold CPU slowdown they cause, out of the
  matmuls; masked pairs are exact zeros.
* ``"flex"``: phase-free heads only (no phase, or ``g = 0``): the same scores as ``flash``
  through ``torch.nn.attention.flex_attention`` (:mod:`drmlab.resolvent.flex`: the log-gate
  difference as ``score_mod``, causality and closed-gate segments as a block-sparse mask built
  from the segment starts; ``block_q`` is its sparsity block). On CUDA it is compiled and never
  builds ``[S, S]``; on a CPU only the forward runs (eager, a correctness check). **Not run on a
  GPU when written.**
* ``"scan"``: ``qk = 0`` (includes the path-product corner): the gated chain
  ``y_i = a_i y_{i-1} + v_i`` through :func:`drmlab.ops.linear_scan` in O(S), divided by
  ``Z_i^beta`` from the real scan ``Z_i = m_i Z_{i-1} + 1`` when ``beta != 0``. With a phase the
  chain runs in complex64/complex128 (the scan's complex mode); without, in real arithmetic.

``path="auto"`` picks ``sdpa`` when ``g == 0`` and ``beta == 1``, else ``scan`` when ``qk == 0``,
else ``flash`` -- on CUDA in float32/bf16/fp16, a phase-free ``flash`` becomes ``flex``; a switch only counts as fixed at a corner when it is a Python number or a tensor
that does not require grad, so a learnable switch never loses its gradient to a fast path.

Dtypes: float64 is computed in float64; float32, bfloat16 and float16 are computed in float32
(the log-gate and phase running sums always in float64) and returned in the input dtype, except
the ``sdpa`` path, which runs in the input dtype. The torch paths do not give the reference's +-inf
overflow guarantees.

Refusals (``check_finite=True``; off by default, and off in the language model, for speed): the
reference's refusals of ``docs/resolvent.md`` section 4, raised as the same
:class:`drmlab.resolvent.reference.NonFinite` with the same message, checked in the reference's
order over every ``(b, h)`` slice -- a non-finite switch, a non-finite ``q``, ``k``, ``u``
(``magnitude``) or ``theta`` (``phase``), a blended phase ``g theta`` that overflows, a causal logit
``qk s_ij`` that overflows (heads with ``qk = 0`` skip it, as in the reference). The blended
phase and the logits are evaluated in the compute dtype: for float64 inputs the refusals are the
reference's exactly; in float32 a logit or phase beyond the float32 range (3.4e38), which the
paths would turn into inf or NaN, is refused although the float64 reference accepts it. Values
``v`` are not checked (the reference's readout is not guarded either). The logit check costs one
bound from the row norms (``max |q_i| max |k_j| max(1, |qk|)`` below a quarter of the dtype's
largest value proves that nothing overflows) and, only for slices that fail the bound, one pass
over the causal logits in row chunks (never ``[S, S]`` at once). The check reads values, so under
``torch.compile`` it breaks the graph; it is meant for eager debugging and tests.

Gradient caveat: at a gate that is exactly closed (``m_k = 0``) the gradient with respect to
``m_k`` is taken as 0 (the segment mask is piecewise constant); with a clamp that is the true
derivative unless the pre-clamp value is exactly 0. The sigmoid parameterisation of
:mod:`drmlab.resolvent.gates` never closes a gate exactly.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

from drmlab.ops import linear_scan
from drmlab.resolvent.reference import NonFinite

__all__ = [
    "resolvent_attention",
    "resolvent_weights",
    "select_path",
    "blend_gates",
    "PATHS",
]

PATHS = ("auto", "dense", "sdpa", "flash", "flex", "scan")

Switch = Union[float, int, torch.Tensor]


# ----------------------------------------------------------------------------------- helpers


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _switch(x: Switch, B: int, H: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A switch as a ``[b, h]`` tensor (b in {1, B}, h in {1, H}); accepts a number or a tensor of
    shape ``[]``, ``[1]``, ``[H]``, ``[B, 1]``, ``[1, H]``, ``[B, H]``."""
    t = torch.as_tensor(x, dtype=dtype, device=device) if not torch.is_tensor(x) else x
    t = t.to(dtype=dtype, device=device)
    if t.dim() == 0:
        return t.reshape(1, 1)
    if t.dim() == 1:
        if t.shape[0] not in (1, H):
            raise ValueError(f"a 1-D switch must have 1 or H={H} entries, got {t.shape[0]}")
        return t.reshape(1, -1)
    if t.dim() == 2 and t.shape[0] in (1, B) and t.shape[1] in (1, H):
        return t
    raise ValueError(f"switch of shape {tuple(t.shape)} does not broadcast to [B={B}, H={H}]")


def _fixed_at(x: Switch, value: float) -> bool:
    """True when the switch is constant (no grad) and equal to ``value`` everywhere."""
    if torch.is_tensor(x):
        if x.requires_grad:
            return False
        return bool((x == value).all())
    return float(x) == value


def _lerp_one(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``lerp(1, u, g)``, exact at g = 0 and g = 1 (torch.lerp's two-sided formula)."""
    low = 1.0 + g * (u - 1.0)
    high = u - (u - 1.0) * (1.0 - g)
    return torch.where(g.abs() < 0.5, low, high)


def blend_gates(
    magnitude: torch.Tensor, phase: Optional[torch.Tensor], g: torch.Tensor
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``m = clamp(lerp(1, u, g), 0, 1)`` and ``theta' = g theta`` for ``[B, h, S]`` gates and a
    ``[b, h]`` switch ``g``; the result broadcasts over heads."""
    gg = g[..., None]
    m = _lerp_one(magnitude, gg).clamp(0.0, 1.0)
    th = None if phase is None else gg * phase
    return m, th


def _gate_sums(m: torch.Tensor, th: Optional[torch.Tensor]):
    """Running log-gate sum ``L`` (float64), segment starts and running phase ``Theta`` (float64).

    ``start[i]`` is the last position ``k <= i`` (``k >= 1``) with a closed gate, else 0: key ``j``
    is live for query ``i`` iff ``start[i] <= j <= i``.
    """
    S = m.shape[-1]
    safe = torch.where(m > 0, m, torch.ones_like(m))
    logm = torch.log(safe).to(torch.float64)
    logm = torch.cat([torch.zeros_like(logm[..., :1]), logm[..., 1:]], dim=-1)
    L = torch.cumsum(logm, dim=-1)
    pos = torch.arange(S, device=m.device)
    closed = (m.detach() == 0) & (pos >= 1)
    start = torch.where(closed, pos, torch.zeros_like(pos)).cummax(dim=-1).values
    theta = None
    if th is not None:
        t = th.to(torch.float64)
        t = torch.cat([torch.zeros_like(t[..., :1]), t[..., 1:]], dim=-1)
        theta = torch.cumsum(t, dim=-1)
    return L, start, theta


def _expand_heads(x: torch.Tensor, B: int, H: int) -> torch.Tensor:
    return x.expand(B, H, *x.shape[2:])


# ----------------------------------------------------------------------------------- dense


def _dense_parts(q, k, magnitude, phase, beta, qk, g, cdt):
    """``|W|`` (masked, float cdt) and the phase difference (or None) on ``[B, H, S, S]``."""
    B, H, S, d = q.shape
    m, th = blend_gates(magnitude.to(cdt), None if phase is None else phase.to(cdt), g)
    L, start, theta = _gate_sums(m, th)
    qc, kc = q.to(cdt), k.to(cdt)
    s = torch.matmul(qc, kc.transpose(-1, -2)) * (qk[..., None, None] / math.sqrt(d))
    bias = (L[..., :, None] - L[..., None, :]).to(cdt)
    i = torch.arange(S, device=q.device)
    live = (i[None, :] <= i[:, None]) & (i[None, :] >= start[..., :, None])
    x = torch.where(live, s + bias, torch.full((), -math.inf, dtype=cdt, device=q.device))
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)
    mag = torch.exp(x - beta[..., None, None] * log_z)
    phi = None
    if theta is not None:
        phi = theta[..., :, None] - theta[..., None, :]
    return mag, phi


def resolvent_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    magnitude: torch.Tensor,
    phase: Optional[torch.Tensor],
    beta: Switch,
    qk: Switch,
    g: Switch,
    *,
    check_finite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense operator ``W`` as real and imaginary parts, each ``[B, H, S, S]`` (exactly 0
    above the diagonal and on dead entries). Shapes and ``check_finite`` as in
    :func:`resolvent_attention`."""
    B, H, S, _ = q.shape
    cdt = _compute_dtype(q.dtype)
    if check_finite:
        _refuse_non_finite(q, k, magnitude, phase, beta, qk, g, cdt)
    beta_t, qk_t, g_t = (_switch(x, B, H, cdt, q.device) for x in (beta, qk, g))
    mag, phi = _dense_parts(q, k, magnitude, phase, beta_t, qk_t, g_t, cdt)
    if phi is None:
        return mag, torch.zeros_like(mag)
    return mag * torch.cos(phi).to(cdt), mag * torch.sin(phi).to(cdt)


def _dense(q, k, v, magnitude, phase, beta, qk, g, cdt):
    mag, phi = _dense_parts(q, k, magnitude, phase, beta, qk, g, cdt)
    vc = v.to(cdt)
    if phi is None:
        return torch.matmul(mag, vc), None
    re = torch.matmul(mag * torch.cos(phi).to(cdt), vc)
    im = torch.matmul(mag * torch.sin(phi).to(cdt), vc)
    return re, im


# ----------------------------------------------------------------------------------- flash


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
        B, H, S, d = q.shape
        e = v.shape[-1]
        BH = B * H
        qf = q.reshape(BH, S, d)
        kf = k.reshape(BH, S, d)
        vf = v.reshape(BH, S, e)
        Lf = L.reshape(BH, S)
        sf = start.reshape(BH, S)
        o = torch.empty(BH, S, e, dtype=q.dtype, device=q.device)
        lse = torch.empty(BH, S, dtype=q.dtype, device=q.device)
        if bh is None:
            bh = max(1, _TILE_ELEMENTS // (bq * min(bk, S)))
        for c0 in range(0, BH, bh):
            c = slice(c0, min(BH, c0 + bh))
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
        if do is None:
            do = torch.zeros_like(o)
        dof = do.reshape(BH, S, e).to(dt)
        delta = (dof * o.reshape(BH, S, e)).sum(dim=-1)
        if dlse is not None:
            dlsef = dlse.reshape(BH, S).to(dt)
            delta = delta - dlsef
        else:
            dlsef = torch.zeros(BH, S, dtype=dt, device=dev)
        qf = q.reshape(BH, S, d)
        kf = k.reshape(BH, S, d)
        vf = v.reshape(BH, S, e)
        Lf = L.reshape(BH, S)
        sf = start.reshape(BH, S)
        lsef = lse.reshape(BH, S)
        dq = torch.zeros(BH, S, d, dtype=dt, device=dev)
        dk1 = torch.zeros(BH, S, d + 1, dtype=dt, device=dev)
        dv = torch.zeros(BH, S, e, dtype=dt, device=dev)
        for c0 in range(0, BH, bh):
            c = slice(c0, min(BH, c0 + bh))
            _flash_bwd_chunk(qf[c], kf[c], vf[c], Lf[c], sf[c], lsef[c], dof[c], delta[c],
                             bq, bk, dq[c], dk1[c], dv[c])
        # x_ij = ... + L_i - L_j: the row part of dL is sum_j ds_ij = dlse_i; the key part,
        # -sum_i ds_ij, was collected by the ones column of [q, 1] in dk1[..., d].
        dL = dlsef - dk1[..., d]
        return (
            dq.reshape(B, H, S, d),
            dk1[..., :d].reshape(B, H, S, d),
            dv.reshape(B, H, S, e),
            dL.reshape(B, H, S).to(L.dtype),
            None,
            None,
            None,
            None,
        )


def _flash(q, k, v, magnitude, phase, beta, qk, g, cdt, phase_free, block_q, block_k, block_bh):
    B, H, S, d = q.shape
    e = v.shape[-1]
    m, th = blend_gates(magnitude.to(cdt), None if phase_free else phase.to(cdt), g)
    L, start, theta = _gate_sums(m, th)
    L = _expand_heads(L, B, H)
    start = _expand_heads(start, B, H)
    qs = q.to(cdt) * (qk[..., None, None] / math.sqrt(d))
    vc = v.to(cdt)
    if theta is not None:
        theta = _expand_heads(theta, B, H)
        c = torch.cos(theta).to(cdt)[..., None]
        s = torch.sin(theta).to(cdt)[..., None]
        vc = torch.cat([c * vc, s * vc], dim=-1)
    o, lse = _GatedFlash.apply(qs, k.to(cdt), vc, L, start, block_q, block_k, block_bh)
    if not _fixed_at(beta, 1.0):
        o = o * torch.exp((1.0 - beta)[..., None] * lse)[..., None]
    if theta is None:
        return o, None
    cc, ss = o[..., :e], o[..., e:]
    return c * cc + s * ss, s * cc - c * ss


# ----------------------------------------------------------------------------------- flex


def _flex(q, k, v, magnitude, beta, qk, g, cdt, block_size):
    """The phase-free head through :func:`drmlab.resolvent.flex.gated_flex_attention`: the same
    ``L`` and segment starts as ``dense`` and ``flash``, the same ``Z^(1 - beta)`` rescale."""
    from drmlab.resolvent.flex import gated_flex_attention

    B, H, _, d = q.shape
    m, _ = blend_gates(magnitude.to(cdt), None, g)
    L, start, _ = _gate_sums(m, None)
    qs = q.to(cdt) * (qk[..., None, None] / math.sqrt(d))
    o, lse = gated_flex_attention(qs, k.to(cdt), v.to(cdt), _expand_heads(L, B, H),
                                  _expand_heads(start, B, H), block_size)
    if not _fixed_at(beta, 1.0):
        o = o * torch.exp((1.0 - beta)[..., None] * lse)[..., None]
    return o, None


# ----------------------------------------------------------------------------------- scan


def _scan(v, magnitude, phase, beta, g, cdt, phase_free):
    B, H, S, e = v.shape
    m, th = blend_gates(magnitude.to(cdt), None if phase_free else phase.to(cdt), g)
    mh = _expand_heads(m, B, H)
    if th is None:
        f = mh
        u = v.to(cdt)
    else:
        thh = _expand_heads(th, B, H)
        f = torch.complex(mh * torch.cos(thh), mh * torch.sin(thh))
        u = torch.complex(v.to(cdt), torch.zeros((), dtype=cdt, device=v.device).expand(v.shape))
    y = linear_scan(f.reshape(B * H, S, 1), u.reshape(B * H, S, e)).reshape(B, H, S, e)
    if not _fixed_at(beta, 0.0):
        bm = m.shape[1]
        z = linear_scan(m.reshape(B * bm, S, 1), torch.ones((), dtype=cdt, device=v.device)
                        .expand(B * bm, S, 1)).reshape(B, bm, S)
        y = y * torch.exp(-beta[..., None] * torch.log(z))[..., None]
    if th is None:
        return y, None
    return y.real, y.imag


# ----------------------------------------------------------------------------------- refusals

# Elements of one logit chunk of the exact overflow check (float32: 16 MiB).
_CHECK_ELEMENTS = 1 << 22


def _all_finite(x: Switch) -> bool:
    if torch.is_tensor(x):
        return bool(torch.isfinite(x.detach()).all())
    return math.isfinite(float(x))


@torch.no_grad()
def _refuse_non_finite(q, k, magnitude, phase, beta, qk, g, cdt) -> None:
    """Raise :class:`NonFinite` where :func:`drmlab.resolvent.reference.operator` would refuse any
    ``(b, h)`` slice, with the reference's message, refusals taken in the reference's order (see
    the module docstring, "Refusals")."""
    if not (_all_finite(beta) and _all_finite(qk) and _all_finite(g)):
        raise NonFinite("non-finite switch")
    for name, x in (("q", q), ("k", k), ("u", magnitude), ("theta", phase)):
        if x is not None and not bool(torch.isfinite(x.detach()).all()):
            raise NonFinite(f"non-finite {name}")
    B, H, S, d = q.shape
    if S == 0:
        return
    if phase is not None:
        g_t = _switch(g, B, H, cdt, q.device)
        if not bool(torch.isfinite(g_t[..., None] * phase.detach().to(cdt)).all()):
            raise NonFinite("blended phase g * theta overflows")
    qk_t = _switch(qk, B, H, cdt, q.device).expand(B, H)
    active = qk_t != 0  # with qk = 0 the logit is exactly 0: nothing to check
    # Every partial sum of q_i.k_j, in any order of evaluation, is at most |q_i||k_j|: when that
    # bound (times |qk|) is far inside the dtype's range, no logit can overflow.
    q_norm = torch.linalg.vector_norm(q.detach().to(torch.float64), dim=-1).amax(-1)
    k_norm = torch.linalg.vector_norm(k.detach().to(torch.float64), dim=-1).amax(-1)
    bound = q_norm * k_norm * qk_t.to(torch.float64).abs().clamp_min(1.0)
    suspect = active & ~(bound < torch.finfo(cdt).max / 4)
    if not bool(suspect.any()):
        return
    qs, ks, scale = q.detach()[suspect].to(cdt), k.detach()[suspect].to(cdt), qk_t[suspect]
    rows = max(1, _CHECK_ELEMENTS // (qs.shape[0] * S))
    keys = torch.arange(S, device=q.device)
    for i0 in range(0, S, rows):
        i1 = min(S, i0 + rows)
        # the reference's order: s_ij = (q_i.k_j) / sqrt(d), then qk * s_ij
        logit = scale[:, None, None] * (torch.matmul(qs[:, i0:i1], ks[:, :i1].transpose(-1, -2)) / math.sqrt(d))
        causal = keys[None, :i1] <= torch.arange(i0, i1, device=q.device)[:, None]
        if not bool((torch.isfinite(logit) | ~causal).all()):
            raise NonFinite("logit qk * s_ij overflows")


# ----------------------------------------------------------------------------------- public


def select_path(
    phase: Optional[torch.Tensor], beta: Switch, qk: Switch, g: Switch
) -> str:
    """The path ``resolvent_attention(path="auto")`` takes for these gates and switches."""
    if _fixed_at(g, 0.0) and _fixed_at(beta, 1.0):
        return "sdpa"
    if _fixed_at(qk, 0.0):
        return "scan"
    return "flash"


@functools.lru_cache(maxsize=1)
def _has_flex() -> bool:
    from drmlab.resolvent.flex import flex_available

    return flex_available()


def _phase_free(phase: Optional[torch.Tensor], g: Switch) -> bool:
    if phase is None or _fixed_at(g, 0.0):
        return True
    if torch.compiler.is_compiling():  # a traced graph cannot read the phases: take the general path
        return False
    return not phase.requires_grad and not bool((phase != 0).any())


def resolvent_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    magnitude: torch.Tensor,
    phase: Optional[torch.Tensor],
    beta: Switch,
    qk: Switch,
    g: Switch,
    path: str = "auto",
    *,
    return_imag: bool = False,
    block_q: int = 128,
    block_k: int = 1024,
    block_bh: Optional[int] = None,
    check_finite: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal resolvent attention, batched over ``[B, H]``.

    Args:
        q, k: ``[B, H, S, d]`` queries and keys (``s_ij = q_i.k_j / sqrt(d)``).
        v: ``[B, H, S, e]`` real values.
        magnitude: ``[B, H or 1, S]`` raw gate magnitudes ``u`` (the blend clamps
            ``lerp(1, u, g)`` to [0, 1]; produce ``u`` with a parameterisation from
            :mod:`drmlab.resolvent.gates`, e.g. a sigmoid, so that gates keep gradient).
        phase: ``[B, H or 1, S]`` gate phases ``theta``, or None for zero phase.
        beta, qk, g: the switches, each a number or a tensor of shape ``[]``, ``[H]`` or
            ``[B, H]`` (learnable: gradients flow to tensors that require grad).
        path: ``"auto"`` (default), ``"dense"``, ``"sdpa"``, ``"flash"``, ``"flex"`` or ``"scan"``; see the
            module docstring. A forced fast path outside its corner raises ValueError.
        return_imag: also return the imaginary part of the readout.
        block_q, block_k, block_bh: tile of the ``flash`` path: query positions, key positions
            and rows of ``B * H`` per step (memory per step ~ ``block_bh*block_q*block_k``);
            ``block_bh=None`` sizes tiles to about 2^21 elements.
        check_finite: raise :class:`drmlab.resolvent.reference.NonFinite`, as the float64
            reference does, for a non-finite switch, q, k, magnitude or phase, an overflowing
            blended phase or an overflowing causal logit (module docstring, "Refusals"). Off by
            default: it reads every input once more and can cost a pass over the logits.

    Returns:
        ``Re O`` of shape ``[B, H, S, e]`` in the input dtype, or ``(Re O, Im O)`` when
        ``return_imag``. ``a_0`` (position 0's gate) is never read.
    """
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must be one [B, H, S, d] shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    B, H, S, d = q.shape
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, H, S, e] with [B, H, S] = {tuple(q.shape[:3])}, "
                         f"got {tuple(v.shape)}")
    for name, t in (("magnitude", magnitude), ("phase", phase)):
        if t is None:
            continue
        if t.dim() != 3 or t.shape[0] != B or t.shape[1] not in (1, H) or t.shape[2] != S:
            raise ValueError(f"{name} must be [B, H or 1, S] = [{B}, {H} or 1, {S}], got "
                             f"{tuple(t.shape)}")
    if S > 0 and d == 0:
        raise ValueError("head_dim = 0 with a non-empty sequence")
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; use one of {PATHS}")
    out_dtype = q.dtype
    if check_finite:
        _refuse_non_finite(q, k, magnitude, phase, beta, qk, g, _compute_dtype(q.dtype))
    if S == 0:
        empty = v.new_zeros(v.shape, dtype=out_dtype)
        return (empty, empty.clone()) if return_imag else empty

    chosen = select_path(phase, beta, qk, g) if path == "auto" else path
    free = _phase_free(phase, g)
    cdt = _compute_dtype(q.dtype)
    if (path == "auto" and chosen == "flash" and free and q.device.type == "cuda"
            and cdt == torch.float32 and _has_flex()):
        chosen = "flex"  # never run on a GPU when written: see drmlab.resolvent.flex

    if chosen == "sdpa":
        if not (_fixed_at(g, 0.0) and _fixed_at(beta, 1.0)):
            raise ValueError("path='sdpa' needs constant g = 0 and beta = 1")
        if _fixed_at(qk, 1.0):
            qq = q
        else:
            qq = q * _switch(qk, B, H, q.dtype, q.device)[..., None, None]
        re = F.scaled_dot_product_attention(qq, k, v, is_causal=True)
        im = None
    else:
        beta_t, qk_t, g_t = (_switch(x, B, H, cdt, q.device) for x in (beta, qk, g))
        # computed in cdt as documented, under an autocast too (its bf16 matmuls would round the
        # scores and overflow the flash tiles' float32 floor)
        with torch.autocast(device_type=q.device.type, enabled=False):
            if chosen == "dense":
                re, im = _dense(q, k, v, magnitude, None if free else phase, beta_t, qk_t, g_t, cdt)
            elif chosen == "flex":
                if not free:
                    raise ValueError("path='flex' needs a phase-free head (no phase, or g = 0)")
                re, im = _flex(q, k, v, magnitude, beta_t, qk_t, g_t, cdt, block_q)
            elif chosen == "flash":
                re, im = _flash(q, k, v, magnitude, phase, beta_t, qk_t, g_t, cdt, free,
                                block_q, block_k, block_bh)
            else:  # scan
                if not _fixed_at(qk, 0.0):
                    raise ValueError("path='scan' needs constant qk = 0")
                re, im = _scan(v, magnitude, phase, beta_t, g_t, cdt, free)
    re = re.to(out_dtype)
    if not return_imag:
        return re
    im = torch.zeros_like(re) if im is None else im.to(out_dtype)
    return re, im
