r"""The ``sdpa`` path of the resolvent operator (``docs/resolvent.md`` section 6.2): at the
softmax corner (``g = 0``, ``beta = 1``) the head is causal softmax attention, evaluated by
``torch.nn.functional.scaled_dot_product_attention`` in the input dtype, ``qk`` folded into ``q``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drmlab.resolvent.common import Switch, as_switch, fixed_at

__all__ = ["sdpa_resolvent"]


def sdpa_resolvent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk: Switch):
    """``(Re O, None)`` in the input dtype; ``qk`` as the caller passed it (a number or a tensor)."""
    B, H = q.shape[:2]
    qq = q if fixed_at(qk, 1.0) else q * as_switch(qk, B, H, q.dtype, q.device)[..., None, None]
    return F.scaled_dot_product_attention(qq, k, v, is_causal=True), None
