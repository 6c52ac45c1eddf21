"""The DRM components of ``docs/drm.md`` sections 1 to 16 and U, one module or function each (the
velocity's composition, sections 3, 5 and U, is :mod:`~drmlab.models.drm.velocity`).

Shapes: ``N`` is any batch of states (batch, or batch x positions). Every module's
docstring names the section of that page it implements; its section A.3 gives the
widths and initialisations.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.layers.conv_context import trailing_context
from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step

from .config import DRMConfig
from .velocity import (  # noqa: F401 (re-exported)
    CHOLESKY_RETRY_MULTIPLIERS,
    DAMPING_FLOOR,
    METRIC_FIRST_COMPOSITIONS,
    compose_metric_first,
    damped_direction_gram,
    metric_first_frame,
    metric_orthonormal_frame,
    metric_subspace_frame,
    naturalize,
    raw_velocity,
)


def bound_state(z: torch.Tensor, radius: float, toroidal_dims: int = 0) -> torch.Tensor:
    """The bound operator B(z) = R tanh(z min(1, R / max(|z|, 1e-8)) / R) (sections 6 and A.3.8).

    A norm clip to radius R per state vector, then an element-wise soft clamp. Toroidal
    coordinates (the first ``toroidal_dims``) are angles and pass through unchanged.
    """
    if toroidal_dims:
        return torch.cat([z[..., :toroidal_dims], bound_state(z[..., toroidal_dims:], radius)], dim=-1)
    norm = z.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    clipped = z * torch.clamp(radius / norm, max=1.0)
    return radius * torch.tanh(clipped / radius)


def toroidal_lift(z: torch.Tensor, toroidal_dims: int) -> torch.Tensor:
    """Section 16: theta -> (cos theta, sin theta) for the first ``toroidal_dims`` coordinates."""
    if not toroidal_dims:
        return z
    angles = z[..., :toroidal_dims]
    return torch.cat([torch.cos(angles), torch.sin(angles), z[..., toroidal_dims:]], dim=-1)


class DRMStateInitializer(nn.Module):
    """Section 1: the learned initial state z_0, one row per sequence of the batch.

    The rows are a copy, not a stride-0 view: torch's matmul takes another kernel for a stride-0
    input depending on whether the weight requires grad (``should_fold``), so a view made the
    model's output differ in the last bits between a trainable and a frozen model."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.z0 = nn.Parameter(torch.randn(c.d_state) * 0.02)

    def forward(self, batch_size: int) -> torch.Tensor:
        return self.z0.unsqueeze(0).expand(batch_size, -1).contiguous()


def read_state(layer: nn.Linear, x: torch.Tensor, width: int | None) -> torch.Tensor:
    """layer(x) for a layer whose input is the state; with ``width``, x [..., width] holds the state's
    first coordinates only (the rest are zero) and meets the first ``width`` columns of the weight."""
    if width is None:
        return layer(x)
    return F.linear(x, layer.weight[:, :width], layer.bias)


def write_state(layer: nn.Linear, x: torch.Tensor, width: int | None) -> torch.Tensor:
    """layer(x) for a layer whose output is (an increment of) the state; with ``width``, only the
    first ``width`` outputs, the rows of the weight a prefix mask keeps (docs/variable-rank.md section 5)."""
    if width is None:
        return layer(x)
    return F.linear(x, layer.weight[:width], None if layer.bias is None else layer.bias[:width])


