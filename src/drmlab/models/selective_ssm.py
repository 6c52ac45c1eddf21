r"""The selective state-space mixer of the looped study (notes/looped-study.md §2, proof 5).

Two variants share one module, :class:`SelectiveSSM`, mapping ``h`` [B, T, d] -> [B, T, d]:

``variant="s6"`` -- the study's minimal S6-style mixer (one n-vector of state per sequence):

    c_t = SiLU(conv(h)_t)          (causal depthwise conv, kernel K, with bias; c = h when K = 0)
    δ_t = softplus(w_δ · c_t + b_δ)                    one scalar per token   [B, T, 1]
    s_t = exp(-softplus(a) δ_t) ⊙ s_{t-1} + δ_t (W_B c_t),   s_{-1} = 0       [B, T, n]
    y_t = W_C s_t + D ⊙ c_t
    out_t = W_out (y_t ⊙ SiLU(W_g h_t))                (the gate reads the un-convolved input)

``conv_kernel=0`` is the study's round-6/8 mixer (arms MA, MB, MC, MB4, MC4), ``conv_kernel=4``
its "conv-upgraded" round-11 mixer (MA768 ... HE768). Parameters: ``2d² + 2dn + 2d + n + 1``
plus ``(K + 1) d`` for the conv.

``variant="mamba"`` -- a Mamba-like mixer with a per-channel step size and a d x n state:

    [δ̃_t, B_t, C_t] = W_x c_t                          (δ̃: rank R = ceil(d/16); B_t, C_t ∈ R^n)
    δ_t = softplus(W_dt δ̃_t + b_dt)                   one step per channel   [B, T, d]
    s_{t,c,i} = exp(-softplus(a_{c,i}) δ_{t,c}) s_{t-1,c,i} + δ_{t,c} c_{t,c} B_{t,i}
    y_{t,c} = Σ_i C_{t,i} s_{t,c,i} + D_c c_{t,c};     out_t as above

(no expansion: the inner width is d). Mamba's initialisation: softplus(a_{c,i}) = i + 1
(S4D-real), δ's bias such that softplus(b_dt) is log-uniform in [1e-3, 0.1], D = 1.

The state update is :func:`drmlab.ops.linear_scan` on the flattened state (n or d·n channels):
the exact sequential recurrence, forward and backward. The study evaluated it in log space as
``e^{Λ_t} cumsum(u_k e^{-Λ_k})`` with ``Λ`` clamped at -30, which turns every channel into a
pure integrator once its cumulative decay passes 30 nats (§2.2); nothing here divides by a
cumulative decay, so any length and any decay rate are exact. Under reduced-precision autocast
δ, the decay, the scan input and the scan run in float32 (as in the study); the state is cast
back to the input dtype before the read-out.

Incremental decoding: :meth:`SelectiveSSM.init_state` / :meth:`SelectiveSSM.step` carry the
state s and the conv's last K - 1 inputs (O(1) per token); stepping a sequence reproduces the
parallel forward.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step, linear_scan

__all__ = ["SelectiveSSM", "SSM_VARIANTS", "ssm_parameter_count"]

SSM_VARIANTS = ("s6", "mamba")


def default_dt_rank(d_model: int) -> int:
    return max(1, math.ceil(d_model / 16))


def ssm_parameter_count(d_model: int, d_state: int, conv_kernel: int = 4, variant: str = "s6",
                        dt_rank: int | None = None) -> int:
    """The exact parameter count of ``SelectiveSSM(d_model, d_state, conv_kernel, variant)``."""
    d, n = d_model, d_state
    conv = (conv_kernel + 1) * d if conv_kernel else 0
    if variant == "s6":
        return 2 * d * d + 2 * d * n + 2 * d + n + 1 + conv
    r = dt_rank or default_dt_rank(d)
    return 2 * d * d + d * (r + 2 * n) + (r + 1) * d + d * n + d + conv


def _no_autocast(x: torch.Tensor):
    """Disable autocast for x's device type (so the gates and the scan keep float32)."""
    try:
        return torch.autocast(x.device.type, enabled=False)
    except RuntimeError:  # a device type without autocast support
        return nullcontext()


