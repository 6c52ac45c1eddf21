"""Closed-form parameter counts of the DRM family (``docs/drm.md`` section A.5.1), computed from a config
without building the model, and the memory width that matches one model's count to another's."""

from __future__ import annotations

import dataclasses

from .config_fields import DRMConfig


# Closed-form parameter counts (``docs/drm.md`` section A.5.1), used to match widths.
def _trunk(c: DRMConfig) -> int:
    return (c.d_read + 1) * c.hidden_size + (c.hidden_size + 1) * c.hidden_size


def _direction_field(c: DRMConfig) -> int:
    h, n = c.hidden_size, c.n_directions
    head = (
        (h + 1) * n * c.direction_basis_size + c.direction_basis_size * c.d_state
        if c.direction_basis_size
        else (h + 1) * n * c.d_state
    )
    return _trunk(c) + head + (h + 1) * n


def _metric(c: DRMConfig) -> int:
    h, r, p = c.hidden_size, c.metric_rank, c.metric_u_basis_size
    u = ((h + 1) * r * p + p * c.d_state if p else (h + 1) * c.d_state * r) if r else 0
    diagonal = (h + 1) * c.d_state if c.metric_diagonal != "none" else 0
    return _trunk(c) + diagonal + u


def _flow(c: DRMConfig) -> int:
    return (c.d_read + c.d_token + 1) * c.hidden_size + (c.hidden_size + 1) * c.n_directions


def closed_form_parameter_count(c: DRMConfig) -> int:
    """The exact parameter count of the model ``c`` describes, computed without building it (the
    tests check it against the built model; :func:`drmlab.models.count_parameters` counts a built one)."""
    ds, dt, h = c.d_state, c.d_token, c.hidden_size
    total = c.vocab_size * dt + ds  # embedding, z0
    total += c.d_read + (c.d_read + 1) * h + (h + 1) * c.vocab_size  # emitter
    if c.has_direction_field:
        total += _direction_field(c) + _flow(c)
    if c.has_direct_transition:
        total += (c.d_read + dt + 1) * h + (h + 1) * ds
    if c.has_relational_metric:
        total += _metric(c)
    if c.use_drm_geometry and c.risk != "none":
        total += (c.d_read + 1) * h + 2 * h + 2 + 4
    if c.mixer == "causal_conv":
        m = c.mixer_hidden
        total += (3 * ds + dt + 3) * m + c.mixer_layers * (m * c.mixer_kernel + m + m * m + m) + (m + 1) * ds
    if c.token_state_residual:
        total += dt * ds
    if c.selective_memory:
        total += (c.d_read + dt + 1) * c.memory_hidden + 3 * (c.memory_hidden + 1) * ds
    if c.has_geometry:
        total += c.refinement_layers * (_direction_field(c) + _metric(c) + _flow(c))
    if c.fast_weight_memory:  # section V: W_k, W_v and b_v, the gates (the consolidation gate if durable), W_o
        k, v = c.fast_weight_dim, c.fast_weight_values
        total += (
            k * dt + (c.d_read + dt + 1) * v + (4 if c.fast_weight_durable else 3) * (c.d_read + 2 * dt + 1) + ds * v
        )
        if c.fast_weight_epistemic_gates:  # section V.4: four MLPs (two factors for each of two gates)
            u = c.fast_weight_confidence_hidden
            total += 4 * ((c.d_read + 2 * dt + 1) * u + (c.fast_weight_confidence_layers - 1) * (u + 1) * u + u + 1)
    if c.has_variable_rank:  # the rank controller's score head (docs/variable-rank.md section 2)
        total += (dt + 1) * ds
    return total


def matched_memory_width(control: DRMConfig, target: int, rule: str = "floor") -> int:
    """The memory width S that matches ``control``'s parameter count to ``target``.

    ``rule="floor"``: the largest S whose model does not exceed ``target`` (the reference
    SSM_CONTROL, S = 14,944 at 125m). ``rule="nearest"``: the S whose count is nearest to
    ``target``, the upstream ASM-S rule (S = 7,212 at 125m, 300 parameters above J_NO_DIRECTION;
    the floor rule would give 7,211, 7,381 below); a tie goes to the smaller width.
    """
    if rule not in ("floor", "nearest"):
        raise ValueError(f"rule must be 'floor' or 'nearest', got {rule!r}")
    per_unit = control.d_read + control.d_token + 1 + 3 * control.d_state
    without = closed_form_parameter_count(dataclasses.replace(control, memory_hidden=0))
    width = max(1, (target - without) // per_unit)
    if rule == "nearest" and abs(without + (width + 1) * per_unit - target) < abs(without + width * per_unit - target):
        width += 1
    return width
