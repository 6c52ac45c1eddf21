"""Settings of the MAMBA language model (Gu & Dao 2023): the config, the preset widths and the
closed-form parameter count.

Parameter counts at vocab 256 (per layer 6 d^2 + 2 d (d_conv + 2 dt_rank + 3 d_state + 3) + d,
plus V d embedding and d final norm; tied head), against DRM J's at the same preset:

    micro    16 x 6,  d_state 16:      24,368   (J      24,184: +0.76%)
    tiny    152 x 6,  d_state 16:   1,008,520   (J   1,008,208: +0.03%)
    small   320 x 15, d_state 16:  10,215,040   (J  10,203,504: +0.11%)
    125m   1024 x 19, d_state 16: 126,941,184   (J 126,080,896: +0.68%)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from drmlab.models.layers.mamba_mixer import mamba_mixer_parameter_count
from drmlab.naming import unknown


@dataclass
class MambaConfig:
    """The dimensions and initialisation of a Mamba language model.

    ``dt_rank`` 0 means ``ceil(d_model / 16)`` (Mamba's "auto"); it is resolved on validation.
    ``max_seq_len`` is the training window only: the model has no positional parameters.
    """

    d_model: int = 152
    n_layer: int = 6
    vocab_size: int = 256
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int = 0
    max_seq_len: int = 256
    conv_bias: bool = True
    bias: bool = False  # biases of in_proj / out_proj
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    # initialisation (mamba_ssm's defaults)
    dt_min: float = 1e-3
    dt_max: float = 0.1
    dt_init: str = "random"  # "random" or "constant"
    dt_scale: float = 1.0
    dt_init_floor: float = 1e-4
    embedding_std: float = 0.02
    rescale_prenorm_residual: bool = True
    # the torch selective scan's (off-CPU) time chunk (0: auto, about 2^21 state elements per
    # chunk) and activation checkpointing; speed and memory only, results identical
    scan_chunk: int = 0
    scan_recompute: bool = False

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    def validate(self) -> MambaConfig:
        for name in ("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MambaConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.scan_chunk, int) or isinstance(self.scan_chunk, bool) or self.scan_chunk < 0:
            raise ValueError(f"MambaConfig.scan_chunk must be a positive integer (0 = auto), got {self.scan_chunk!r}")
        if not isinstance(self.dt_rank, int) or isinstance(self.dt_rank, bool) or self.dt_rank < 0:
            raise ValueError(f"MambaConfig.dt_rank must be a positive integer (0 = auto), got {self.dt_rank!r}")
        if self.dt_rank == 0:
            self.dt_rank = math.ceil(self.d_model / 16)
        if self.dt_init not in ("random", "constant"):
            raise ValueError(f"MambaConfig.dt_init must be 'random' or 'constant', got {self.dt_init!r}")
        if not (0 < self.dt_min <= self.dt_max):
            raise ValueError(f"MambaConfig needs 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if self.norm_eps <= 0:
            raise ValueError(f"MambaConfig.norm_eps must be positive, got {self.norm_eps}")
        return self


PRESET_DIMS: dict[str, dict] = {
    "micro": dict(d_model=16, n_layer=6, d_state=16, max_seq_len=32),
    "tiny": dict(d_model=152, n_layer=6, d_state=16, max_seq_len=256),
    "small": dict(d_model=320, n_layer=15, d_state=16, max_seq_len=512),
    "125m": dict(d_model=1024, n_layer=19, d_state=16, max_seq_len=512),
}


def closed_form_parameter_count(config: MambaConfig) -> int:
    """The exact parameter count of the model ``config`` describes, computed without building it."""
    c = dataclasses.replace(config).validate()
    d = c.d_model
    mixer = mamba_mixer_parameter_count(d, c.d_state, c.d_conv, c.expand, c.dt_rank, c.bias, c.conv_bias)
    head = 0 if c.tie_embeddings else c.vocab_size * d
    return c.vocab_size * d + c.n_layer * (mixer + d) + d + head  # + d: each layer's RMSNorm


def build_config(preset: str = "tiny", vocab_size: int = 256, **overrides) -> MambaConfig:
    """The ``preset`` dimensions at ``vocab_size``, then ``overrides`` (MambaConfig fields)."""
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    fields = {f.name for f in dataclasses.fields(MambaConfig)}
    for key, value in overrides.items():
        if key not in fields:
            raise unknown("MAMBA config key", key, fields)
        values[key] = value
    return MambaConfig(**values)


def config_from_hf(hf_config, **extra) -> MambaConfig:
    """A :class:`MambaConfig` with the dimensions of a transformers ``MambaConfig``."""
    return MambaConfig(
        d_model=hf_config.hidden_size,
        n_layer=hf_config.num_hidden_layers,
        vocab_size=hf_config.vocab_size,
        d_state=hf_config.state_size,
        d_conv=hf_config.conv_kernel,
        expand=hf_config.expand,
        dt_rank=int(hf_config.time_step_rank),
        conv_bias=hf_config.use_conv_bias,
        bias=hf_config.use_bias,
        norm_eps=hf_config.layer_norm_epsilon,
        tie_embeddings=hf_config.tie_word_embeddings,
        **extra,
    )
