"""The presets and the variant table of the DRM family (``docs/drm.md`` sections A.1 and A.5.3): a config
resolves in three layers, preset dimensions (:data:`PRESET_DIMS`), then the variant's overrides
(:data:`VARIANTS`), then the caller's overrides (:func:`build_config`); a few variants match their
memory width to another variant's parameter count (:data:`MATCHED_MEMORY`).
"""

from __future__ import annotations

import dataclasses

from drmlab.naming import unknown
from drmlab.presets import PRESETS

from .config_fields import DRMConfig
from .config_options import CE_ONLY, LOSS_WEIGHTS_BASE
from .param_count import closed_form_parameter_count, matched_memory_width

# Presets: the dimensions only. ``125m`` is the reference configuration; ``tiny`` and
# ``small`` give J about 1.0M and 10.2M parameters (``docs/drm.md`` section A.1).
PRESET_DIMS: dict[str, dict] = {
    "micro": dict(
        d_token=16,
        d_state=16,
        n_directions=4,
        metric_rank=4,
        hidden_size=32,
        direction_basis_size=8,
        metric_u_basis_size=8,
        mixer_hidden=16,
        mixer_kernel=4,
        memory_hidden=16,
        block_size=8,
        max_seq_len=32,
        fast_weight_dim=8,
    ),
    "tiny": dict(
        d_token=128,
        d_state=128,
        n_directions=8,
        metric_rank=8,
        hidden_size=384,
        direction_basis_size=16,
        metric_u_basis_size=16,
        mixer_hidden=128,
        mixer_kernel=8,
        memory_hidden=64,
        block_size=64,
        max_seq_len=256,
        fast_weight_dim=64,
    ),
    "small": dict(
        d_token=448,
        d_state=448,
        n_directions=16,
        metric_rank=16,
        hidden_size=1344,
        direction_basis_size=32,
        metric_u_basis_size=32,
        mixer_hidden=224,
        mixer_kernel=8,
        memory_hidden=112,
        block_size=64,
        max_seq_len=512,
        fast_weight_dim=64,
    ),
    "125m": dict(
        d_token=1536,
        d_state=1536,
        n_directions=64,
        metric_rank=64,
        hidden_size=3584,
        direction_basis_size=128,
        metric_u_basis_size=128,
        mixer_hidden=256,
        mixer_kernel=8,
        memory_hidden=256,
        block_size=64,
        max_seq_len=512,
        fast_weight_dim=128,
    ),
}


