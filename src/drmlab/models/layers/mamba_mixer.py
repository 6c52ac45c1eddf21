r"""Mamba's selective-SSM mixer (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", section 3.4 and figure 3), used by the MAMBA language model and by LOOPED's
``ssm_variant="mamba"`` blocks:

    [x, z]    = in_proj(h)                                (2 * d_inner channels, d_inner = expand * d)
    x         = silu(causal_depthwise_conv1d(x))          (kernel d_conv, left padding only; d_conv = 0: no conv)
    [r, B, C] = x_proj(x)                                 (dt_rank + 2 * d_state)
    dt        = softplus(dt_proj(r))                      (input-dependent step size, [B, T, d_inner])
    A         = -exp(A_log)                               ([d_inner, d_state], input-independent)
    h_t       = exp(dt_t A) * h_{t-1} + dt_t B_t x_t      (per channel e and state n)
    y_t       = C_t . h_t + D x_t
    out       = out_proj(y * silu(z))

Parameter names are Hugging Face's ``MambaMixer`` (``in_proj``, ``conv1d``, ``x_proj``, ``dt_proj``,
``A_log``, ``D``, ``out_proj``). The scan is :func:`drmlab.ops.selective_scan` (exact: no division by
cumulative gate products); ``scan_chunk`` and ``scan_recompute`` tune its off-CPU path only.

Decoding state (:class:`MambaMixerState`): the last ``d_conv - 1`` conv inputs and the
[B, d_inner, d_state] SSM state; ``forward(h, return_state=True)`` returns the state after h.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step, selective_scan

from .conv_context import trailing_context


class MambaMixerState(NamedTuple):
    """conv: the last d_conv - 1 conv inputs [B, d_conv - 1, d_inner]; ssm: [B, d_inner, d_state]."""

    conv: torch.Tensor
    ssm: torch.Tensor


def default_dt_rank(d_model: int) -> int:
    """Mamba's "auto" step-size rank, ceil(d_model / 16)."""
    return math.ceil(d_model / 16)


def mamba_mixer_parameter_count(
    d_model: int,
    d_state: int,
    d_conv: int = 4,
    expand: int = 2,
    dt_rank: int = 0,
    bias: bool = False,
    conv_bias: bool = True,
) -> int:
    """The closed-form parameter count of ``MambaMixer`` with these settings (no module is built)."""
    d, e, n, r = d_model, expand * d_model, d_state, dt_rank or default_dt_rank(d_model)
    return (
        d * 2 * e
        + (2 * e if bias else 0)  # in_proj
        + (e * d_conv + (e if conv_bias else 0) if d_conv else 0)  # conv1d
        + e * (r + 2 * n)  # x_proj
        + r * e
        + e  # dt_proj
        + e * n
        + e  # A_log, D
        + e * d
        + (d if bias else 0)
    )  # out_proj


