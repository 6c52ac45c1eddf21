r"""The metric options of ``docs/geometry.md`` sections 8 and 9, and the naturalization each one uses.

* A degenerate relational metric (``metric_diagonal`` other than "softplus_eps"): the floor can vanish,
  so G(z) has a kernel; naturalization goes through the damped pseudo-inverse,
  v = (1 - s) u + s G^+_lambda u = (1 - s) u + s (G + lambda I)^{-1} (u - P_ker u)
  (:func:`naturalize_pseudo_inverse`, over ``drmlab.ops.pseudo_inverse_solve``).
* ``metric="pullback"``: G(z) = J^T (diag p - p p^T) J, J the Jacobian of the emitter's logits with
  respect to the state, in closed form through the emitter (:func:`emitter_jacobian`). It is handed
  on as gamma = 0 and U = B^T, B = diag(sqrt p)(J - 1 p^T J) [V, d] (``drmlab.ops.fisher_factor``),
  so G = U U^T exactly and every reader of (gamma, U) sees G_pb; naturalization is
  v = (1 - s) u + s (G_pb + lambda I)^{-1} u (:func:`naturalize_pullback`).
"""

from __future__ import annotations

import math

import torch

from drmlab.ops import fisher_factor, metric_dense, pseudo_inverse_solve

from .components import naturalize
from .config import DRMConfig


def _wide(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def naturalize_pseudo_inverse(
    u: torch.Tensor, gamma: torch.Tensor, u_factor: torch.Tensor, strength: float, damping: float
) -> torch.Tensor:
    """Section 8: v = (1 - s) u + s G^+_lambda u in float32 or wider, autocast off; shapes as ``naturalize``.
    With s <= 0 the input is returned exactly; where the floor is positive this is ``naturalize``'s value."""
    if strength <= 0:
        return u
    dtype = _wide(u)
    with torch.autocast(device_type=u.device.type, enabled=False):
        solved = pseudo_inverse_solve(gamma.to(dtype), u_factor.to(dtype), u.to(dtype), damping)
    return ((1.0 - strength) * u.to(dtype) + strength * solved).to(u.dtype)


def naturalize_pullback(
    u: torch.Tensor, gamma: torch.Tensor, u_factor: torch.Tensor, strength: float, damping: float
) -> torch.Tensor:
    """Section 9: v = (1 - s) u + s (G_pb + lambda I)^{-1} u with G_pb = diag(gamma) + U U^T, U [N, d, V].

    V < d: the Woodbury solve of ``naturalize`` (a V x V capacitance); otherwise one dense d x d
    Cholesky per sample. Float32 or wider, autocast off."""
    if strength <= 0:
        return u
    if u_factor.shape[-1] < u_factor.shape[-2]:
        return naturalize(u, gamma, u_factor, strength, damping)
    dtype = _wide(u)
    with torch.autocast(device_type=u.device.type, enabled=False):
        g = metric_dense(gamma.to(dtype), u_factor.to(dtype))
        g = g + damping * torch.eye(g.shape[-1], dtype=dtype, device=g.device)
        solved = torch.cholesky_solve(u.to(dtype).mT, torch.linalg.cholesky(g)).mT
    return ((1.0 - strength) * u.to(dtype) + strength * solved).to(u.dtype)


def naturalizer(config: DRMConfig):
    """The naturalization function of ``config``'s metric (``components.naturalize`` by default)."""
    if config.metric == "pullback":
        return naturalize_pullback
    if config.has_degenerate_metric:
        return naturalize_pseudo_inverse
    return naturalize


def _gelu_derivative(x: torch.Tensor) -> torch.Tensor:
    """d/dx of the exact GELU x Phi(x): Phi(x) + x phi(x)."""
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def emitter_jacobian(emitter, z_read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, V], d logits / d z_read [N, V, D]) of ``LanguageEmitter`` W_o GELU(W_e RMSNorm(x) + b_e) + b_o
    at x = z_read [N, D], in closed form, with the emitter's parameters in z_read's dtype:

        d RMSNorm / dx = diag(w) (I / rho - x x^T / (D rho^3)),   rho = sqrt(mean(x^2) + eps),
        J = W_o diag(GELU'(a)) W_e d RMSNorm / dx,                 a = W_e RMSNorm(x) + b_e.
    """
    norm, fc1, fc2 = emitter.norm, emitter.fc1, emitter.fc2
    dtype, width = z_read.dtype, z_read.shape[-1]
    eps = norm.eps if norm.eps is not None else torch.finfo(dtype).eps
    weight = norm.weight.to(dtype) if norm.weight is not None else torch.ones_like(z_read[0])
    w1, b1, w2, b2 = (t.to(dtype) for t in (fc1.weight, fc1.bias, fc2.weight, fc2.bias))
    rho = torch.sqrt(z_read.pow(2).mean(-1, keepdim=True) + eps)  # [N, 1]
    a = torch.nn.functional.linear(z_read / rho * weight, w1, b1)  # [N, H]
    logits = torch.nn.functional.linear(torch.nn.functional.gelu(a), w2, b2)
    scaled = w1 * weight  # W_e diag(w) [H, D]
    pre = scaled / rho.unsqueeze(-1) - (z_read @ scaled.mT).unsqueeze(-1) * z_read.unsqueeze(-2) / (
        width * rho.pow(3).unsqueeze(-1)
    )  # d a / dx [N, H, D]
    return logits, w2 @ (_gelu_derivative(a).unsqueeze(-1) * pre)


def lift_jacobian_apply(jac_read: torch.Tensor, z_read: torch.Tensor, toroidal_dims: int) -> torch.Tensor:
    """J d z_read / d z [..., V, d] for the toroidal lift z_read = (cos theta, sin theta, rest) (section 16),
    from J = d / d z_read [..., V, d + k] and z_read itself (d cos / d theta = -sin, d sin / d theta = cos)."""
    k = toroidal_dims
    if not k:
        return jac_read
    cos, sin = z_read[..., :k].unsqueeze(-2), z_read[..., k : 2 * k].unsqueeze(-2)
    angles = jac_read[..., :k] * (-sin) + jac_read[..., k : 2 * k] * cos
    return torch.cat([angles, jac_read[..., 2 * k :]], dim=-1)


class PullbackMetric:
    """Section 9: z_read [N..., D] -> (gamma = 0 [N..., d], U = B^T [N..., d, V]) with U U^T = J^T F J at
    the state, J the Jacobian of the emitter's logits with respect to the state (not its read-out).

    Not an ``nn.Module``: the emitter stays the model's, so its parameters keep their one name. Computed in
    float32 or wider with autocast off."""

    def __init__(self, emitter, config: DRMConfig):
        self.emitter, self.toroidal_dims = emitter, config.toroidal_dims

    def __call__(self, z_read: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``width``: z_read holds the state's first ``width`` coordinates only (the sliced variable rank,
        ``docs/variable-rank.md`` section 5); the rest are zero, and the emitter reads the full width."""
        if width is not None:
            z_read = torch.nn.functional.pad(z_read, (0, self.emitter.norm.normalized_shape[0] - z_read.shape[-1]))
        lead = z_read.shape[:-1]
        with torch.autocast(device_type=z_read.device.type, enabled=False):
            x = z_read.reshape(-1, z_read.shape[-1]).to(_wide(z_read))
            logits, jac = emitter_jacobian(self.emitter, x)
            factor = fisher_factor(lift_jacobian_apply(jac, x, self.toroidal_dims), logits)  # [N, V, d]
        u = factor.mT.reshape(*lead, factor.shape[-1], factor.shape[-2])
        return u.new_zeros(*lead, u.shape[-2]), u