class SelectiveSSM(nn.Module):
    """The selective SSM mixer (see the module docstring); ``forward(h [B, T, d]) -> [B, T, d]``."""

    def __init__(self, d_model: int, d_state: int = 16, conv_kernel: int = 4, variant: str = "s6",
                 dt_rank: int | None = None, init_std: float = 0.02):
        super().__init__()
        for field, value in (("d_model", d_model), ("d_state", d_state)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if not isinstance(conv_kernel, int) or isinstance(conv_kernel, bool) or conv_kernel < 0:
            raise ValueError(f"conv_kernel must be a non-negative integer (0 = no conv), got {conv_kernel!r}")
        if variant not in SSM_VARIANTS:
            raise ValueError(f"variant must be one of {SSM_VARIANTS}, got {variant!r}")
        if dt_rank is not None and (not isinstance(dt_rank, int) or dt_rank <= 0):
            raise ValueError(f"dt_rank must be a positive integer or None, got {dt_rank!r}")
        d, n = d_model, d_state
        self.d_model, self.d_state, self.conv_kernel, self.variant = d, n, conv_kernel, variant
        self.init_std = init_std
        if conv_kernel:
            self.conv_weight = nn.Parameter(torch.empty(d, 1, conv_kernel))
            self.conv_bias = nn.Parameter(torch.empty(d))
        else:
            self.register_parameter("conv_weight", None)
            self.register_parameter("conv_bias", None)
        if variant == "s6":
            self.dt_rank = None
            self.w_delta = nn.Linear(d, 1)  # w_δ, b_δ
            self.a = nn.Parameter(torch.empty(n))
            self.w_b = nn.Linear(d, n, bias=False)
            self.w_c = nn.Linear(n, d, bias=False)
        else:
            self.dt_rank = dt_rank or default_dt_rank(d)
            self.x_proj = nn.Linear(d, self.dt_rank + 2 * n, bias=False)
            self.dt_proj = nn.Linear(self.dt_rank, d)
            self.a = nn.Parameter(torch.empty(d, n))
        self.d_skip = nn.Parameter(torch.empty(d))  # D
        self.w_gate = nn.Linear(d, d, bias=False)  # W_g
        self.w_out = nn.Linear(d, d, bias=False)  # W_out (a "write-back" matrix)
        self.reset_parameters()

    @property
    def state_size(self) -> int:
        """Channels of the recurrent state: n (s6) or d * n (mamba)."""
        return self.d_state if self.variant == "s6" else self.d_model * self.d_state

    def reset_parameters(self) -> None:
        """The study's init (s6): Linear weights N(0, init_std²), biases 0, a = 0, D = 0, the conv
        at torch's Conv1d default U(±1/√K); mamba: the same Linears, Mamba's a, δ-bias and D = 1."""
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
            if self.variant == "s6":
                self.a.zero_()
                self.d_skip.zero_()
            else:
                rates = torch.arange(1, self.d_state + 1, dtype=torch.float64, device=self.a.device)
                self.a.copy_(torch.log(torch.expm1(rates)).to(self.a.dtype).expand_as(self.a))
                nn.init.uniform_(self.dt_proj.weight, -self.dt_rank ** -0.5, self.dt_rank ** -0.5)
                u = torch.rand(self.d_model, dtype=torch.float64, device=self.a.device)
                dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                self.dt_proj.bias.copy_((dt + torch.log(-torch.expm1(-dt))).to(self.dt_proj.bias.dtype))
                self.d_skip.fill_(1.0)

    # ------------------------------------------------------------------ pieces
    def _activate(self, conv_out: torch.Tensor) -> torch.Tensor:
        return F.silu(conv_out)

    def _gates(self, c: torch.Tensor):
        """(decay f, scan input u, read-out matrix C_t or None); f and u are [B, T, state_size]
        in float32 or wider, computed with autocast off."""
        sdt = torch.promote_types(c.dtype, torch.float32)
        with _no_autocast(c):
            cs = c.to(sdt)
            if self.variant == "s6":
                delta = F.softplus(F.linear(cs, self.w_delta.weight.to(sdt), self.w_delta.bias.to(sdt)))  # [B,T,1]
                rate = F.softplus(self.a.to(sdt))  # [n]
                f = torch.exp(-delta * rate)
                u = delta * F.linear(cs, self.w_b.weight.to(sdt))
                return f, u, None
            r, n = self.dt_rank, self.d_state
            proj = F.linear(cs, self.x_proj.weight.to(sdt))
            dt_low, b_t, c_t = proj.split([r, n, n], dim=-1)
            delta = F.softplus(F.linear(dt_low, self.dt_proj.weight.to(sdt), self.dt_proj.bias.to(sdt)))  # [B,T,d]
            rate = F.softplus(self.a.to(sdt))  # [d, n]
            f = torch.exp(-delta.unsqueeze(-1) * rate)  # [B,T,d,n]
            u = (delta * cs).unsqueeze(-1) * b_t.unsqueeze(-2)  # [B,T,d,n]
            return f.flatten(-2), u.flatten(-2), c_t

    def _readout(self, s: torch.Tensor, c: torch.Tensor, c_t, gate_in: torch.Tensor) -> torch.Tensor:
        """y = read-out of the states s [B, T, state_size] plus the skip; then gate and project."""
        if self.variant == "s6":
            y = self.w_c(s.to(c.dtype))
        else:
            s4 = s.unflatten(-1, (self.d_model, self.d_state))
            y = (s4 * c_t.unsqueeze(-2)).sum(-1).to(c.dtype)
        y = y + self.d_skip * c
        return self.w_out(y * F.silu(self.w_gate(gate_in)))

    # ------------------------------------------------------------------ forward
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, T, d] -> [B, T, d], causal (output t depends on h_0..h_t only)."""
        if h.dim() != 3 or h.shape[-1] != self.d_model:
            raise ValueError(f"SelectiveSSM expects [batch, time, {self.d_model}], got {tuple(h.shape)}")
        c = self._activate(causal_depthwise_conv1d(h, self.conv_weight, self.conv_bias)) if self.conv_kernel else h
        f, u, c_t = self._gates(c)
        s = linear_scan(f, u)
        return self._readout(s, c, c_t, h)

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, dtype: torch.dtype | None = None, device=None) -> tuple:
        """(s [B, state_size] zeros, conv context [B, K - 1, d] zeros or None)."""
        ref = self.w_out.weight
        dtype, device = dtype or ref.dtype, device or ref.device
        s = torch.zeros(batch_size, self.state_size, dtype=torch.promote_types(dtype, torch.float32), device=device)
        ctx = torch.zeros(batch_size, self.conv_kernel - 1, self.d_model, dtype=dtype, device=device) \
            if self.conv_kernel else None
        return s, ctx

    def step(self, h_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One position: h_t [B, d] -> (out_t [B, d], new state); the state passed in is not modified."""
        if h_t.dim() != 2 or h_t.shape[-1] != self.d_model:
            raise ValueError(f"SelectiveSSM.step expects [batch, {self.d_model}], got {tuple(h_t.shape)}")
        s_prev, ctx = state
        if self.conv_kernel:
            y, ctx = causal_depthwise_conv1d_step(h_t, ctx, self.conv_weight, self.conv_bias)
            c = self._activate(y)
        else:
            c = h_t
        c = c.unsqueeze(1)
        f, u, c_t = self._gates(c)
        s = f[:, 0] * s_prev + u[:, 0]
        out = self._readout(s.unsqueeze(1), c, c_t, h_t.unsqueeze(1))[:, 0]
        return out, (s, ctx)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, conv_kernel={self.conv_kernel}, "
                f"variant={self.variant!r}")
