"""The optional DRM solver paths of ``docs/drm.md`` section 14 (in detail: its appendix S).

* step modes: the one-token transition from a state z with the geometry at z,
  ``candidate`` (a softmax mix of per-direction candidate endpoints scored by metric
  energy, risk and distance to the Euler anchor, section S.1) and
  ``geodesic`` (K gradient steps on the local energy
  E(y) = l_a |y - z^a|^2 + l_m E_G((y - z)/dt) + l_r rho(y), section S.2);
* block refiners of the within-block states X with Phi(X)_t = F(X_{t-1}, e_t):
  the fixed-point iteration X <- X + w (Phi(X) - X) (section S.3.3) and Anderson
  acceleration (section S.3.4) in its causal form (prefix Gram matrices per batch row
  and position) and, for comparison only, its global form;
* the reference's endpoint correction (section S.3.1), kept only to pin its leak in a
  test: the model refuses it.

None of these is a geodesic solver in the formal sense (section 14): a low
energy or action is a diagnostic, not a proof.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


def metric_apply(x: torch.Tensor, gamma: torch.Tensor | None, u_factor: torch.Tensor | None) -> torch.Tensor:
    """G x = gamma * x + U (U^T x) with x [N..., L, d], gamma [N..., d], U [N..., d, r]; G = I without a metric."""
    if gamma is None:
        return x
    out = gamma.unsqueeze(-2) * x
    if u_factor is not None and u_factor.shape[-1]:
        out = out + (x @ u_factor) @ u_factor.transpose(-1, -2)
    return out


def candidate_step(transition, z, anchor, geometry) -> torch.Tensor:
    """Section S.1: z' = sum_i softmax(s / tau)_i y_i with y_i = B(z^a + dt c a_i V_i).

    ``transition``: the model's :class:`~drmlab.models.drm.transition.Transition` (config, bound,
    read, risk); z [N..., 1, d] the start state, anchor [N..., L, d] the Euler anchors z^a for L
    tokens, geometry at z. Returns [N..., L, d] (not re-bounded: a convex combination of points in the ball).
    """
    c = transition.config
    gates, directions, gamma, u_factor, _ = geometry
    push = (c.dt * c.candidate_scale) * gates.unsqueeze(-1) * directions  # [N..., n, d]
    y = transition.bound(anchor.unsqueeze(-2) + push.unsqueeze(-3))  # [N..., L, n, d]
    w = (y - z.unsqueeze(-2)) / c.dt
    if gamma is None:
        energy = w.pow(2).sum(-1)
    else:
        energy = (gamma.unsqueeze(-2).unsqueeze(-2) * w.pow(2)).sum(-1)
        if u_factor.shape[-1]:
            energy = energy + (w @ u_factor.unsqueeze(-3)).pow(2).sum(-1)
    score = -(c.geodesic_metric_weight * energy + c.geodesic_anchor_weight * (y - anchor.unsqueeze(-2)).pow(2).sum(-1))
    if transition.risk is not None and transition.risk.enabled:
        score = score - c.geodesic_risk_weight * transition.risk(transition.read(y))
    weights = torch.softmax(score / c.candidate_temperature, dim=-1)  # over the n candidates
    return (weights.unsqueeze(-1) * y).sum(-2)


def geodesic_step(transition, z, anchor, geometry) -> torch.Tensor:
    """Section S.2: from y = z^a, K times y <- B(y - eta grad E(y)) with
    grad E = 2 l_a (y - z^a) + (2 l_m / dt^2) G (y - z) + l_r grad rho(y); G from the start state z.

    The gradient is written in closed form (autograd only for an enabled risk field), so the
    iteration is differentiated through like any other layer.
    """
    c = transition.config
    _, _, gamma, u_factor, _ = geometry
    y = anchor
    risk_on = transition.risk is not None and transition.risk.enabled
    for _ in range(c.geodesic_steps):
        grad = 2 * c.geodesic_anchor_weight * (y - anchor)
        grad = grad + (2 * c.geodesic_metric_weight / c.dt**2) * metric_apply(y - z, gamma, u_factor)
        if risk_on:
            with torch.enable_grad():
                probe = y if y.requires_grad else y.detach().requires_grad_(True)
                (risk_grad,) = torch.autograd.grad(
                    transition.risk(transition.read(probe)).sum(), probe, create_graph=torch.is_grad_enabled()
                )
            grad = grad + c.geodesic_risk_weight * risk_grad
        y = transition.bound(y - c.geodesic_lr * grad)
    return y


Phi = Callable[[torch.Tensor], torch.Tensor]


class BlockSolution(NamedTuple):
    """A block refiner's result: X after K iterations, the last residual norm |Phi(X) - X| [B, L],
    and every iterate X_k entering iteration k with its residual R_k = Phi(X_k) - X_k (k < K),
    from which incremental decoding continues the block."""

    x: torch.Tensor
    residual: torch.Tensor
    iterates: list
    residuals: list


def fixed_point(phi: Phi, x: torch.Tensor, iterations: int, relaxation: float = 1.0) -> BlockSolution:
    """Section S.3.3: K times X <- X + w (Phi(X) - X)."""
    residual = x.new_zeros(x.shape[:-1])
    iterates, residuals = [], []
    for _ in range(iterations):
        r = phi(x) - x
        iterates.append(x)
        residuals.append(r)
        residual = r.norm(dim=-1)
        x = x + relaxation * r
    return BlockSolution(x, residual, iterates, residuals)


def _anderson_weights(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    """c = (Gamma + ridge I)^-1 1 / (1^T (Gamma + ridge I)^-1 1); left unnormalised when |den| < 1e-8."""
    h = gram.shape[-1]
    dtype = torch.promote_types(gram.dtype, torch.float32)
    with torch.autocast(device_type=gram.device.type, enabled=False):
        system = gram.to(dtype) + ridge * torch.eye(h, dtype=dtype, device=gram.device)
        coeff = torch.linalg.solve(system, torch.ones(*gram.shape[:-1], 1, dtype=dtype, device=gram.device))[..., 0]
        den = coeff.sum(-1, keepdim=True)
        safe = torch.where(den.abs() < 1e-8, torch.ones_like(den), den)
        return (coeff / safe).to(gram.dtype)


def anderson(
    phi: Phi,
    x: torch.Tensor,
    iterations: int,
    history: int = 4,
    ridge: float = 1e-4,
    relaxation: float = 1.0,
    causal: bool = True,
) -> BlockSolution:
    """Section S.3.4: Anderson acceleration of X = Phi(X) over a block x [B, L, d].

    causal: per row b and position t, Gamma_{b,t} = sum_{tau <= t} [R_i . R_j] + ridge I, so
    position t never reads a later position and no row reads another. Global (comparison
    only): one Gamma summed over batch, time and features -- every position then depends on
    future tokens and on the other rows. The first iteration is a Picard step.
    """
    fs, rs = [], []
    iterates, residuals = [], []
    residual = x.new_zeros(x.shape[:-1])
    for _ in range(iterations):
        f = phi(x)
        r = f - x
        iterates.append(x)
        residuals.append(r)
        residual = r.norm(dim=-1)
        fs, rs = (fs + [f])[-history:], (rs + [r])[-history:]
        if len(rs) < 2:
            x = x + relaxation * r
            continue
        stacked_r = torch.stack(rs, dim=-2)  # [B, L, h, d]
        stacked_f = torch.stack(fs, dim=-2)
        if causal:
            gram = (stacked_r @ stacked_r.transpose(-1, -2)).cumsum(dim=1)  # [B, L, h, h]
        else:
            gram = torch.einsum("blid,bljd->ij", stacked_r, stacked_r)
        weights = _anderson_weights(gram, ridge)  # [B, L, h] or [h]
        mixed = (weights.unsqueeze(-1) * stacked_f).sum(-2)
        x = x + relaxation * (mixed - x)
    return BlockSolution(x, residual, iterates, residuals)


def reference_endpoint_correction(
    states: torch.Tensor, endpoint_target: torch.Tensor, weight: float, power: float, bound
) -> torch.Tensor:
    """Section S.3.1, the reference's endpoint correction -- NOT causal, never used by the model.

    z~_j <- B(z~_j + w (j / L)^p Delta) with Delta = F(z~_{L-1}, e_L) - z~_L: every earlier
    position is moved by a term that depends on the block's last token. Kept so that a test
    can pin the leak; ``DRMConfig`` refuses ``endpoint_correction_weight > 0``.
    """
    length = states.shape[1]
    delta = endpoint_target - states[:, -1]
    ramp = (torch.arange(1, length + 1, dtype=states.dtype, device=states.device) / length) ** power
    return bound(states + weight * ramp.view(1, -1, 1) * delta.unsqueeze(1))