class MambaMixer(nn.Module):
    """h [B, T, d_model] -> [B, T, d_model]; see the module docstring.

    Initialisation: the projections and the conv keep torch's defaults (an owning model may
    re-draw them); :meth:`reset_parameters` sets Mamba's own: dt_proj's weight U(±dt_scale/√r)
    (or that constant), its bias softplus⁻¹ of a log-uniform step in [dt_min, dt_max] (floored at
    dt_init_floor), A_log = log(1..d_state) per channel (S4D-real) and D = 1.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int = 0,
        bias: bool = False,
        conv_bias: bool = True,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init: str = "random",
        dt_scale: float = 1.0,
        dt_init_floor: float = 1e-4,
        scan_chunk: int = 0,
        scan_recompute: bool = False,
    ):
        super().__init__()
        e, n, r = expand * d_model, d_state, dt_rank or default_dt_rank(d_model)
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = e, n, d_conv, r
        self.dt_min, self.dt_max, self.dt_init, self.dt_scale, self.dt_init_floor = (
            dt_min,
            dt_max,
            dt_init,
            dt_scale,
            dt_init_floor,
        )
        self.scan_chunk, self.scan_recompute = scan_chunk, scan_recompute
        self.in_proj = nn.Linear(d_model, 2 * e, bias=bias)
        self.conv1d = nn.Conv1d(e, e, d_conv, groups=e, bias=conv_bias, padding=d_conv - 1) if d_conv else None
        self.x_proj = nn.Linear(e, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, e, bias=True)
        self.A_log = nn.Parameter(torch.empty(e, n))
        self.D = nn.Parameter(torch.empty(e))
        self.out_proj = nn.Linear(e, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Mamba's initialisation of the step size, A and D (the class docstring)."""
        e = self.d_inner
        with torch.no_grad():
            std = self.dt_rank**-0.5 * self.dt_scale
            if self.dt_init == "constant":
                nn.init.constant_(self.dt_proj.weight, std)
            else:
                nn.init.uniform_(self.dt_proj.weight, -std, std)
            log_min, log_max = math.log(self.dt_min), math.log(self.dt_max)
            dt = torch.exp(torch.rand(e, device=self.D.device) * (log_max - log_min) + log_min)
            dt = dt.clamp(min=self.dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            rates = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=self.D.device)
            self.A_log.copy_(torch.log(rates).repeat(e, 1))
            self.D.fill_(1.0)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        """The conv and its SiLU (identity without a conv), for x [B, T, d_inner]."""
        if self.conv1d is None:
            return x
        return F.silu(causal_depthwise_conv1d(x, self.conv1d.weight, self.conv1d.bias))

    def _project(self, x: torch.Tensor):
        """(dt, B, C) from the conv output x, in float32 or wider with autocast off: they set the
        scan's decay exp(dt A) and drive (dt x) B, which a bf16 autocast would round (the scan
        itself always accumulates in float32)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            bias = self.x_proj.bias
            projected = F.linear(x.to(dtype), self.x_proj.weight.to(dtype), None if bias is None else bias.to(dtype))
            r, b_t, c_t = torch.split(projected, [self.dt_rank, self.d_state, self.d_state], dim=-1)
            dt = F.softplus(F.linear(r, self.dt_proj.weight.to(dtype), self.dt_proj.bias.to(dtype)))
        return dt, b_t, c_t

    def forward(self, h: torch.Tensor, return_state: bool = False):
        """h [B, T, d_model] -> [B, T, d_model]; with ``return_state`` also the state after h."""
        x_in, z = self.in_proj(h).chunk(2, dim=-1)
        x = self._conv(x_in)
        dt, b_t, c_t = self._project(x)
        y, last = selective_scan(
            x.to(dt.dtype),
            dt,
            -torch.exp(self.A_log.to(dt.dtype)),
            b_t,
            c_t,
            chunk=self.scan_chunk,
            recompute=self.scan_recompute,
        )
        y = y.to(x.dtype) + x * self.D.to(x.dtype)
        out = self.out_proj(y * F.silu(z))
        if not return_state:
            return out
        return out, MambaMixerState(trailing_context(x_in, max(0, self.d_conv - 1)), last)

    def init_state(self, batch_size: int, dtype: torch.dtype | None = None, device=None) -> MambaMixerState:
        ref = self.D
        dtype, device = dtype or ref.dtype, device or ref.device
        return MambaMixerState(
            torch.zeros(batch_size, max(0, self.d_conv - 1), self.d_inner, dtype=dtype, device=device),
            torch.zeros(batch_size, self.d_inner, self.d_state, dtype=dtype, device=device),
        )

    def step(self, h_t: torch.Tensor, state: MambaMixerState) -> tuple[torch.Tensor, MambaMixerState]:
        """One token h_t [B, d_model] -> (out [B, d_model], the new state); ``state`` is not modified."""
        x, z = self.in_proj(h_t).chunk(2, dim=-1)
        conv = state.conv
        if self.conv1d is not None:
            x, conv = causal_depthwise_conv1d_step(x, conv, self.conv1d.weight, self.conv1d.bias)
            x = F.silu(x)
        dt, b_t, c_t = self._project(x)
        ssm = torch.exp(dt.unsqueeze(-1) * -torch.exp(self.A_log)) * state.ssm + (dt * x).unsqueeze(-1) * b_t.unsqueeze(
            1
        )
        y = torch.bmm(ssm, c_t.unsqueeze(-1)).squeeze(-1) + x * self.D.to(x.dtype)
        return self.out_proj(y * F.silu(z)), MambaMixerState(conv, ssm)
