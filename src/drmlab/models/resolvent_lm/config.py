"""Settings of the resolvent language model and its two controls (``docs/resolvent.md`` section 8):
the config, which attention each registered name uses, and the preset widths (parameter counts
within ~3% of DRM J at each preset, vocab 256)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from drmlab.naming import unknown
from drmlab.resolvent.gates import PARAMETERISATIONS

ATTENTION_KINDS = {"RESOLVENT": "resolvent", "RESOLVENT_SOFTMAX": "softmax", "RESOLVENT_ROPE": "rope"}

PRESET_DIMS: dict[str, dict] = {
    "micro": dict(d_model=16, n_layer=6, n_head=2, max_seq_len=32),
    "tiny": dict(d_model=128, n_layer=5, n_head=4, max_seq_len=256),
    "small": dict(d_model=320, n_layer=8, n_head=5, max_seq_len=512),
    "125m": dict(d_model=896, n_layer=13, n_head=14, max_seq_len=512),
}


@dataclass
class ResolventLMConfig:
    vocab_size: int = 256
    d_model: int = 128
    n_layer: int = 5
    n_head: int = 4
    max_seq_len: int = 256  # training window; no positional table, so any length runs
    attention: str = "resolvent"  # resolvent | softmax | rope
    gate_parameterisation: str = "sigmoid"  # sigmoid | hard_concrete | clamp
    gate_phase: bool = False  # phase-free by default: the original's LM ran its fused phase-free kernel
    learnable_switches: bool = True
    rope_base: float = 10000.0

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.attention not in ("resolvent", "softmax", "rope"):
            raise ValueError(f"attention must be 'resolvent', 'softmax' or 'rope', got {self.attention!r}")
        if self.attention == "rope" and (self.d_model // self.n_head) % 2:
            raise ValueError("rotary positions need an even head dimension")
        if self.gate_parameterisation not in PARAMETERISATIONS:
            raise ValueError(
                f"gate_parameterisation must be one of {sorted(PARAMETERISATIONS)}, got {self.gate_parameterisation!r}"
            )


def build_config(name: str, preset: str = "tiny", vocab_size: int = 256, **overrides) -> ResolventLMConfig:
    """The registered ``name``'s attention at the ``preset`` dimensions, then ``overrides``."""
    fields = {f.name for f in dataclasses.fields(ResolventLMConfig)}
    for key in overrides:
        if key not in fields:
            raise unknown(f"{name} config key", key, fields)
    values = {**PRESET_DIMS[preset], "attention": ATTENTION_KINDS[name], "vocab_size": vocab_size, **overrides}
    return ResolventLMConfig(**values)
