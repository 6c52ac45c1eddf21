"""The velocity of the DRM transition from its directions and metric (``docs/drm.md``): the raw velocity
v_raw = sum_i a_i c_i V_i (section 3), its naturalization (G + lambda I)^-1 (section 5), and the
metric-first compositions that re-weight the directions inside their span instead (section U)."""

from __future__ import annotations

import torch

from drmlab.ops import coupling_matrix, woodbury_solve


def raw_velocity(gates: torch.Tensor, coeff: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Section 3: v_raw = sum_i a_i c_i V_i. gates [N, n], coeff [N, L, n], directions [N, n, d]."""
    return (coeff * gates.unsqueeze(-2)) @ directions


def naturalize(
    u: torch.Tensor, gamma: torch.Tensor, u_factor: torch.Tensor, strength: float, damping: float
) -> torch.Tensor:
    """Section 5: v = (1 - s) u + s (G + lambda I)^-1 u, solved with Woodbury in float32 or wider.

    u [N, L, d]; gamma [N, d]; u_factor [N, d, r]. With s <= 0 the input is returned exactly.
    """
    if strength <= 0:
        return u
    dtype = torch.promote_types(u.dtype, torch.float32)
    with torch.autocast(device_type=u.device.type, enabled=False):
        solved = woodbury_solve(gamma.to(dtype), u_factor.to(dtype), u.to(dtype), damping=damping)
    return ((1.0 - strength) * u.to(dtype) + strength * solved).to(u.dtype)


# ---------------------------------------------------------------------------------------
# The metric-first compositions (``docs/drm.md`` section U): instead of naturalizing the raw
# velocity in R^d (``naturalize``), the metric is pulled back onto the n directions as the Gram
# K = V G V^T, once per block and sample, and the directions are re-weighted inside their span.
METRIC_FIRST_COMPOSITIONS = ("metric_subspace", "metric_orthonormal")
DAMPING_FLOOR = 1e-6  # lambda = max(metric_damping, DAMPING_FLOOR)
CHOLESKY_RETRY_MULTIPLIERS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # retry K_lambda + lambda m I, in order


def damped_direction_gram(
    directions: torch.Tensor, gamma: torch.Tensor, u_factor: torch.Tensor, damping: float
) -> torch.Tensor:
    """Section U, step 1: K_lambda = sym(V G V^T) + lambda I_n for directions V [..., n, d], gamma [..., d],
    U [..., d, r]; K_ij = sum_k gamma_k V_ik V_jk + (V_i . U)(V_j . U), lambda = max(damping, 1e-6)."""
    gram = coupling_matrix(directions, gamma, u_factor)
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return gram + max(float(damping), DAMPING_FLOOR) * eye


def metric_subspace_frame(k_damped: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Section U, ASM-U: the frame F = K_lambda^-1 V [..., n, d], so that F^T w = V^T K_lambda^-1 w.

    One LU factorisation per sample. If any sample's factorisation reports a zero pivot, the whole
    batch uses the Hermitian pseudo-inverse of K_lambda instead. Under ``torch.compile`` both are
    computed and one is selected without reading the values (the same numbers): the path not taken
    runs on a harmless matrix, so its gradient is zero rather than NaN.
    """
    factors, pivots, info = torch.linalg.lu_factor_ex(k_damped)
    if not torch.compiler.is_compiling() and not bool((info != 0).any()):
        return torch.linalg.lu_solve(factors, pivots, directions)
    failed = (info != 0).any()
    n = k_damped.shape[-1]
    eye = torch.eye(n, dtype=k_damped.dtype, device=k_damped.device)
    factors, pivots, _ = torch.linalg.lu_factor_ex(torch.where(failed, eye, k_damped))
    solved = torch.linalg.lu_solve(factors, pivots, directions)
    # distinct eigenvalues keep the unused eigen-decomposition's gradient finite
    spread = torch.diag_embed(torch.arange(1, n + 1, dtype=k_damped.dtype, device=k_damped.device))
    pseudo = torch.linalg.pinv(torch.where(failed, k_damped, spread), hermitian=True) @ directions
    return torch.where(failed, pseudo, solved)


def metric_orthonormal_frame(k_damped: torch.Tensor, directions: torch.Tensor, damping: float) -> torch.Tensor:
    """Section U, ASM-F: the frame W = L^-1 V [..., n, d] with K_lambda = L L^T (L lower triangular).

    The stabilised fallback, per sample: a sample whose Cholesky factorisation fails is retried on
    K_lambda + lambda m I for m = 1e-3, 1e-2, ..., 100 (the first that factors wins) when K_lambda
    and V are finite; a sample that is not finite, or fails every retry, takes the Euclidean frame V
    with NaN set to 0 and +-inf to the largest finite values. Samples that factor keep their frame.
    Under ``torch.compile`` the retries run unconditionally and are selected without reading values.
    """
    chol, info = torch.linalg.cholesky_ex(k_damped)
    if not torch.compiler.is_compiling() and not bool((info != 0).any()):
        return torch.linalg.solve_triangular(chol, directions, upper=False)
    lam = max(float(damping), DAMPING_FLOOR)
    eye = torch.eye(k_damped.shape[-1], dtype=k_damped.dtype, device=k_damped.device)
    finite = torch.isfinite(k_damped).flatten(-2).all(-1) & torch.isfinite(directions).flatten(-2).all(-1)
    with torch.no_grad():  # every retry at once: [M, ..., n, n], the first shift that factors per sample
        shifts = lam * torch.tensor(CHOLESKY_RETRY_MULTIPLIERS, dtype=k_damped.dtype, device=k_damped.device)
        probe = torch.where(finite[..., None, None], k_damped.detach(), eye)
        factors = torch.linalg.cholesky_ex(probe + shifts.view(-1, *[1] * probe.dim()) * eye)[1] == 0
        retried = (info != 0) & finite & factors.any(0)
        shift = torch.where(retried, shifts[factors.int().argmax(0)], torch.zeros_like(shifts[0]))
    keep = ((info == 0) | retried)[..., None, None]
    # factor again with gradients, now only matrices known to factor (identity for the rest)
    chol, _ = torch.linalg.cholesky_ex(torch.where(keep, k_damped + shift[..., None, None] * eye, eye))
    frame = torch.linalg.solve_triangular(
        chol, torch.where(keep, directions, torch.zeros_like(directions)), upper=False
    )
    return torch.where(keep, frame, torch.nan_to_num(directions, nan=0.0))


def metric_first_frame(
    directions: torch.Tensor, gamma: torch.Tensor, u_factor: torch.Tensor, damping: float, composition: str
) -> torch.Tensor:
    """Section U, steps 1-3 and 5: the metric frame F [..., n, d] of ``composition`` ("metric_subspace" or
    "metric_orthonormal") at one geometry, with v_metric = sum_i a_i c_i F_i. Computed in float32 or
    wider with autocast off (a bf16 Gram or Cholesky would lose the metric's small eigenvalues)."""
    if composition not in METRIC_FIRST_COMPOSITIONS:
        raise ValueError(f"composition must be one of {METRIC_FIRST_COMPOSITIONS}, got {composition!r}")
    dtype = torch.promote_types(directions.dtype, torch.float32)
    with torch.autocast(device_type=directions.device.type, enabled=False):
        v = directions.to(dtype)
        k_damped = damped_direction_gram(v, gamma.to(dtype), u_factor.to(dtype), damping)
        if composition == "metric_subspace":
            return metric_subspace_frame(k_damped, v)
        return metric_orthonormal_frame(k_damped, v, damping)


def compose_metric_first(
    gates: torch.Tensor, coeff: torch.Tensor, directions: torch.Tensor, frame: torch.Tensor | None, strength: float
) -> torch.Tensor:
    """Section U, step 4: v = (1 - s) v_raw + s v_metric = sum_i a_i c_i ((1 - s) V_i + s F_i), in span(V).

    Shapes as :func:`raw_velocity`; ``frame`` [..., n, d] from :func:`metric_first_frame`. With s <= 0
    this is :func:`raw_velocity` exactly (unnaturalised J). The blend runs in float32 or wider with
    autocast off; the result has the dtype the raw velocity would have.
    """
    if strength <= 0:
        return raw_velocity(gates, coeff, directions)
    out_dtype = torch.promote_types(torch.promote_types(gates.dtype, coeff.dtype), directions.dtype)
    dtype = torch.promote_types(out_dtype, torch.float32)
    with torch.autocast(device_type=coeff.device.type, enabled=False):
        weights = coeff.to(dtype) * gates.to(dtype).unsqueeze(-2)
        blended = (1.0 - strength) * directions.to(dtype) + strength * frame.to(dtype)
        return (weights @ blended).to(out_dtype)