class GeometryTrunk(nn.Module):
    """q = GELU(W2 GELU(W1 z + b1) + b2): the shared shape of the direction and metric trunks."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.d_read, c.hidden_size)
        self.fc2 = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, z_read: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """``width``: z_read holds only the state's first ``width`` coordinates (the rest are zero;
        docs/variable-rank.md section 5), read with the matching columns of W1."""
        return F.gelu(self.fc2(F.gelu(read_state(self.fc1, z_read, width))))


class DirectionField(nn.Module):
    """Section 2: n directions V_i(z) and soft gates a_i(z) = sigmoid((l_i + bias) / temperature).

    With a basis, V = reshape(W_d q + b_d) Pi_d, so every direction lies in the row space
    of the learned basis Pi_d; each direction is optionally normalised to unit length.
    dimD(z) = sum_i a_i(z).
    """

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.n, self.d, self.p = c.n_directions, c.d_state, c.direction_basis_size
        self.normalize = c.direction_norm
        self.temperature, self.bias = c.gate_temperature, c.gate_logit_bias
        self.trunk = GeometryTrunk(c)
        width = self.n * (self.p if self.p else self.d)
        self.direction_head = nn.Linear(c.hidden_size, width)
        self.basis = nn.Parameter(torch.randn(self.p, self.d) * 0.02) if self.p else None
        self.gate_head = nn.Linear(c.hidden_size, self.n)

    def forward(self, z_read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.trunk(z_read)
        coeff = self.direction_head(q)
        if self.basis is not None:
            directions = coeff.view(*coeff.shape[:-1], self.n, self.p) @ self.basis
        else:
            directions = coeff.view(*coeff.shape[:-1], self.n, self.d)
        if self.normalize:
            directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        gates = torch.sigmoid((self.gate_head(q) + self.bias) / self.temperature)
        return directions, gates


class RelationalMetric(nn.Module):
    """Section 4: G(z) = diag(softplus(d(z)) + eps) + U(z) U(z)^T, returned as (gamma, U).

    U = (C_u Pi_u)^T / sqrt(r) with a basis, else the head's d x r output / sqrt(r). The diagonal
    follows ``metric_diagonal`` (``docs/geometry.md`` section 8): softplus(d) + eps (the default),
    softplus(d), max(d, 0) (exact zeros), or none at all (G = U U^T, no diagonal head).
    """

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.d, self.r, self.p, self.eps = c.d_state, c.metric_rank, c.metric_u_basis_size, c.metric_eps
        self.diagonal = c.metric_diagonal
        self.trunk = GeometryTrunk(c)
        self.diag_head = nn.Linear(c.hidden_size, self.d) if self.diagonal != "none" else None
        if self.r:
            self.u_head = nn.Linear(c.hidden_size, self.r * (self.p if self.p else self.d))
            self.basis = nn.Parameter(torch.randn(self.p, self.d) * 0.02) if self.p else None
        else:
            self.u_head, self.basis = None, None

    def forward(self, z_read: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(gamma, U) at full width; ``width``: z_read holds the state's first coordinates only."""
        q = self.trunk(z_read, width)
        if self.diagonal == "softplus_eps":
            gamma = F.softplus(self.diag_head(q)) + self.eps
        elif self.diagonal == "softplus":
            gamma = F.softplus(self.diag_head(q))
        elif self.diagonal == "relu":
            gamma = F.relu(self.diag_head(q))
        else:
            gamma = q.new_zeros(*q.shape[:-1], self.d)
        if self.u_head is None:
            return gamma, gamma.new_zeros(*gamma.shape, 0)
        coeff = self.u_head(q)
        if self.basis is not None:
            u = (coeff.view(*coeff.shape[:-1], self.r, self.p) @ self.basis).transpose(-1, -2)
        else:
            u = coeff.view(*coeff.shape[:-1], self.d, self.r)
        return gamma, u / math.sqrt(self.r)


class DRMFlow(nn.Module):
    """Section 3: coefficients c_i(z, e) = tanh(W4 GELU(W3 [z; e] + b3) + b4) in [-1, 1]^n.

    ``token_part(e)`` computes W3_e e once for all positions; ``forward`` adds the state part.
    """

    def __init__(self, c: DRMConfig, out_features: int | None = None):
        super().__init__()
        self.d_read = c.d_read
        self.fc1 = nn.Linear(c.d_read + c.d_token, c.hidden_size)
        self.fc2 = nn.Linear(c.hidden_size, c.n_directions if out_features is None else out_features)

    def token_part(self, e: torch.Tensor) -> torch.Tensor:
        return F.linear(e, self.fc1.weight[:, self.d_read :], self.fc1.bias)

    def forward(
        self, z_read: torch.Tensor, token_part: torch.Tensor, width: int | None = None, out_width: int | None = None
    ) -> torch.Tensor:
        """z_read [..., d_read] broadcast against token_part [..., L, H]. ``width``: z_read holds the
        state's first ``width`` coordinates only; ``out_width``: only the first outputs (the direct
        transition's kept coordinates, docs/variable-rank.md section 5)."""
        state_part = F.linear(z_read, self.fc1.weight[:, : self.d_read if width is None else width])
        return torch.tanh(write_state(self.fc2, F.gelu(state_part + token_part), out_width))


