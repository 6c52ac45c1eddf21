"""The DRM family (``docs/drm.md``): config, components, model, losses, solvers and diagnostics.

Its model names are the variants A-J, J_DILATED, J_NO_DIRECTION, J_NO_METRIC,
J_NO_NATURALIZATION, SSM_CONTROL and the upstream project's later variants J_DIRECT_CONTROL,
J_DIRECT_CONTROL_MATCHED, J_METRIC_SUBSPACE, J_METRIC_ORTHONORMAL_DIRECTION (appendix U), ASM_CM
(the fast-weight memory, appendix V), ASM_CM_E (its epistemic gates, V.4) and the variable-rank line
ASM_VR_R, ASM_VR_RS, ASM_VR_S and ASM_CM_VR (``docs/variable-rank.md``) (:data:`VARIANTS`).
"""

from .config import PRESET_DIMS, VARIANTS, DRMConfig, build_config, closed_form_parameter_count
from .model import DRMModel

MODEL_NAMES = VARIANTS


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> DRMModel:
    """Build DRM variant ``name`` at ``preset``; ``overrides`` are DRMConfig fields."""
    return DRMModel(build_config(name, preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


__all__ = [
    "MODEL_NAMES",
    "PRESET_DIMS",
    "VARIANTS",
    "DRMConfig",
    "DRMModel",
    "build",
    "build_config",
    "closed_form_parameter_count",
]
