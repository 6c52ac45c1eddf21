"""The LLAMA family: Hugging Face's ``LlamaForCausalLM`` as the "Transformer++" baseline (Touvron et
al. 2023: rotary positions, SwiGLU MLP, RMSNorm, no biases, tied embeddings). ``config`` holds the
settings, presets and closed-form parameter count, ``model`` the wrapper. Registered as ``LLAMA``."""

from .config import PRESET_DIMS, LlamaSettings, build_config, closed_form_parameter_count
from .model import Llama, LlamaDecodeState, hf_llama_config

MODEL_NAMES = ("LLAMA",)


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> Llama:
    """Registry builder: the ``preset`` dimensions at ``vocab_size``, then ``overrides``."""
    return Llama(build_config(preset, vocab_size, **overrides), seed=seed, model_name=name, preset=preset)


__all__ = [
    "MODEL_NAMES",
    "PRESET_DIMS",
    "Llama",
    "LlamaDecodeState",
    "LlamaSettings",
    "build",
    "build_config",
    "closed_form_parameter_count",
    "hf_llama_config",
]
