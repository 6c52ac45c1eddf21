"""The DRM family (math.md): config, components, model and the variant registry.

Registers A-J, J_DILATED, J_NO_DIRECTION, J_NO_METRIC, J_NO_NATURALIZATION and
SSM_CONTROL with :func:`drmlab.models.build_model`.
"""

from drmlab.models.registry import register

from .config import VARIANTS, DRMConfig, build_config, count_parameters
from .model import DRMModel


def build_drm(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> DRMModel:
    """Build DRM variant ``name`` at ``preset``; ``overrides`` are DRMConfig fields."""
    return DRMModel(build_config(name, preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


register(VARIANTS, build_drm)

__all__ = ["VARIANTS", "DRMConfig", "DRMModel", "build_config", "build_drm", "count_parameters"]
