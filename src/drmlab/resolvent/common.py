r"""What every torch path of the resolvent operator shares (``docs/resolvent.md`` section 6.1):
switches as ``[b, h]`` tensors, the blended gates ``m`` and ``theta'``, and the running sums ``L``
(log gate) and ``Theta`` (phase) with the segment starts at closed gates.
"""

from __future__ import annotations

import torch

__all__ = [
    "Switch",
    "blend_gates",
    "compute_dtype",
    "as_switch",
    "fixed_at",
    "gate_sums",
    "expand_heads",
    "rescale_by_lse",
]

Switch = float | int | torch.Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other dtype (section 6.4)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_switch(x: Switch, B: int, H: int, dtype: torch.dtype, device) -> torch.Tensor:
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


def fixed_at(x: Switch, value: float) -> bool:
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
    magnitude: torch.Tensor, phase: torch.Tensor | None, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``m = clamp(lerp(1, u, g), 0, 1)`` and ``theta' = g theta`` for ``[B, h, S]`` gates and a
    ``[b, h]`` switch ``g``; the result broadcasts over heads."""
    gg = g[..., None]
    m = _lerp_one(magnitude, gg).clamp(0.0, 1.0)
    th = None if phase is None else gg * phase
    return m, th


def gate_sums(m: torch.Tensor, th: torch.Tensor | None):
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


def expand_heads(x: torch.Tensor, B: int, H: int) -> torch.Tensor:
    """``[B, 1 or H, ...]`` -> ``[B, H, ...]`` (a view)."""
    return x.expand(B, H, *x.shape[2:])


def rescale_by_lse(o: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``o Z^(1 - beta)`` with ``log Z = lse``: a softmax readout turned into the ``beta`` readout."""
    return o * torch.exp((1.0 - beta)[..., None] * lse)[..., None]