class DirectStateTransition(DRMFlow):
    """Section 3 (J_NO_DIRECTION): u = tanh(W6 GELU(W5 [z; e] + b5) + b6) in [-1, 1]^d_state."""

    def __init__(self, c: DRMConfig):
        super().__init__(c, out_features=c.d_state)


class RiskField(nn.Module):
    """Risk mass rho = min(alpha_b b^beta_b + alpha_d d^beta_d, 10) (section A.3.9).

    With ``enabled=False`` (every reference variant) it returns zeros and its weights get
    no gradient, exactly as the reference's dead risk field.
    """

    def __init__(self, c: DRMConfig, enabled: bool):
        super().__init__()
        self.enabled = enabled
        self.fc1 = nn.Linear(c.d_read, c.hidden_size)
        self.fc2 = nn.Linear(c.hidden_size, 2)
        self.alpha = nn.Parameter(torch.full((2,), 0.1))
        self.beta = nn.Parameter(torch.full((2,), 1.5))

    def forward(self, z_read: torch.Tensor, width: int | None = None) -> torch.Tensor:
        if not self.enabled:
            return z_read.new_zeros(z_read.shape[:-1])
        bd = torch.sigmoid(self.fc2(F.gelu(read_state(self.fc1, z_read, width))))
        alpha = self.alpha.clamp(-10.0, 10.0)
        beta = self.beta.abs().clamp(0.25, 4.0)
        return (alpha * bd.pow(beta)).sum(-1).clamp(max=10.0)


