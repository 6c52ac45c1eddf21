r"""The ``scan`` path of the resolvent operator (``docs/resolvent.md`` section 6.2): at ``qk = 0``
the head is the gated chain ``y_i = a_i y_{i-1} + v_i`` of section 3, run through
:func:`drmlab.ops.linear_scan` in O(S) and divided by ``Z_i^beta`` from the real chain
``Z_i = m_i Z_{i-1} + 1``.
"""

from __future__ import annotations

import torch

from drmlab.ops import linear_scan
from drmlab.resolvent.common import blend_gates, expand_heads, fixed_at

__all__ = ["scan_resolvent"]


def scan_resolvent(v, magnitude, phase, beta, g, cdt, phase_free):
    """``(Re O, Im O or None)`` in ``cdt``; the switches are ``[b, h]`` tensors. With a phase the
    chain runs in the complex dtype of ``cdt``, without one in real arithmetic."""
    B, H, S, e = v.shape
    m, th = blend_gates(magnitude.to(cdt), None if phase_free else phase.to(cdt), g)
    mh = expand_heads(m, B, H)
    if th is None:
        f = mh
        u = v.to(cdt)
    else:
        thh = expand_heads(th, B, H)
        f = torch.complex(mh * torch.cos(thh), mh * torch.sin(thh))
        u = torch.complex(v.to(cdt), torch.zeros((), dtype=cdt, device=v.device).expand(v.shape))
    y = linear_scan(f.reshape(B * H, S, 1), u.reshape(B * H, S, e)).reshape(B, H, S, e)
    if not fixed_at(beta, 0.0):
        bm = m.shape[1]
        z = linear_scan(
            m.reshape(B * bm, S, 1), torch.ones((), dtype=cdt, device=v.device).expand(B * bm, S, 1)
        ).reshape(B, bm, S)
        y = y * torch.exp(-beta[..., None] * torch.log(z))[..., None]
    if th is None:
        return y, None
    return y.real, y.imag
