"""The GPT2 family: Hugging Face's ``GPT2LMHeadModel`` as a baseline. ``config`` holds the
settings, presets and closed-form parameter count, ``model`` the wrapper. Registered as ``GPT2``."""

from .config import PRESET_DIMS, GPT2Settings, build_config, closed_form_parameter_count
from .model import GPT2, GPT2DecodeState

MODEL_NAMES = ("GPT2",)


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> GPT2:
    """Registry builder: the ``preset`` dimensions at ``vocab_size``, then ``overrides``."""
    return GPT2(build_config(preset, vocab_size, **overrides), seed=seed, model_name=name, preset=preset)


__all__ = [
    "GPT2",
    "MODEL_NAMES",
    "PRESET_DIMS",
    "GPT2DecodeState",
    "GPT2Settings",
    "build",
    "build_config",
    "closed_form_parameter_count",
]
