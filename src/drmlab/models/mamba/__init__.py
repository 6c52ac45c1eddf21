"""The MAMBA family (Gu & Dao 2023): ``config`` holds the settings, presets and closed-form
parameter count, ``model`` the language model and its Hugging Face interop; the mixer itself is
shared with LOOPED (:mod:`drmlab.models.layers.mamba_mixer`). Registered as ``MAMBA``."""

from .config import PRESET_DIMS, MambaConfig, build_config, closed_form_parameter_count, config_from_hf
from .model import MambaLM, MambaState, load_hf_state_dict

MODEL_NAMES = ("MAMBA",)


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> MambaLM:
    """Registry builder: the ``preset`` dimensions at ``vocab_size``, then ``overrides``."""
    return MambaLM(build_config(preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


__all__ = [
    "MODEL_NAMES",
    "PRESET_DIMS",
    "MambaConfig",
    "MambaLM",
    "MambaState",
    "build",
    "build_config",
    "closed_form_parameter_count",
    "config_from_hf",
    "load_hf_state_dict",
]
