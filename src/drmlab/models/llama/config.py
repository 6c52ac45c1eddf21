"""Settings of the Llama-style transformer baseline ("Transformer++" of the Mamba, GLA, DeltaNet and
Zoology papers; Touvron et al. 2023): the subset of ``LlamaConfig`` we vary, the preset widths and
the closed-form parameter count.

The architecture: rotary positions (Su et al. 2021) on every head, a SwiGLU MLP (Shazeer 2020),
pre-norm RMSNorm (Zhang & Sennrich 2019) with eps 1e-5 (Llama 1's value; Hugging Face defaults to
1e-6), no biases anywhere, the head tied to the token embedding, and no grouped-query attention
(``num_key_value_heads = num_attention_heads``). Rotary has no position table: ``max_seq_len`` is
the training window only (Hugging Face's ``max_position_embeddings``, which matters only to rope
scaling, none here).

Parameter count: V d (the embedding, also the head) + L (2 d for the two RMSNorm weights + 4 d^2 for
q, k, v, o + 3 d f for gate, up and down) + d (the final norm). Depth and width are GPT2's presets
(micro 28 wide rather than GPT2's 26: a rotary head needs an even width), heads of 32 (tiny, small)
or 64 (125m) dimensions; the SwiGLU width f is the multiple of 8 that brings the count closest to
DRM J's at the same preset (f / d between 2.3 and 2.9, about the usual 8/3). At vocab 256:

    micro  2 x 28  (2 heads of 14),  f 64,    32 positions:      24,332  (J      24,184: +0.61%)
    tiny   3 x 160 (5 heads of 32),  f 456,  256 positions:   1,005,920  (J   1,008,208: -0.23%)
    small 10 x 288 (9 heads of 32),  f 784,  512 positions:  10,171,296  (J  10,203,504: -0.32%)
    125m  13 x 896 (14 heads of 64), f 2408, 512 positions: 126,145,152  (J 126,080,896: +0.05%)

``tests/models/test_llama.py`` re-checks the micro/tiny/small rows against J (within 1%).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from drmlab.naming import unknown

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class LlamaSettings:
    """The dimensions of the Llama baseline (the subset of ``LlamaConfig`` that we vary).

    ``max_seq_len`` is the training window only: rotary positions have no table, so the model runs
    (and steps) past it. There are as many key/value heads as query heads (no GQA)."""

    hidden_size: int
    intermediate_size: int  # the SwiGLU width f
    num_hidden_layers: int
    num_attention_heads: int
    max_seq_len: int
    vocab_size: int = 256
    rms_norm_eps: float = 1e-5  # Llama 1's value (Hugging Face's LlamaConfig defaults to 1e-6)
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    attn_implementation: str = "sdpa"  # "sdpa" or "eager"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> LlamaSettings:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"LLAMA's {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"LLAMA's hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"LLAMA's head dimension (hidden_size / num_attention_heads = {self.head_dim}) must be even"
            )
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise unknown("LLAMA attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0 or not self.initializer_range > 0:
            raise ValueError("LLAMA's rms_norm_eps, rope_theta and initializer_range must be positive")
        return self


PRESET_DIMS: dict[str, dict] = {
    "micro": dict(hidden_size=28, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_seq_len=32),
    "tiny": dict(hidden_size=160, intermediate_size=456, num_hidden_layers=3, num_attention_heads=5, max_seq_len=256),
    "small": dict(hidden_size=288, intermediate_size=784, num_hidden_layers=10, num_attention_heads=9, max_seq_len=512),
    "125m": dict(
        hidden_size=896, intermediate_size=2408, num_hidden_layers=13, num_attention_heads=14, max_seq_len=512
    ),
}


def closed_form_parameter_count(settings: LlamaSettings) -> int:
    """The exact parameter count of the model ``settings`` describes, computed without building it."""
    d, f, v, n = settings.hidden_size, settings.intermediate_size, settings.vocab_size, settings.num_hidden_layers
    per_layer = 2 * d + 4 * d * d + 3 * d * f
    head = 0 if settings.tie_word_embeddings else v * d
    return v * d + n * per_layer + d + head


def build_config(preset: str = "tiny", vocab_size: int = 256, **overrides) -> LlamaSettings:
    """The ``preset`` dimensions at ``vocab_size``, then ``overrides`` (LlamaSettings fields)."""
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    fields = {f.name for f in dataclasses.fields(LlamaSettings)}
    for key, value in overrides.items():
        if key not in fields:
            raise unknown("LLAMA config key", key, fields)
        values[key] = value
    return LlamaSettings(**values).validate()
