"""The LOOPED family (``docs/looped.md``): weight-shared pre-LN blocks applied in a schedule with
residual scale ε. ``config`` holds the settings, arms and presets; ``model`` the network;
``selective_ssm`` the study's SSM mixer. Registered as ``LOOPED`` (arms via ``arm=`` or ``LOOPED:ARM``).
"""

from .config import (
    APPLICATIONS_PER_TOKEN,
    ARMS,
    DEFAULT_ARM,
    MIXERS,
    PRESET_DIMS,
    SCHEDULES,
    LoopedConfig,
    block_kinds,
    build_config,
    closed_form_parameter_count,
    resolve_eps,
    schedule_order,
)
from .model import LoopedLM, LoopedState

MODEL_NAMES = ("LOOPED",)


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> LoopedLM:
    """Registry builder: ``build_model("LOOPED", preset, arm="C", n_loop=..., ...)``."""
    return LoopedLM(build_config(preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


__all__ = [
    "APPLICATIONS_PER_TOKEN",
    "ARMS",
    "DEFAULT_ARM",
    "MIXERS",
    "MODEL_NAMES",
    "PRESET_DIMS",
    "SCHEDULES",
    "LoopedConfig",
    "LoopedLM",
    "LoopedState",
    "block_kinds",
    "build",
    "build_config",
    "closed_form_parameter_count",
    "resolve_eps",
    "schedule_order",
]
