r"""The selective state-space mixer of the looped study (``docs/looped.md`` section 2; proof 5 of section 7).

:class:`SelectiveSSM` maps ``h`` [B, T, d] -> [B, T, d]; the study's minimal S6-style mixer (one
n-vector of state per sequence):

    c_t = SiLU(conv(h)_t)          (causal depthwise conv, kernel K, with bias; c = h when K = 0)
    δ_t = softplus(w_δ · c_t + b_δ)                    one scalar per token   [B, T, 1]
    s_t = exp(-softplus(a) δ_t) ⊙ s_{t-1} + δ_t (W_B c_t),   s_{-1} = 0       [B, T, n]
    y_t = W_C s_t + D ⊙ c_t
    out_t = W_out (y_t ⊙ SiLU(W_g h_t))                (the gate reads the un-convolved input)

``conv_kernel=0`` is the study's round-6/8 mixer (arms MA, MB, MC, MB4, MC4), ``conv_kernel=4``
its "conv-upgraded" round-11 mixer (MA768 ... HE768). Parameters: ``2d² + 2dn + 2d + n + 1``
plus ``(K + 1) d`` for the conv.

The state update is :func:`drmlab.ops.linear_scan` on the n state channels:
the exact sequential recurrence, forward and backward. The study evaluated it in log space as
``e^{Λ_t} cumsum(u_k e^{-Λ_k})`` with ``Λ`` clamped at -30, which turns every channel into a
pure integrator once its cumulative decay passes 30 nats (``docs/looped.md`` section 2.2); nothing
here divides by a cumulative decay, so any length and any decay rate are exact. Under
reduced-precision autocast δ, the decay, the scan input and the scan run in float32 (as in the study); the state is cast
back to the input dtype before the read-out.

Incremental decoding: :meth:`SelectiveSSM.init_state` / :meth:`SelectiveSSM.step` carry the
state s and the conv's last K - 1 inputs (O(1) per token); stepping a sequence reproduces the
parallel forward, and ``forward(h, return_state=True)`` returns the state after h. (LOOPED's
``ssm_variant="mamba"`` uses Mamba's own mixer, :mod:`drmlab.models.layers.mamba_mixer`.)
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.layers.conv_context import trailing_context
from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step, linear_scan

__all__ = ["SelectiveSSM", "selective_ssm_parameter_count"]


def selective_ssm_parameter_count(d_model: int, d_state: int, conv_kernel: int = 4) -> int:
    """The closed-form parameter count of ``SelectiveSSM(d_model, d_state, conv_kernel)``."""
    d, n = d_model, d_state
    conv = (conv_kernel + 1) * d if conv_kernel else 0
    return 2 * d * d + 2 * d * n + 2 * d + n + 1 + conv


def _no_autocast(x: torch.Tensor):
    """Disable autocast for x's device type (so the gates and the scan keep float32)."""
    try:
        return torch.autocast(x.device.type, enabled=False)
    except RuntimeError:  # a device type without autocast support
        return nullcontext()


