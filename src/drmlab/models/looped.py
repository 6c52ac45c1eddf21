r"""The looped language model of the looped-residual study (notes/looped-study.md §1-§3).

Registered as ``LOOPED``. ``build_model("LOOPED", preset, arm="C")`` builds one of the study's
named arms; ``n_stored=``, ``n_loop=``, ``schedule=``, ``eps=``, ``mixer=`` (and every other
:class:`LoopedConfig` field) override the arm's settings.

Skeleton: token embedding + learned absolute position table -> block applications in schedule
order -> final LayerNorm -> tied LM head (logits = LN_f(x) Eᵀ, no bias). No dropout.

Block (pre-LN, both branches scaled by the same s):

    x <- x + s · Mixer(LN1(x));   x <- x + s · MLP(LN2(x)),   MLP = W2 GELU(W1 z + b1) + b2, 4x wide

with s = ε, or s = ε·λ_b (λ_b a learnable scalar per stored block, init 1, shared by that block's
applications) when ``learnable_eps``. Mixers: ``attn`` (causal multi-head self-attention, biases on
the fused QKV and the output projection), ``ssm`` (:class:`~drmlab.models.selective_ssm.SelectiveSSM`,
study variant ``s6`` or the Mamba-like ``mamba``; ``ssm_conv`` = conv kernel, 0 = none) or
``hybrid`` (stored block i is attention iff ``i % attn_every == attn_offset``, else SSM).

Schedules (``L = n_stored``, ``N = n_loop``, blocks 0..L-1):

* ``vanilla``: 0, 1, ..., L-1 (requires N = 1);
* ``layer``:   each block N times in a row (L0 L0 L1 L1 ...);
* ``model``:   the whole stack N times ((L0 ... L_{L-1}) x N);
* ``ssmloop``: walk the blocks; attention blocks once, SSM blocks N times in a row.

ε (``eps``): a number, ``"1/N"``, ``"1/sqrt(N)"``, ``"lambda/(N*sqrt(L))"`` (λ = ``eps_lambda``,
the residual-scaling paper's rule), or ``"learnable"`` (= ``"1/N"`` with ``learnable_eps=True``).
Fractions such as ``"1/4"`` are accepted. The arms store the rule (``"1/N"``), so overriding
``n_loop`` keeps an arm's scaling. (The study's GPU runs used 1/N, never λ/(N√L): caveat 1.)

Initialisation (the original's): every Linear weight N(0, 0.02²) with zero biases, token and
position embeddings N(0, 0.02²), LayerNorms (1, 0); the fused QKV weight Xavier-uniform with zero
bias, the SSM conv at torch's default U(±1/√K), SSM ``a`` = 0 and ``D`` = 0. Then the three
write-back matrices (MLP ``W2``, attention output projection, SSM ``W_out``) are re-drawn from
N(0, (0.02/√(2·depth))²) with depth = L·N (``proj_init_depth="stored_x_loop"``, the original; 14
for HE although only 12 applications run) or the number of applications
(``proj_init_depth="applications"``).

Named arms (:data:`ARMS`, the study's names and settings; the width comes from the preset):

    arm   L x N  schedule  ε              mixer           | arm   L x N  schedule  ε    mixer
    A     12x1   vanilla   1              attn            | MA    12x1   vanilla   1    ssm (no conv)
    B     6x2    layer     1              attn            | MB    6x2    layer     1    ssm (no conv)
    C     6x2    layer     1/N            attn            | MC    6x2    layer     1/N  ssm (no conv)
    D     6x2    model     1/N            attn            | MB4   3x4    layer     1    ssm (no conv)
    E1    3x4    layer     1              attn            | MC4   3x4    layer     1/N  ssm (no conv)
    E2    3x4    layer     1/sqrt(N)      attn            | HA    12x1   vanilla   1    hybrid /6, conv 4
    E3    3x4    layer     1/N            attn            | HC    6x2    layer     1/N  hybrid /6, conv 4
    I6    2x6    layer     1/N            attn            | HD    6x2    model     1/N  hybrid /6, conv 4
    I6u   2x6    layer     1              attn            | HE    7x2    ssmloop   1/N  hybrid /4, conv 4
    I12   1x12   layer     1/N            attn            |
    I12u  1x12   layer     1              attn            | the d=768 names A768, C768, HA768 ... HE768
    H     6x2    layer     1/N · λ_b      attn            | equal A, C, HA ... HE; MA768 / MC768 are
    H4    3x4    layer     1/N · λ_b      attn            | MA / MC with the conv (ssm_conv=4)

Every arm executes 12 block applications per token at every preset (12 is the least common
multiple of the arms' loop counts 1, 2, 4, 6, 12, so each arm keeps the study's L x N exactly).
The default arm is C.

Presets (all 12 applications; vocab 256 counts of the default arm C, position table included),
widths chosen to match the DRM J model at the same preset:

    micro  d=16,   2 heads, 32 positions,  d_state 8:       24,320  (J     24,184: +0.6%)
    tiny   d=112,  4 heads, 256 positions, d_state 16:     969,472  (J  1,008,208: -3.8%)
    small  d=384,  6 heads, 512 positions, d_state 16:  10,942,464  (J 10,203,504: +7.2%; the study's width)
    125m   d=1344, 21 heads, 512 positions, d_state 16: 131,195,904 (J 126,080,896: +4.1%)

Positions: ``positions="learned"`` (default, as the original) adds a learned table of
``max_seq_len`` rows, so the model sets ``has_position_limit = True`` and raises ValueError for
longer inputs (forward and step); ``positions="none"`` drops it (no length limit; the study's MQAR
model had none). :func:`count_parameters` gives the exact count; with
``include_positions=False`` and ``vocab_size=50304`` it reproduces the study's logged counts.

Generation: ``init_state(batch)`` / ``step(tokens_t, state)`` keep, per block *application*, a
key/value cache (attention) or the SSM state and conv context (O(1) per token); stepping a
sequence reproduces the parallel logits. ``residual_stream(tokens)`` returns the residual stream
after every application (for :mod:`drmlab.experiments.residual_probe`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.output import ModelOutput, check_tokens
from drmlab.models.registry import register, suggest
from drmlab.models.selective_ssm import SSM_VARIANTS, SelectiveSSM, ssm_parameter_count

__all__ = [
    "ARMS", "APPLICATIONS_PER_TOKEN", "DEFAULT_ARM", "PRESET_DIMS", "SCHEDULES", "MIXERS",
    "LoopedConfig", "LoopedLM", "LoopedState", "block_kinds", "build_looped", "count_parameters",
    "resolve_eps", "schedule_order",
]

SCHEDULES = ("vanilla", "layer", "model", "ssmloop")
MIXERS = ("attn", "ssm", "hybrid")
POSITIONS = ("learned", "none")
PROJ_INIT_DEPTHS = ("stored_x_loop", "applications")
APPLICATIONS_PER_TOKEN = 12
DEFAULT_ARM = "C"
INIT_STD = 0.02

# ε rules by canonical spelling (spaces, '*' and case removed).
_EPS_RULES = {
    "1/n": lambda n, l, lam: 1.0 / n,
    "1/sqrt(n)": lambda n, l, lam: 1.0 / math.sqrt(n),
    "lambda/(nsqrt(l))": lambda n, l, lam: lam / (n * math.sqrt(l)),
    "1/(nsqrt(l))": lambda n, l, lam: 1.0 / (n * math.sqrt(l)),
    "learnable": lambda n, l, lam: 1.0 / n,
}
EPS_RULES = ("1/N", "1/sqrt(N)", "lambda/(N*sqrt(L))", "learnable")


def _attn(l, n, sched, eps, **extra):
    return dict(n_stored=l, n_loop=n, schedule=sched, eps=eps, learnable_eps=False, mixer="attn", **extra)


def _ssm(l, n, sched, eps, conv):
    return dict(n_stored=l, n_loop=n, schedule=sched, eps=eps, learnable_eps=False, mixer="ssm", ssm_conv=conv)


def _hybrid(l, n, sched, eps, every):
    return dict(n_stored=l, n_loop=n, schedule=sched, eps=eps, learnable_eps=False, mixer="hybrid",
                attn_every=every, attn_offset=0, ssm_conv=4)


# The study's arms (§3), the settings each name resolves to at any preset.
ARMS: dict[str, dict] = {
    "A": _attn(12, 1, "vanilla", 1.0),
    "B": _attn(6, 2, "layer", 1.0),
    "C": _attn(6, 2, "layer", "1/N"),
    "D": _attn(6, 2, "model", "1/N"),
    "E1": _attn(3, 4, "layer", 1.0),
    "E2": _attn(3, 4, "layer", "1/sqrt(N)"),
    "E3": _attn(3, 4, "layer", "1/N"),
    "I6": _attn(2, 6, "layer", "1/N"),
    "I6u": _attn(2, 6, "layer", 1.0),
    "I12": _attn(1, 12, "layer", "1/N"),
    "I12u": _attn(1, 12, "layer", 1.0),
    "H": {**_attn(6, 2, "layer", "1/N"), "learnable_eps": True},
    "H4": {**_attn(3, 4, "layer", "1/N"), "learnable_eps": True},
    "MA": _ssm(12, 1, "vanilla", 1.0, 0),
    "MB": _ssm(6, 2, "layer", 1.0, 0),
    "MC": _ssm(6, 2, "layer", "1/N", 0),
    "MB4": _ssm(3, 4, "layer", 1.0, 0),
    "MC4": _ssm(3, 4, "layer", "1/N", 0),
    "HA": _hybrid(12, 1, "vanilla", 1.0, 6),
    "HC": _hybrid(6, 2, "layer", "1/N", 6),
    "HD": _hybrid(6, 2, "model", "1/N", 6),
    "HE": _hybrid(7, 2, "ssmloop", "1/N", 4),
}
# The d=768 rounds' names: same settings (width from the preset); their SSM has the conv.
ARMS.update({
    "A768": dict(ARMS["A"]), "C768": dict(ARMS["C"]),
    "MA768": _ssm(12, 1, "vanilla", 1.0, 4), "MC768": _ssm(6, 2, "layer", "1/N", 4),
    "HA768": dict(ARMS["HA"]), "HC768": dict(ARMS["HC"]), "HD768": dict(ARMS["HD"]), "HE768": dict(ARMS["HE"]),
})

PRESET_DIMS: dict[str, dict] = {
    "micro": dict(d_model=16, n_head=2, max_seq_len=32, d_state=8),
    "tiny": dict(d_model=112, n_head=4, max_seq_len=256, d_state=16),
    "small": dict(d_model=384, n_head=6, max_seq_len=512, d_state=16),
    "125m": dict(d_model=1344, n_head=21, max_seq_len=512, d_state=16),
}


@dataclass
class LoopedConfig:
    """Settings of a looped LM. The defaults are arm C at the tiny width."""

    vocab_size: int = 256
    d_model: int = 112
    n_head: int = 4
    max_seq_len: int = 256
    n_stored: int = 6  # L: distinct blocks held in memory
    n_loop: int = 2  # N: applications per stored block
    schedule: str = "layer"
    eps: float | str = "1/N"
    eps_lambda: float = 1.0  # λ of the "lambda/(N*sqrt(L))" rule
    learnable_eps: bool = False  # s = ε·λ_b with a learnable λ_b per stored block (init 1)
    mixer: str = "attn"
    attn_every: int = 6  # hybrid: stored block i is attention iff i % attn_every == attn_offset
    attn_offset: int = 0
    d_state: int = 16
    ssm_conv: int = 4  # SSM conv kernel; 0 = no conv (the study's d=384 SSM arms)
    ssm_variant: str = "s6"  # "s6" (the study's) or "mamba" (per-channel step size)
    mlp_ratio: int = 4
    positions: str = "learned"
    proj_init_depth: str = "stored_x_loop"
    layer_norm_eps: float = 1e-5
    arm: str | None = DEFAULT_ARM  # the arm the settings started from (overrides apply after it)

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_head", "max_seq_len", "n_stored", "n_loop", "d_state",
                     "mlp_ratio", "attn_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("ssm_conv", "attn_offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("mixer", self.mixer, MIXERS)
        _check_choice("positions", self.positions, POSITIONS)
        _check_choice("proj_init_depth", self.proj_init_depth, PROJ_INIT_DEPTHS)
        _check_choice("ssm_variant", self.ssm_variant, SSM_VARIANTS)
        if self.schedule == "vanilla" and self.n_loop != 1:
            raise ValueError(f"schedule 'vanilla' applies each block once: it needs n_loop=1, got {self.n_loop}")
        if self.attn_offset >= self.attn_every:
            raise ValueError(f"attn_offset ({self.attn_offset}) must be smaller than attn_every ({self.attn_every})")
        if not isinstance(self.learnable_eps, bool):
            raise ValueError(f"learnable_eps must be true or false, got {self.learnable_eps!r}")
        if not _positive_number(self.eps_lambda):
            raise ValueError(f"eps_lambda must be a positive number, got {self.eps_lambda!r}")
        if not _positive_number(self.layer_norm_eps):
            raise ValueError(f"layer_norm_eps must be a positive number, got {self.layer_norm_eps!r}")
        resolve_eps(self)

    @property
    def eps_value(self) -> float:
        """The residual scale ε as a number."""
        return resolve_eps(self)

    @property
    def has_learnable_scale(self) -> bool:
        return self.learnable_eps or (isinstance(self.eps, str) and _canonical(self.eps) == "learnable")

    @property
    def applications(self) -> int:
        """Block applications per token."""
        return len(schedule_order(self))

    @property
    def effective_depth(self) -> int:
        """The depth in the write-back init std 0.02/√(2·depth)."""
        return self.n_stored * self.n_loop if self.proj_init_depth == "stored_x_loop" else self.applications


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_choice(name: str, value, options) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}"
                         f"{suggest(str(value), options)}")


def _canonical(text: str) -> str:
    return text.replace(" ", "").replace("*", "").replace("λ", "lambda").replace("ε", "").lower()


def resolve_eps(config: LoopedConfig) -> float:
    """ε of ``config`` as a positive number (see the module docstring for the accepted forms)."""
    eps = config.eps
    if isinstance(eps, bool):
        raise ValueError(f"eps must be a number or one of {EPS_RULES}, got {eps!r}")
    if isinstance(eps, (int, float)):
        value = float(eps)
    elif isinstance(eps, str):
        key = _canonical(eps)
        if key in _EPS_RULES:
            value = _EPS_RULES[key](config.n_loop, config.n_stored, float(config.eps_lambda))
        else:
            try:
                value = float(Fraction(key))
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"eps must be a number, a fraction such as '1/4', or one of "
                                 f"{', '.join(EPS_RULES)}; got {eps!r}{suggest(eps, EPS_RULES)}") from None
    else:
        raise ValueError(f"eps must be a number or one of {EPS_RULES}, got {eps!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"eps must be a positive finite number, got {eps!r} = {value}")
    return value


def block_kinds(config: LoopedConfig) -> list[str]:
    """The mixer of each stored block: 'attn' or 'ssm'."""
    if config.mixer == "hybrid":
        return ["attn" if i % config.attn_every == config.attn_offset else "ssm" for i in range(config.n_stored)]
    return [config.mixer] * config.n_stored


def schedule_order(config: LoopedConfig) -> list[int]:
    """The stored-block index of every application, in order."""
    L, N = config.n_stored, config.n_loop
    if config.schedule == "vanilla":
        return list(range(L)) if N == 1 else _vanilla_error(N)
    if config.schedule == "layer":
        return [i for i in range(L) for _ in range(N)]
    if config.schedule == "model":
        return [i for _ in range(N) for i in range(L)]
    if config.schedule == "ssmloop":
        kinds = block_kinds(config)
        return [i for i in range(L) for _ in range(1 if kinds[i] == "attn" else N)]
    raise ValueError(f"unknown schedule {config.schedule!r}")


def _vanilla_error(n):
    raise ValueError(f"schedule 'vanilla' applies each block once: it needs n_loop=1, got {n}")


def count_parameters(config: LoopedConfig, include_positions: bool = True) -> int:
    """The exact parameter count of the model ``config`` describes (the tied head counted once).

    Attention block 12d² + 13d (mlp_ratio 4), SSM block 10d² + 2dn + 11d + n + 1 (+ (K+1)d with
    the conv), + 1 per block with a learnable scale; total V·d + 2d + Σ blocks (+ P·d positions).
    """
    d, h = config.d_model, config.mlp_ratio * config.d_model
    common = 4 * d + (d * h + h) + (h * d + d) + (1 if config.has_learnable_scale else 0)
    total = config.vocab_size * d + 2 * d
    if include_positions and config.positions == "learned":
        total += config.max_seq_len * d
    for kind in block_kinds(config):
        if kind == "attn":
            total += common + 4 * d * d + 4 * d
        else:
            total += common + ssm_parameter_count(d, config.d_state, config.ssm_conv, config.ssm_variant)
    return total


# ---------------------------------------------------------------------------------- modules
class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused, biased QKV projection and a biased output."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, d_model // n_head
        self.qkv_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.qkv_bias = nn.Parameter(torch.empty(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> q, k, v [B, H, T, hd]."""
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        qkv = qkv.unflatten(-1, (3, self.n_head, self.head_dim)).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).flatten(-2))

    def init_state(self, batch_size: int, dtype, device) -> tuple:
        empty = torch.zeros(batch_size, self.n_head, 0, self.head_dim, dtype=dtype, device=device)
        return empty, empty

    def step(self, x_t: torch.Tensor, cache: tuple) -> tuple[torch.Tensor, tuple]:
        """x_t [B, d]; cache = (keys, values) [B, H, t, hd] -> (out [B, d], extended cache)."""
        q, k, v = self._qkv(x_t.unsqueeze(1))
        keys, values = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, keys, values)
        return self.out_proj(y.transpose(1, 2).flatten(-2))[:, 0], (keys, values)


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)  # W1
        self.proj = nn.Linear(hidden, d_model)  # W2 (a write-back matrix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # exact (erf) GELU


