"""The resolvent language model family (``docs/resolvent.md`` section 8): ``config`` holds the
settings and presets, ``model`` the network. Registers ``RESOLVENT`` and its controls
``RESOLVENT_SOFTMAX`` and ``RESOLVENT_ROPE``."""

from .config import ATTENTION_KINDS, PRESET_DIMS, ResolventLMConfig, build_config
from .model import ResolventAttention, ResolventLM

MODEL_NAMES = tuple(ATTENTION_KINDS)


def build(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> ResolventLM:
    """Registry builder: ``name`` picks the attention; ``overrides`` are ResolventLMConfig fields."""
    return ResolventLM(build_config(name, preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


__all__ = [
    "ATTENTION_KINDS",
    "MODEL_NAMES",
    "PRESET_DIMS",
    "ResolventAttention",
    "ResolventLM",
    "ResolventLMConfig",
    "build",
    "build_config",
]