class SelectiveSSM(nn.Module):
    """The selective SSM mixer (see the module docstring); ``forward(h [B, T, d]) -> [B, T, d]``."""

    def __init__(self, d_model: int, d_state: int = 16, conv_kernel: int = 4, init_std: float = 0.02):
        super().__init__()
        for field, value in (("d_model", d_model), ("d_state", d_state)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if not isinstance(conv_kernel, int) or isinstance(conv_kernel, bool) or conv_kernel < 0:
            raise ValueError(f"conv_kernel must be a non-negative integer (0 = no conv), got {conv_kernel!r}")
        d, n = d_model, d_state
        self.d_model, self.d_state, self.conv_kernel = d, n, conv_kernel
        self.init_std = init_std
        if conv_kernel:
            self.conv_weight = nn.Parameter(torch.empty(d, 1, conv_kernel))
            self.conv_bias = nn.Parameter(torch.empty(d))
        else:
            self.register_parameter("conv_weight", None)
            self.register_parameter("conv_bias", None)
        self.w_delta = nn.Linear(d, 1)  # w_δ, b_δ
        self.a = nn.Parameter(torch.empty(n))
        self.w_b = nn.Linear(d, n, bias=False)
        self.w_c = nn.Linear(n, d, bias=False)
        self.d_skip = nn.Parameter(torch.empty(d))  # D
        self.w_gate = nn.Linear(d, d, bias=False)  # W_g
        self.out_proj = nn.Linear(d, d, bias=False)  # W_out (a "write-back" matrix)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The study's init: Linear weights N(0, init_std²), biases 0, a = 0, D = 0, the conv at
        torch's Conv1d default U(±1/√K)."""
        std = self.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.conv_weight is not None:
            bound = 1.0 / math.sqrt(self.conv_kernel)  # kaiming_uniform(a=√5) with fan-in K
            nn.init.uniform_(self.conv_weight, -bound, bound)
            nn.init.uniform_(self.conv_bias, -bound, bound)
        with torch.no_grad():
            self.a.zero_()
            self.d_skip.zero_()

    # ------------------------------------------------------------------ pieces
    def _conv(self, h: torch.Tensor) -> torch.Tensor:
        """c = SiLU(conv(h)), or h without a conv."""
        return F.silu(causal_depthwise_conv1d(h, self.conv_weight, self.conv_bias)) if self.conv_kernel else h

    def _gates(self, c: torch.Tensor):
        """(decay f, scan input u) [B, T, n] in float32 or wider, computed with autocast off."""
        sdt = torch.promote_types(c.dtype, torch.float32)
        with _no_autocast(c):
            cs = c.to(sdt)
            delta = F.softplus(F.linear(cs, self.w_delta.weight.to(sdt), self.w_delta.bias.to(sdt)))  # [B,T,1]
            rate = F.softplus(self.a.to(sdt))  # [n]
            f = torch.exp(-delta * rate)
            u = delta * F.linear(cs, self.w_b.weight.to(sdt))
            return f, u

    def _readout(self, s: torch.Tensor, c: torch.Tensor, gate_in: torch.Tensor) -> torch.Tensor:
        """y = W_C s + D c for the states s [B, T, n]; then gate and project."""
        y = self.w_c(s.to(c.dtype)) + self.d_skip * c
        return self.out_proj(y * F.silu(self.w_gate(gate_in)))

    # ------------------------------------------------------------------ forward
    def forward(self, h: torch.Tensor, return_state: bool = False):
        """h [B, T, d] -> [B, T, d], causal (output t depends on h_0..h_t only); with
        ``return_state`` also the decoding state after h."""
        if h.dim() != 3 or h.shape[-1] != self.d_model:
            raise ValueError(f"SelectiveSSM expects [batch, time, {self.d_model}], got {tuple(h.shape)}")
        c = self._conv(h)
        f, u = self._gates(c)
        s = linear_scan(f, u)
        out = self._readout(s, c, h)
        if not return_state:
            return out
        context = trailing_context(h, self.conv_kernel - 1) if self.conv_kernel else None
        return out, (s[:, -1], context)

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, dtype: torch.dtype | None = None, device=None) -> tuple:
        """(s [B, n] zeros, conv context [B, K - 1, d] zeros or None)."""
        ref = self.out_proj.weight
        dtype, device = dtype or ref.dtype, device or ref.device
        s = torch.zeros(batch_size, self.d_state, dtype=torch.promote_types(dtype, torch.float32), device=device)
        ctx = (
            torch.zeros(batch_size, self.conv_kernel - 1, self.d_model, dtype=dtype, device=device)
            if self.conv_kernel
            else None
        )
        return s, ctx

    def step(self, h_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One position: h_t [B, d] -> (out_t [B, d], new state); the state passed in is not modified."""
        if h_t.dim() != 2 or h_t.shape[-1] != self.d_model:
            raise ValueError(f"SelectiveSSM.step expects [batch, {self.d_model}], got {tuple(h_t.shape)}")
        s_prev, ctx = state
        if self.conv_kernel:
            y, ctx = causal_depthwise_conv1d_step(h_t, ctx, self.conv_weight, self.conv_bias)
            c = F.silu(y)
        else:
            c = h_t
        c = c.unsqueeze(1)
        f, u = self._gates(c)
        s = f[:, 0] * s_prev + u[:, 0]
        out = self._readout(s.unsqueeze(1), c, h_t.unsqueeze(1))[:, 0]
        return out, (s, ctx)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_state={self.d_state}, conv_kernel={self.conv_kernel}"