def _variant_overrides(name: str, dims: dict) -> dict:
    """The variant's changes relative to the preset (``docs/drm.md`` section A.5.3)."""
    m = dims["mixer_hidden"]
    dilated = dict(mixer_hidden=2 * m, mixer_layers=4, mixer_dilation_growth=2)
    gate_fix = dict(
        active_fraction_mode="target",
        target_active_fraction=0.5,
        gate_logit_bias=0.0,
        loss_weights={**CE_ONLY, "active_fraction": 0.01},
    )
    ce_only = dict(loss_weights=dict(CE_ONLY))
    a = dict(risk="dead", loss_weights=dict(LOSS_WEIGHTS_BASE))
    b = dict(a, **ce_only)
    c = dict(b, **gate_fix)
    d = dict(c, token_state_residual=True)
    j = dict(ce_only, risk="none", token_state_residual=True, selective_memory=True)
    direct = dict(
        j, use_direction_field=False, use_relational_metric=False, use_metric_naturalization=False, step_mode="velocity"
    )
    asm_cm = dict(
        j,
        use_direction_field=False,
        fast_weight_memory=True,
        fast_weight_durable=True,
        fast_weight_write_threshold=0.5,
        fast_weight_state_fp32=True,
        fast_weight_compute_fp32=True,
    )
    # the variable-rank line (docs/variable-rank.md): full rank by default, upstream's Phase 3A curriculum
    variable_rank = dict(
        rank_policy="full",
        rank_warmup_steps=50,
        rank_ramp_steps=150,
        rank_hardening_steps=200,
        rank_budget_weight=0.0025,
        rank_binary_weight=0.01,
        rank_switch_weight=0.001,
    )
    table = {
        "A": a,
        "B": b,
        "C": c,
        "D": d,
        "E": dict(d, block_size=max(1, dims["block_size"] // 4)),
        "F": dict(d, **dilated),
        "G": dict(c, token_state_residual=True, refinement_layers=1, **_narrow_two_stage(dims)),
        "H": dict(ce_only, risk="none", token_state_residual=True, **dilated),
        "I": dict(ce_only, risk="none", token_state_residual=True, **dilated, **gate_fix),
        "J": j,
        "J_DILATED": dict(j, mixer_hidden=max(1, round(m * 11 / 8)), mixer_layers=4, mixer_dilation_growth=2),
        "J_NO_METRIC": dict(j, use_relational_metric=False),
        "J_NO_DIRECTION": dict(j, use_direction_field=False),
        "J_NO_NATURALIZATION": dict(j, use_metric_naturalization=False),
        "SSM_CONTROL": dict(j, use_drm_geometry=False),  # memory width matched in build_config
        # the upstream project's later variants (docs/drm.md section U): the direct transition with
        # neither metric nor naturalization (ASM-D), and the same with its memory widened until its
        # count is nearest to J_NO_DIRECTION's (ASM-S; width matched in build_config)
        "J_DIRECT_CONTROL": direct,
        "J_DIRECT_CONTROL_MATCHED": direct,
        # ... and J with a metric-first composition in place of naturalization (ASM-U, ASM-F)
        "J_METRIC_SUBSPACE": dict(j, directional_metric_composition="metric_subspace"),
        "J_METRIC_ORTHONORMAL_DIRECTION": dict(j, directional_metric_composition="metric_orthonormal"),
        # ASM-CM (section V): J_NO_DIRECTION with the durable fast-weight memory, float32 state and compute
        "ASM_CM": asm_cm,
        # variable rank (docs/variable-rank.md): ASM-VR-R = J_NO_DIRECTION without selective memory,
        # ASM-VR-RS = J_NO_DIRECTION, ASM-VR-S = the direct control with its memory widened to ASM_CM's
        # count (width matched in build_config), ASM-CM-VR = ASM_CM with the rank-aware memory (d_v = d_state)
        "ASM_VR_R": dict(j, use_direction_field=False, selective_memory=False, **variable_rank),
        "ASM_VR_RS": dict(j, use_direction_field=False, **variable_rank),
        "ASM_VR_S": dict(direct, **variable_rank),
        "ASM_CM_VR": dict(asm_cm, rank_aware_memory=True, **variable_rank),
    }
    # ASM-CM-E (section V.4): ASM_CM with the epistemic gates on its memory's read and write
    table["ASM_CM_E"] = dict(table["ASM_CM"], fast_weight_epistemic_gates=True)
    return table[name]


def _narrow_two_stage(dims: dict) -> dict:
    """G's narrower dimensions: at 125m d 1024, n = r = 48, H 3200, bases 64, mixer 512."""

    def scale(value, ratio):
        return max(1, round(value * ratio))

    return dict(
        d_token=scale(dims["d_token"], 2 / 3),
        d_state=scale(dims["d_state"], 2 / 3),
        n_directions=scale(dims["n_directions"], 3 / 4),
        metric_rank=scale(dims["metric_rank"], 3 / 4),
        hidden_size=scale(dims["hidden_size"], 3200 / 3584),
        direction_basis_size=scale(dims["direction_basis_size"], 1 / 2),
        metric_u_basis_size=scale(dims["metric_u_basis_size"], 1 / 2),
        mixer_hidden=2 * dims["mixer_hidden"],
    )


VARIANTS = (
    "A",
    "B",
    "C",
    "D",
    "E",
    "F",
    "G",
    "H",
    "I",
    "J",
    "J_DILATED",
    "J_NO_DIRECTION",
    "J_NO_METRIC",
    "J_NO_NATURALIZATION",
    "SSM_CONTROL",
    "J_DIRECT_CONTROL",
    "J_DIRECT_CONTROL_MATCHED",
    "J_METRIC_SUBSPACE",
    "J_METRIC_ORTHONORMAL_DIRECTION",
    "ASM_CM",
    "ASM_VR_R",
    "ASM_VR_RS",
    "ASM_VR_S",
    "ASM_CM_VR",
    "ASM_CM_E",
)
# variant -> (the variant whose parameter count its memory width matches, the matching rule)
MATCHED_MEMORY = {
    "SSM_CONTROL": ("J", "floor"),
    "J_DIRECT_CONTROL_MATCHED": ("J_NO_DIRECTION", "nearest"),
    "ASM_VR_S": ("ASM_CM", "nearest"),  # upstream's PMCS-64 arm (S = 465 at its d = 64 preset)
}


def _quarter_state(values: dict) -> int:
    return max(1, values["d_state"] // 4)


# variant -> {field: its value from the resolved fields}, unless the caller sets the field: the
# variable-rank floor at a quarter of the state (upstream's r_min = 16 at d = 64) and the rank-aware
# memory's value width d_v = d_state
DERIVED_FIELDS = {
    "ASM_VR_R": {"rank_min": _quarter_state},
    "ASM_VR_RS": {"rank_min": _quarter_state},
    "ASM_VR_S": {"rank_min": _quarter_state},
    "ASM_CM_VR": {"rank_min": _quarter_state, "fast_weight_value_dim": lambda values: values["d_state"]},
}


def build_config(variant: str, preset: str, vocab_size: int = 256, **overrides) -> DRMConfig:
    """Resolve preset dimensions, then the variant, then ``overrides`` into a DRMConfig."""
    if variant not in VARIANTS:
        raise unknown("DRM variant", variant, VARIANTS)
    if preset not in PRESET_DIMS:
        raise unknown("preset", preset, PRESETS)
    names = {f.name for f in dataclasses.fields(DRMConfig)}
    for key in overrides:
        if key not in names:
            raise unknown("DRM config key", key, names)
    dims = dict(PRESET_DIMS[preset])
    values = {**dims, **_variant_overrides(variant, dims), "vocab_size": vocab_size}
    if "loss_weights" in overrides:  # a partial dict updates the variant's weights
        overrides = dict(overrides, loss_weights={**values.get("loss_weights", CE_ONLY), **overrides["loss_weights"]})
    values.update(overrides)
    for key, derive in DERIVED_FIELDS.get(variant, {}).items():
        if key not in overrides:
            values[key] = derive(values)
    config = DRMConfig(**values)
    config.validate()
    if variant in MATCHED_MEMORY and "memory_hidden" not in overrides:
        reference_variant, rule = MATCHED_MEMORY[variant]
        own = set(_variant_overrides(variant, dims)) - set(_variant_overrides(reference_variant, dims))
        reference = build_config(
            reference_variant, preset, vocab_size, **{k: v for k, v in overrides.items() if k not in own}
        )
        config.memory_hidden = matched_memory_width(config, closed_form_parameter_count(reference), rule=rule)
    return config