class CausalConvMixer(nn.Module):
    """Section 7: the causal depthwise-convolution mixer, applied per block.

    h0 = silu(W_in f + b); h_{l+1} = h_l + PW_l(silu(DWConv_l(h_l))) with left zero padding
    and dilation growth^l; output eta_mix (W_out h + b_out). The features f are
    [z~_t; z~_t - z~_{t-1}; delta_t; e_t; dimD; rho].
    """

    def __init__(self, c: DRMConfig):
        super().__init__()
        m, k = c.mixer_hidden, c.mixer_kernel
        self.d_state, self.scale = c.d_state, c.mixer_scale
        self.dilations = [c.mixer_dilation_growth**layer for layer in range(c.mixer_layers)]
        self.in_proj = nn.Linear(3 * c.d_state + c.d_token + 2, m)
        self.depthwise = nn.ModuleList(nn.Conv1d(m, m, k, groups=m) for _ in self.dilations)
        self.pointwise = nn.ModuleList(nn.Linear(m, m) for _ in self.dilations)
        self.out_proj = nn.Linear(m, c.d_state)

    def token_part(self, e: torch.Tensor) -> torch.Tensor:
        d = self.d_state
        return F.linear(e, self.in_proj.weight[:, 3 * d : -2], self.in_proj.bias)

    def state_weights(self, width: int | None = None) -> tuple[torch.Tensor, ...]:
        """The column blocks of W_in that multiply the states, diffs, deltas and (dimD, rho); with ``width``
        the first ``width`` columns of each state block (the state pieces hold that many coordinates)."""
        d, w = self.d_state, self.in_proj.weight
        n = d if width is None else width
        return w[:, :n], w[:, d : d + n], w[:, 2 * d : 2 * d + n], w[:, -2:]

    def input_features(
        self, states, diffs, deltas, scalars, token_part, weights=None, width: int | None = None
    ) -> torch.Tensor:
        """W_in f + b from its pieces: states/diffs/deltas [N, L, d], scalars [N, 2] (dimD, rho);
        ``weights``: :meth:`state_weights` (of the same ``width``), when the caller holds them for several
        blocks; with ``width`` the state pieces hold their first ``width`` coordinates only (the rest are zero)."""
        w_states, w_diffs, w_deltas, w_scalars = weights if weights is not None else self.state_weights(width)
        pre = token_part + F.linear(scalars, w_scalars).unsqueeze(-2)
        if states is not None:  # geometry-free paths have zero diffs and deltas
            pre = pre + F.linear(states.contiguous(), w_states)  # contiguous: see DRMStateInitializer
        if diffs is not None:
            pre = pre + F.linear(diffs, w_diffs) + F.linear(deltas, w_deltas)
        return F.silu(pre)

    def forward(self, h: torch.Tensor, return_state: bool = False, width: int | None = None):
        """h = silu(W_in f + b) [N, L, M] -> the residual correction eta_mix (W_out h_L + b); with
        ``return_state`` also each layer's left context after the last position (as ``step`` keeps it);
        ``width``: only the correction's first coordinates."""
        contexts = []
        for conv, point, dilation in zip(self.depthwise, self.pointwise, self.dilations):
            if return_state:
                contexts.append(trailing_context(h, dilation * (conv.kernel_size[0] - 1)))
            y = causal_depthwise_conv1d(h, conv.weight, conv.bias, dilation=dilation)
            h = h + point(F.silu(y))
        out = self.scale * write_state(self.out_proj, h, width)
        return (out, contexts) if return_state else out

    def step(
        self, h_t: torch.Tensor, contexts: list[torch.Tensor], width: int | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One position of ``forward``: h_t [N, M]; contexts hold each layer's left inputs."""
        new_contexts = []
        for conv, point, dilation, context in zip(self.depthwise, self.pointwise, self.dilations, contexts):
            y, context = causal_depthwise_conv1d_step(h_t, context, conv.weight, conv.bias, dilation=dilation)
            new_contexts.append(context)
            h_t = h_t + point(F.silu(y))
        return self.scale * write_state(self.out_proj, h_t, width), new_contexts


class TokenStateResidual(nn.Module):
    """Section 8: z' = z + eta_tok W_tok e (no bias)."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.scale = c.token_state_residual_scale
        self.proj = nn.Linear(c.d_token, c.d_state, bias=False)

    def forward(self, e: torch.Tensor, width: int | None = None) -> torch.Tensor:
        return self.scale * write_state(self.proj, e, width)


class SelectiveMemory(nn.Module):
    """Section 9: m_t = f_t * m_{t-1} + w_t * c_t from h_t = silu(W_h [z_{t-1}; e_t] + b_h).

    f = sigmoid(W_f h + b_f + forget_bias), w = sigmoid(W_w h + b_w), c = tanh(W_c h + b_c).
    ``gates`` returns (f, u = w * c) for all positions; the scan itself is
    ``drmlab.ops.linear_scan`` (associative, never dividing by cumulative products).
    Under a reduced-precision autocast the token part, the gates and the scan stay in float32
    (or wider): a forget gate rounded to bf16 (8 bits) would compound over the recurrence. With
    ``memory_products_in_autocast`` the matrix products follow the autocast (bf16 operands) and their
    outputs are widened to float32 before silu, sigmoid and tanh: the gates are still float32, computed
    from pre-activations with bf16's round-off (``docs/drm.md`` appendix A.4.7).
    """

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.d_read, self.forget_bias, self.scale = c.d_read, c.memory_forget_bias, c.memory_scale
        self.products_in_autocast = c.memory_products_in_autocast
        self.in_proj = nn.Linear(c.d_read + c.d_token, c.memory_hidden)
        self.forget = nn.Linear(c.memory_hidden, c.d_state)
        self.write = nn.Linear(c.memory_hidden, c.d_state)
        self.candidate = nn.Linear(c.memory_hidden, c.d_state)

    def _products(self, x: torch.Tensor):
        """Where the matrix products run: autocast switched off (float32 products), or left as it is
        (``memory_products_in_autocast``)."""
        if self.products_in_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=x.device.type, enabled=False)

    def token_part(self, e: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(e.dtype, torch.float32)
        with self._products(e):
            w = self.in_proj.weight[:, self.d_read :]
            return F.linear(e.to(dtype), w.to(dtype), self.in_proj.bias.to(dtype)).to(dtype)

    def state_weight(self, width: int | None = None) -> torch.Tensor:
        """The columns of W_h that multiply the previous state (its first ``width`` when given)."""
        return self.in_proj.weight[:, : self.d_read if width is None else width]

    def packed_gates(self, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The forget, write and candidate layers stacked into one (weight [3 w, H], bias [3 w]), the
        forget bias folded into the forget rows' bias; w = d_state, or ``width`` (their first rows)."""
        rows = slice(None) if width is None else slice(0, width)
        layers = (self.forget, self.write, self.candidate)
        weight = torch.cat([layer.weight[rows] for layer in layers])
        bias = torch.cat([self.forget.bias[rows] + self.forget_bias, self.write.bias[rows], self.candidate.bias[rows]])
        return weight, bias

    def gates(
        self,
        prev_read: torch.Tensor,
        token_part: torch.Tensor,
        state_weight: torch.Tensor | None = None,
        width: int | None = None,
        packed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f, u) [B, L, d_state] in float32 or wider, computed with autocast off; ``state_weight``:
        :meth:`state_weight` (of the same ``width``), when the caller holds it for several blocks; with
        ``width`` the previous states hold their first ``width`` coordinates only and f, u are [B, L, width].
        ``packed``: :meth:`packed_gates` (of the same ``width``): the three gate layers as one matrix
        product (the same function to round-off: the forget bias is added to b_f before, not after)."""
        dtype = torch.promote_types(torch.promote_types(prev_read.dtype, token_part.dtype), torch.float32)
        w_state = state_weight if state_weight is not None else self.state_weight(width)
        if packed is not None:
            with self._products(prev_read):
                h = F.silu(F.linear(prev_read.to(dtype), w_state.to(dtype)).to(dtype) + token_part.to(dtype))
                pre = F.linear(h, packed[0].to(dtype), packed[1].to(dtype)).to(dtype)
                pre_f, pre_w, pre_c = pre.chunk(3, dim=-1)
                return torch.sigmoid(pre_f), torch.sigmoid(pre_w) * torch.tanh(pre_c)

        def linear(x, layer):
            if width is not None:
                return F.linear(x, layer.weight[:width].to(dtype), layer.bias[:width].to(dtype)).to(dtype)
            return F.linear(x, layer.weight.to(dtype), layer.bias.to(dtype)).to(dtype)

        with self._products(prev_read):
            h = F.silu(F.linear(prev_read.to(dtype), w_state.to(dtype)).to(dtype) + token_part.to(dtype))
            f = torch.sigmoid(linear(h, self.forget) + self.forget_bias)
            u = torch.sigmoid(linear(h, self.write)) * torch.tanh(linear(h, self.candidate))
        return f, u


class RefinementLayer(nn.Module):
    """Variant G's second stage: its own direction field, metric and flow (section A.3.13).

    Each position is conditioned on the previous state: z_t <- B(z_t + eta dt Nat(u(z_{t-1}, e_t))).
    """

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.direction_field = DirectionField(c)
        self.metric = RelationalMetric(c)
        self.flow = DRMFlow(c)


class LanguageEmitter(nn.Module):
    """Section 10: logits = W_o GELU(W_e RMSNorm(z) + b_e) + b_o."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.norm = nn.RMSNorm(c.d_read, eps=1e-6)
        self.fc1 = nn.Linear(c.d_read, c.hidden_size)
        self.fc2 = nn.Linear(c.hidden_size, c.vocab_size)

    def forward(self, z_read: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """``width``: z_read holds the state's first ``width`` coordinates only (the rest are zero): the
        RMS still divides by d_read, and W_e meets its first ``width`` columns."""
        if width is None:
            return self.fc2(F.gelu(self.fc1(self.norm(z_read))))
        norm = self.norm
        mean_square = z_read.pow(2).sum(-1, keepdim=True) / norm.normalized_shape[0]
        normed = z_read * torch.rsqrt(mean_square + norm.eps) * norm.weight[:width]
        return self.fc2(F.gelu(read_state(self.fc1, normed, width)))
