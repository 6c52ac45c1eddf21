"""Settings of the GPT-2 baseline (Radford et al. 2019): the subset of ``GPT2Config`` we vary, the
preset widths and the closed-form parameter count.

Parameter counts at vocab 256 (12 d^2 + 13 d per layer, (V + P) d embeddings, 2 d final norm),
against DRM J's at the same preset when these were chosen:

    micro  2 x 26  (2 heads),  32 positions:     24,440   (J     24,184: +1.06%)
    tiny   3 x 160 (5 heads), 256 positions:  1,010,080   (J  1,008,208: +0.19%)
    small 10 x 288 (9 heads), 512 positions: 10,212,480   (J 10,203,504: +0.09%)
    125m  13 x 896 (14 heads), 512 positions: 126,080,640

``tests/models/test_gpt2.py`` re-checks the micro/tiny/small rows against J (within 3%).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from drmlab.naming import unknown


@dataclass
class GPT2Settings:
    """The dimensions of the GPT-2 baseline (the subset of ``GPT2Config`` that we vary)."""

    n_layer: int
    n_head: int
    n_embd: int
    n_positions: int
    vocab_size: int = 256
    n_inner: int | None = None  # MLP width; None = 4 * n_embd
    tie_word_embeddings: bool = True
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    attn_implementation: str = "sdpa"  # "sdpa" or "eager"


PRESET_DIMS: dict[str, dict] = {
    "micro": dict(n_layer=2, n_head=2, n_embd=26, n_positions=32),
    "tiny": dict(n_layer=3, n_head=5, n_embd=160, n_positions=256),
    "small": dict(n_layer=10, n_head=9, n_embd=288, n_positions=512),
    "125m": dict(n_layer=13, n_head=14, n_embd=896, n_positions=512),
}


def closed_form_parameter_count(settings: GPT2Settings) -> int:
    """The exact parameter count of the model ``settings`` describes, computed without building it."""
    d, v, p, n = settings.n_embd, settings.vocab_size, settings.n_positions, settings.n_layer
    inner = settings.n_inner or 4 * d
    per_layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d)
    head = 0 if settings.tie_word_embeddings else v * d
    return v * d + p * d + n * per_layer + 2 * d + head


def build_config(preset: str = "tiny", vocab_size: int = 256, **overrides) -> GPT2Settings:
    """The ``preset`` dimensions at ``vocab_size``, then ``overrides`` (GPT2Settings fields)."""
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    fields = {f.name for f in dataclasses.fields(GPT2Settings)}
    for key, value in overrides.items():
        if key not in fields:
            raise unknown("GPT2 config key", key, fields)
        values[key] = value
    return GPT2Settings(**values)