class LoopedBlock(nn.Module):
    """One stored pre-LN block: x + s·Mixer(LN1 x), then + s·MLP(LN2 x)."""

    def __init__(self, config: LoopedConfig, kind: str):
        super().__init__()
        d = config.d_model
        self.kind = kind
        self.ln1 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        if kind == "attn":
            self.mixer = CausalSelfAttention(d, config.n_head)
        else:
            self.mixer = SelectiveSSM(d, config.d_state, config.ssm_conv, config.ssm_variant, init_std=INIT_STD)
        self.ln2 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.mlp = MLP(d, config.mlp_ratio * d)
        self.lam = nn.Parameter(torch.ones(())) if config.has_learnable_scale else None

    def scale(self, eps: float):
        return eps * self.lam if self.lam is not None else eps

    def forward(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        s = self.scale(eps)
        x = x + s * self.mixer(self.ln1(x))
        return x + s * self.mlp(self.ln2(x))

    def init_state(self, batch_size: int, dtype, device):
        return self.mixer.init_state(batch_size, dtype=dtype, device=device)

    def step(self, x_t: torch.Tensor, state, eps: float):
        s = self.scale(eps)
        out, state = self.mixer.step(self.ln1(x_t), state)
        x_t = x_t + s * out
        return x_t + s * self.mlp(self.ln2(x_t)), state

    def write_back_weights(self) -> list[torch.Tensor]:
        """The matrices the GPT-2 rule re-draws: the mixer's output projection and W2."""
        mixer_out = self.mixer.out_proj.weight if self.kind == "attn" else self.mixer.w_out.weight
        return [mixer_out, self.mlp.proj.weight]


@dataclass(frozen=True)
class LoopedState:
    """Decoding state: the next position and, per block application, the attention key/value
    cache ``(keys, values)`` or the SSM ``(state, conv context)``. Never modified in place."""

    position: int
    layers: tuple


class LoopedLM(nn.Module):
    """A looped (weight-tied) pre-LN language model; see the module docstring."""

    def __init__(self, config: LoopedConfig, seed: int = 0, name: str = "LOOPED", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.seed, self.model_name, self.preset = config, seed, name, preset
        c = config
        self.order = tuple(schedule_order(c))
        self.eps = c.eps_value
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
            if c.positions == "learned":
                self.pos_emb = nn.Parameter(torch.empty(c.max_seq_len, c.d_model))
            else:
                self.register_parameter("pos_emb", None)
            self.blocks = nn.ModuleList(LoopedBlock(c, kind) for kind in block_kinds(c))
            self.ln_f = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
            self._init_weights()

    @property
    def has_position_limit(self) -> bool:
        return self.config.positions == "learned"

    @property
    def application_blocks(self) -> tuple[int, ...]:
        """The stored block of each application (for diagnostics)."""
        return self.order

    @property
    def write_back_std(self) -> float:
        return INIT_STD / math.sqrt(2 * self.config.effective_depth)

    def _init_weights(self) -> None:
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, INIT_STD)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, 0.0, INIT_STD)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
            if self.pos_emb is not None:
                nn.init.normal_(self.pos_emb, 0.0, INIT_STD)
            for block in self.blocks:
                if block.kind == "attn":
                    nn.init.xavier_uniform_(block.mixer.qkv_weight)
                    nn.init.zeros_(block.mixer.qkv_bias)
                else:
                    block.mixer.reset_parameters()
            std = self.write_back_std
            for block in self.blocks:
                for weight in block.write_back_weights():
                    nn.init.normal_(weight, 0.0, std)

    # ------------------------------------------------------------------ forward
    def _check_length(self, length: int) -> None:
        if self.has_position_limit and length > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {length} exceeds LOOPED's learned position table (max_seq_len="
                f"{self.config.max_seq_len}); use --set max_seq_len=N or positions='none'")

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tokens(tokens, self.config.vocab_size)
        self._check_length(tokens.shape[1])
        x = self.tok_emb(tokens.long())
        if self.pos_emb is not None:
            x = x + self.pos_emb[: tokens.shape[1]]
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.tok_emb.weight)

    def forward(self, tokens: torch.Tensor, step: int | None = None) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, V]; logits[:, t] predicts token t + 1. ``step`` is ignored."""
        x = self.embed(tokens)
        for i in self.order:
            x = self.blocks[i](x, self.eps)
        return ModelOutput(logits=self.head(x), aux={})

    def residual_stream(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """[x_0, x_1, ..., x_K]: the embedded input and the stream after each of the K applications."""
        x = self.embed(tokens)
        stream = [x]
        for i in self.order:
            x = self.blocks[i](x, self.eps)
            stream.append(x)
        return stream

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> LoopedState:
        ref = self.tok_emb.weight
        layers = tuple(self.blocks[i].init_state(batch_size, ref.dtype, ref.device) for i in self.order)
        return LoopedState(position=0, layers=layers)

    def step(self, tokens_t: torch.Tensor, state: LoopedState,
             step: int | None = None) -> tuple[torch.Tensor, LoopedState]:
        """Advance by one token: tokens_t [B] -> (logits [B, V], new state). Reproduces ``forward``."""
        if not isinstance(tokens_t, torch.Tensor) or tokens_t.dim() != 1:
            raise ValueError(f"step expects tokens of shape [batch], got {getattr(tokens_t, 'shape', tokens_t)!r}")
        check_tokens(tokens_t.unsqueeze(1), self.config.vocab_size)
        if len(state.layers) != len(self.order):
            raise ValueError(f"state has {len(state.layers)} layer states, the model applies {len(self.order)} blocks")
        self._check_length(state.position + 1)
        x = self.tok_emb(tokens_t.long())
        if self.pos_emb is not None:
            x = x + self.pos_emb[state.position]
        layers = []
        for i, layer_state in zip(self.order, state.layers):
            x, layer_state = self.blocks[i].step(x, layer_state, self.eps)
            layers.append(layer_state)
        return self.head(x), LoopedState(position=state.position + 1, layers=tuple(layers))


# ---------------------------------------------------------------------------------- registry
def build_config(preset: str = "tiny", vocab_size: int = 256, **overrides) -> LoopedConfig:
    """The preset's dimensions, then the arm's settings (``arm=``, default C), then ``overrides``."""
    if preset not in PRESET_DIMS:
        raise ValueError(f"unknown preset {preset!r}{suggest(preset, PRESET_DIMS)}; known: {', '.join(PRESET_DIMS)}")
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    arm = overrides.pop("arm", DEFAULT_ARM)
    if arm is not None:
        if arm not in ARMS:
            folded = {name.lower(): name for name in ARMS}
            hint = (f" (did you mean {folded[str(arm).lower()]!r}?)" if str(arm).lower() in folded
                    else suggest(str(arm), ARMS))
            raise ValueError(f"unknown LOOPED arm {arm!r}{hint}; known: {', '.join(ARMS)}")
        values.update(ARMS[arm])
    fields = {f.name for f in dataclasses.fields(LoopedConfig)} - {"arm"}
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown LOOPED config key {key!r}{suggest(key, fields | {'arm'})}; "
                             f"known: {', '.join(sorted(fields | {'arm'}))}")
        values[key] = value
    config = LoopedConfig(**values, arm=arm)
    config.validate()
    return config


def build_looped(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> LoopedLM:
    """Registry builder: ``build_model("LOOPED", preset, arm="C", n_loop=..., ...)``."""
    return LoopedLM(build_config(preset, vocab_size, **overrides), seed=seed, name=name, preset=preset)


register(["LOOPED"], build_looped)
