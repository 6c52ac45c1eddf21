r"""Settings of the looped language model (``docs/looped.md`` sections 1 and 3): the config, the
study's named arms, the preset widths, the schedules, the ε rules and the closed-form parameter count.

Schedules (``L = n_stored``, ``N = n_loop``, blocks 0..L-1):

* ``vanilla``: 0, 1, ..., L-1 (requires N = 1);
* ``layer``:   each block N times in a row (L0 L0 L1 L1 ...);
* ``model``:   the whole stack N times ((L0 ... L_{L-1}) x N);
* ``ssmloop``: walk the blocks; attention blocks once, SSM blocks N times in a row.

ε (``eps``): a number, ``"1/N"``, ``"1/sqrt(N)"``, ``"lambda/(N*sqrt(L))"`` (λ = ``eps_lambda``,
the residual-scaling paper's rule), or ``"learnable"`` (= ``"1/N"`` with ``learnable_eps=True``).
Fractions such as ``"1/4"`` are accepted. The arms store the rule (``"1/N"``), so overriding
``n_loop`` keeps an arm's scaling. (The study's GPU runs used 1/N, never λ/(N√L): ``docs/looped.md``
section 1.2.)

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

:func:`closed_form_parameter_count` gives the exact count without building the model; with
``include_positions=False`` and ``vocab_size=50304`` it reproduces the study's logged counts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

from drmlab.models.layers.mamba_mixer import mamba_mixer_parameter_count
from drmlab.naming import suggest, unknown
from drmlab.presets import PRESETS

from .selective_ssm import selective_ssm_parameter_count

SCHEDULES = ("vanilla", "layer", "model", "ssmloop")
MIXERS = ("attn", "ssm", "hybrid")
SSM_VARIANTS = ("s6", "mamba")  # the study's selective SSM, or Mamba's mixer at expand 1
POSITIONS = ("learned", "none")
PROJ_INIT_DEPTHS = ("stored_x_loop", "applications")
APPLICATIONS_PER_TOKEN = 12
DEFAULT_ARM = "C"

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
    return dict(
        n_stored=l,
        n_loop=n,
        schedule=sched,
        eps=eps,
        learnable_eps=False,
        mixer="hybrid",
        attn_every=every,
        attn_offset=0,
        ssm_conv=4,
    )


# The study's arms (``docs/looped.md`` section 3), the settings each name resolves to at any preset.
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
ARMS.update(
    {
        "A768": dict(ARMS["A"]),
        "C768": dict(ARMS["C"]),
        "MA768": _ssm(12, 1, "vanilla", 1.0, 4),
        "MC768": _ssm(6, 2, "layer", "1/N", 4),
        "HA768": dict(ARMS["HA"]),
        "HC768": dict(ARMS["HC"]),
        "HD768": dict(ARMS["HD"]),
        "HE768": dict(ARMS["HE"]),
    }
)

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
    ssm_variant: str = "s6"  # "s6" (the study's) or "mamba" (Mamba's mixer, no expansion)
    mlp_ratio: int = 4
    positions: str = "learned"
    proj_init_depth: str = "stored_x_loop"
    layer_norm_eps: float = 1e-5
    arm: str | None = DEFAULT_ARM  # the arm the settings started from (overrides apply after it)

    def validate(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "n_head",
            "max_seq_len",
            "n_stored",
            "n_loop",
            "d_state",
            "mlp_ratio",
            "attn_every",
        ):
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
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}{suggest(str(value), options)}"
        )


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
                raise ValueError(
                    f"eps must be a number, a fraction such as '1/4', or one of "
                    f"{', '.join(EPS_RULES)}; got {eps!r}{suggest(eps, EPS_RULES)}"
                ) from None
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
        if N != 1:
            raise ValueError(f"schedule 'vanilla' applies each block once: it needs n_loop=1, got {N}")
        return list(range(L))
    if config.schedule == "layer":
        return [i for i in range(L) for _ in range(N)]
    if config.schedule == "model":
        return [i for _ in range(N) for i in range(L)]
    if config.schedule == "ssmloop":
        kinds = block_kinds(config)
        return [i for i in range(L) for _ in range(1 if kinds[i] == "attn" else N)]
    raise unknown("schedule", config.schedule, SCHEDULES)


def ssm_parameter_count(config: LoopedConfig) -> int:
    """Parameters of one SSM mixer of ``config``: the study's selective SSM or Mamba's mixer at expand 1."""
    d, n, k = config.d_model, config.d_state, config.ssm_conv
    if config.ssm_variant == "s6":
        return selective_ssm_parameter_count(d, n, k)
    return mamba_mixer_parameter_count(d, n, d_conv=k, expand=1)


def closed_form_parameter_count(config: LoopedConfig, include_positions: bool = True) -> int:
    """The exact parameter count of the model ``config`` describes (the tied head counted once),
    computed without building it.

    Attention block 12d² + 13d (mlp_ratio 4), SSM block 10d² + 2dn + 11d + n + 1 (+ (K+1)d with
    the conv), + 1 per block with a learnable scale; total V·d + 2d + Σ blocks (+ P·d positions).
    """
    d, h = config.d_model, config.mlp_ratio * config.d_model
    common = 4 * d + (d * h + h) + (h * d + d) + (1 if config.has_learnable_scale else 0)
    total = config.vocab_size * d + 2 * d
    if include_positions and config.positions == "learned":
        total += config.max_seq_len * d
    for kind in block_kinds(config):
        total += common + (4 * d * d + 4 * d if kind == "attn" else ssm_parameter_count(config))
    return total


def build_config(preset: str = "tiny", vocab_size: int = 256, **overrides) -> LoopedConfig:
    """The preset's dimensions, then the arm's settings (``arm=``, default C), then ``overrides``."""
    if preset not in PRESET_DIMS:
        raise unknown("preset", preset, PRESETS)
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    arm = overrides.pop("arm", DEFAULT_ARM)
    if arm is not None:
        if arm not in ARMS:
            same_but_case = [name for name in ARMS if name.lower() == str(arm).lower()]
            hint = f" (did you mean {same_but_case[0]!r}?)" if same_but_case else suggest(str(arm), ARMS)
            raise ValueError(f"unknown LOOPED arm {arm!r}{hint}; known: {', '.join(ARMS)}")
        values.update(ARMS[arm])
    fields = {f.name for f in dataclasses.fields(LoopedConfig)}
    for key, value in overrides.items():
        if key not in fields - {"arm"}:
            raise unknown("LOOPED config key", key, fields)
        values[key] = value
    config = LoopedConfig(**values, arm=arm)
    config.validate()
    return config
