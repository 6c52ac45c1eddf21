r"""Mamba (Gu & Dao, 2023): the selective state-space language model, registered as ``MAMBA``.

Each layer is a pre-norm residual block ``x + Mixer(RMSNorm(x))``; the mixer is

    [x, z] = in_proj(h)                                   (2 * d_inner channels)
    x      = silu(causal_depthwise_conv1d(x))             (kernel d_conv, left padding only)
    [r, B, C] = x_proj(x)                                 (dt_rank + 2 * d_state)
    dt     = softplus(dt_proj(r))                         (input-dependent step size, [B, T, d_inner])
    A      = -exp(A_log)                                  ([d_inner, d_state], input-independent)
    h_t    = exp(dt_t A) * h_{t-1} + dt_t B_t x_t         (per channel e and state n)
    y_t    = C_t . h_t + D x_t
    out    = out_proj(y * silu(z))

with a final RMSNorm and an LM head tied to the embedding (as Hugging Face's
``MambaForCausalLM`` does by default). Parameter names follow Hugging Face's
(``layers.{i}.mixer.in_proj.weight``, ``A_log``, ...), so :func:`load_hf_state_dict`
loads a ``MambaForCausalLM`` state dict by dropping its ``backbone.`` prefix; with the same
weights the logits agree to float32 rounding (``tests/test_mamba.py``).

The selective scan is :func:`drmlab.ops.selective.selective_scan`: on a CPU a fused C
kernel that never materialises the [B, T, d_inner, d_state] states (Mamba's cost on a CPU); on
other devices time chunks of ``scan_chunk`` steps on :func:`drmlab.ops.linear_scan`
(``scan_recompute`` = activation checkpointing per chunk). Forward and gradients are exact: the
same sequential recurrence, no division by cumulative gate products, no logarithm of a gate.

Generation: ``init_state(batch)`` / ``step(tokens_t, state)`` advance one token in O(1)
(per layer: the last ``d_conv - 1`` conv inputs and the [B, d_inner, d_state] SSM state);
stepping a sequence reproduces ``forward`` (``tests/test_step_equivalence.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.output import ModelOutput, check_tokens
from drmlab.models.registry import register, suggest
from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step
from drmlab.ops.selective import selective_scan, selective_scan_reference

__all__ = [
    "MambaConfig",
    "MambaLM",
    "PRESET_DIMS",
    "build_mamba",
    "count_parameters",
    "load_hf_state_dict",
    "selective_scan",
    "selective_scan_reference",
]


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

    def validate(self) -> "MambaConfig":
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


# Parameter counts at vocab 256 (per layer 6 d^2 + 2 d (d_conv + 2 dt_rank + 3 d_state + 3) + d,
# plus V d embedding and d final norm; tied head), against DRM J's at the same preset:
#   micro    16 x 6,  d_state 16:      24,368   (J      24,184: +0.76%)
#   tiny    152 x 6,  d_state 16:   1,008,520   (J   1,008,208: +0.03%)
#   small   320 x 15, d_state 16:  10,215,040   (J  10,203,504: +0.11%)
#   125m   1024 x 19, d_state 16: 126,941,184   (J 126,080,896: +0.68%)
PRESET_DIMS: dict[str, dict] = {
    "micro": dict(d_model=16, n_layer=6, d_state=16, max_seq_len=32),
    "tiny": dict(d_model=152, n_layer=6, d_state=16, max_seq_len=256),
    "small": dict(d_model=320, n_layer=15, d_state=16, max_seq_len=512),
    "125m": dict(d_model=1024, n_layer=19, d_state=16, max_seq_len=512),
}


def count_parameters(config: MambaConfig) -> int:
    """The exact parameter count of ``config`` (no model is built)."""
    c = dataclasses.replace(config).validate()
    d, e, n, r, k = c.d_model, c.d_inner, c.d_state, c.dt_rank, c.d_conv
    per_layer = (d * 2 * e + (2 * e if c.bias else 0)  # in_proj
                 + e * k + (e if c.conv_bias else 0)  # conv1d
                 + e * (r + 2 * n)  # x_proj
                 + r * e + e  # dt_proj
                 + e * n + e  # A_log, D
                 + e * d + (d if c.bias else 0)  # out_proj
                 + d)  # norm
    head = 0 if c.tie_embeddings else c.vocab_size * d
    return c.vocab_size * d + c.n_layer * per_layer + d + head


# ------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MambaMixer(nn.Module):
    """Mamba's selective-SSM mixer (parameter names as Hugging Face's ``MambaMixer``)."""

    def __init__(self, c: MambaConfig):
        super().__init__()
        self.config = c
        e, n, r = c.d_inner, c.d_state, c.dt_rank
        self.in_proj = nn.Linear(c.d_model, 2 * e, bias=c.bias)
        self.conv1d = nn.Conv1d(e, e, c.d_conv, groups=e, bias=c.conv_bias, padding=c.d_conv - 1)
        self.x_proj = nn.Linear(e, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, e, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, c.d_model, bias=c.bias)
        with torch.no_grad():  # mamba_ssm's step-size initialisation
            std = r ** -0.5 * c.dt_scale
            if c.dt_init == "constant":
                nn.init.constant_(self.dt_proj.weight, std)
            else:
                nn.init.uniform_(self.dt_proj.weight, -std, std)
            dt = torch.exp(torch.rand(e) * (math.log(c.dt_max) - math.log(c.dt_min)) + math.log(c.dt_min))
            dt = dt.clamp(min=c.dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def _project(self, xc):
        """Everything after the conv: (x, dt, B, C) from the conv output (before silu)."""
        c = self.config
        x = F.silu(xc)
        r, Bm, Cm = torch.split(self.x_proj(x), [c.dt_rank, c.d_state, c.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(r))
        return x, dt, Bm, Cm

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(h).chunk(2, dim=-1)
        x, dt, Bm, Cm = self._project(causal_depthwise_conv1d(x, self.conv1d.weight, self.conv1d.bias))
        A = -torch.exp(self.A_log)
        y, _ = selective_scan(x, dt, A, Bm, Cm, chunk=self.config.scan_chunk, recompute=self.config.scan_recompute)
        y = y.to(x.dtype) + x * self.D.to(x.dtype)
        return self.out_proj(y * F.silu(z))

    def step(self, h_t: torch.Tensor, conv_context: torch.Tensor, ssm: torch.Tensor):
        """One token: h_t [B, d_model] -> (out [B, d_model], new conv context, new SSM state)."""
        x, z = self.in_proj(h_t).chunk(2, dim=-1)
        xc, conv_context = causal_depthwise_conv1d_step(x, conv_context, self.conv1d.weight, self.conv1d.bias)
        x, dt, Bm, Cm = self._project(xc)
        A = -torch.exp(self.A_log)
        ssm = torch.exp(dt.unsqueeze(-1) * A) * ssm + (dt * x).unsqueeze(-1) * Bm.unsqueeze(1)
        y = torch.bmm(ssm, Cm.unsqueeze(-1)).squeeze(-1) + x * self.D.to(x.dtype)
        return self.out_proj(y * F.silu(z)), conv_context, ssm


class MambaBlock(nn.Module):
    def __init__(self, c: MambaConfig):
        super().__init__()
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer = MambaMixer(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))


@dataclass
class MambaState:
    """The decoding state: per layer the last d_conv - 1 conv inputs [B, d_conv - 1, d_inner]
    and the SSM state [B, d_inner, d_state]."""

    conv: tuple
    ssm: tuple
    position: int = 0


class MambaLM(nn.Module):
    """Embedding -> n_layer Mamba blocks -> RMSNorm -> tied LM head."""

    def __init__(self, config: MambaConfig, seed: int = 0, name: str = "MAMBA", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.seed, self.model_name, self.preset = config, seed, name, preset
        c = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embeddings = nn.Embedding(c.vocab_size, c.d_model)
            nn.init.normal_(self.embeddings.weight, std=c.embedding_std)
            self.layers = nn.ModuleList(MambaBlock(c) for _ in range(c.n_layer))
            self.norm_f = RMSNorm(c.d_model, c.norm_eps)
            self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
            if c.rescale_prenorm_residual:  # GPT-2 style 1/sqrt(n_layer) on the residual writers
                with torch.no_grad():
                    for layer in self.layers:
                        layer.mixer.out_proj.weight /= math.sqrt(c.n_layer)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.embeddings.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm_f(x), weight)

    def forward(self, tokens: torch.Tensor, step: int | None = None) -> ModelOutput:
        """Logits [B, T, vocab] for ``tokens`` [B, T]; ``step`` is accepted and ignored."""
        check_tokens(tokens, self.config.vocab_size)
        x = self.embeddings(tokens.long())
        for layer in self.layers:
            x = layer(x)
        return ModelOutput(logits=self._head(x), aux={})

    # ------------------------------------------------------------------ generation
    def init_state(self, batch_size: int) -> MambaState:
        """The decoding state before the first token (zeros)."""
        c, ref = self.config, self.embeddings.weight
        conv = tuple(ref.new_zeros(batch_size, c.d_conv - 1, c.d_inner) for _ in range(c.n_layer))
        ssm = tuple(ref.new_zeros(batch_size, c.d_inner, c.d_state) for _ in range(c.n_layer))
        return MambaState(conv=conv, ssm=ssm)

    def step(self, tokens_t: torch.Tensor, state: MambaState, step: int | None = None):
        """Advance by one token: tokens_t [B] -> (logits [B, vocab], new state), O(1) per token.
        The state passed in is not modified."""
        if not isinstance(tokens_t, torch.Tensor) or tokens_t.dim() != 1:
            shape = tuple(tokens_t.shape) if isinstance(tokens_t, torch.Tensor) else type(tokens_t).__name__
            raise ValueError(f"step expects tokens of shape [batch], got {shape}")
        check_tokens(tokens_t.unsqueeze(1), self.config.vocab_size)
        x = self.embeddings(tokens_t.long())
        conv, ssm = [], []
        for layer, context, s in zip(self.layers, state.conv, state.ssm):
            out, context, s = layer.mixer.step(layer.norm(x), context, s)
            x = x + out
            conv.append(context)
            ssm.append(s)
        return self._head(x), MambaState(conv=tuple(conv), ssm=tuple(ssm), position=state.position + 1)


# ------------------------------------------------------------------------------------------
# Hugging Face interop and the registry
# ------------------------------------------------------------------------------------------


def config_from_hf(hf_config, **extra) -> MambaConfig:
    """A :class:`MambaConfig` with the dimensions of a transformers ``MambaConfig``."""
    return MambaConfig(
        d_model=hf_config.hidden_size, n_layer=hf_config.num_hidden_layers, vocab_size=hf_config.vocab_size,
        d_state=hf_config.state_size, d_conv=hf_config.conv_kernel, expand=hf_config.expand,
        dt_rank=int(hf_config.time_step_rank), conv_bias=hf_config.use_conv_bias, bias=hf_config.use_bias,
        norm_eps=hf_config.layer_norm_epsilon, tie_embeddings=hf_config.tie_word_embeddings, **extra)


def load_hf_state_dict(model: MambaLM, state_dict: dict) -> MambaLM:
    """Load a transformers ``MambaForCausalLM`` state dict into ``model`` (strict)."""
    mapped = {}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            key = key[len("backbone."):]
        if key == "lm_head.weight" and model.lm_head is None:
            continue  # tied to the embedding
        mapped[key] = value
    model.load_state_dict(mapped, strict=True)
    return model


def build_mamba(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> MambaLM:
    """Registry builder: the ``preset`` dimensions at ``vocab_size``, then ``overrides``."""
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    fields = {f.name for f in dataclasses.fields(MambaConfig)}
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown MAMBA config key {key!r}{suggest(key, fields)}; "
                             f"known: {', '.join(sorted(fields))}")
        values[key] = value
    return MambaLM(MambaConfig(**values), seed=seed, name=name, preset=preset)


register(["MAMBA"], build_mamba)
