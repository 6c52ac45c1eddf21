"""A pre-LN transformer whose attention heads are the resolvent operator, and its controls.

Seed 002 (the resolvent head: W_ij = G_ij e^{qk s_ij} / Z_i^beta with the gated path product
G_ij = prod_{k=j+1}^{i} a_k) used as an attention layer, following notes/resolvent.md: per
position a gate magnitude (and, with ``gate_phase=True``, a phase) from ``Linear(d_model, 1)``
heads shared across heads (a sigmoid magnitude by default, so every gate keeps gradient),
learnable switches (beta, qk, g) per head initialised at 1, readout the real part. Phase-free
is the default: it runs the blockwise path without the cos/sin value lanes (0.84x of the
softmax twin's training tokens/s at tiny on one CPU thread, against 0.62x with the phase).

Three registry names share everything but the attention:

* ``RESOLVENT``: resolvent heads, no positional encoding (the gates carry position);
* ``RESOLVENT_SOFTMAX``: the softmax twin, plain causal softmax attention, no positions;
* ``RESOLVENT_ROPE``: the positional control, softmax attention with rotary positions --
  the original study's win over softmax turned out to be positional information, so any
  comparison must include it.

Decoding keeps a key/value cache; the resolvent heads also keep, per cached position j,
log |G_ij| and arg G_ij, updated in O(S) per token (G_{i+1,j} = a_{i+1} G_{i,j}).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.output import ModelOutput, check_tokens
from drmlab.models.registry import register
from drmlab.resolvent.gates import PARAMETERISATIONS, GateHead
from drmlab.resolvent.torch import resolvent_attention

ATTENTION_KINDS = {"RESOLVENT": "resolvent", "RESOLVENT_SOFTMAX": "softmax", "RESOLVENT_ROPE": "rope"}

# (d_model, n_layer, n_head): parameter counts within ~3% of DRM J at each preset (vocab 256)
PRESETS = {
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
            raise ValueError(f"gate_parameterisation must be one of {sorted(PARAMETERISATIONS)}, "
                             f"got {self.gate_parameterisation!r}")


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions (Su et al. 2021) on x [B, H, S, hd] at integer positions [S]."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angle = positions.to(torch.float64).unsqueeze(-1) * freq  # [S, half]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal multi-head attention: resolvent heads, or softmax (optionally with RoPE)."""

    def __init__(self, c: ResolventLMConfig):
        super().__init__()
        self.c, self.h, self.hd = c, c.n_head, c.d_model // c.n_head
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        if c.attention == "resolvent":
            self.gates = GateHead(c.d_model, 1, c.gate_parameterisation, phase=c.gate_phase)
            shape = (c.n_head,)
            if c.learnable_switches:
                self.beta, self.qk, self.g = (nn.Parameter(torch.ones(shape)) for _ in range(3))
            else:
                for name in ("beta", "qk", "g"):
                    self.register_buffer(name, torch.ones(shape))

    def _split(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        return q, k, v  # each [B, H, S, hd]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self._split(x)
        if self.c.attention == "resolvent":
            u, theta = self.gates(x)
            y = resolvent_attention(q, k, v, u, theta, self.beta, self.qk, self.g)
        else:
            if self.c.attention == "rope":
                positions = torch.arange(s, device=x.device)
                q, k = _rope(q, positions, self.c.rope_base), _rope(k, positions, self.c.rope_base)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))

    def step(self, x: torch.Tensor, cache: dict | None) -> tuple[torch.Tensor, dict]:
        """x [B, 1, d] -> ([B, 1, d], new cache). The cache passed in is not modified."""
        b, _, d = x.shape
        q, k, v = self._split(x)  # [B, H, 1, hd]
        position = 0 if cache is None else cache["k"].shape[2]
        if self.c.attention == "rope":
            pos = torch.tensor([position], device=x.device)
            q, k = _rope(q, pos, self.c.rope_base), _rope(k, pos, self.c.rope_base)
        keys = k if cache is None else torch.cat([cache["k"], k], dim=2)
        values = v if cache is None else torch.cat([cache["v"], v], dim=2)
        new = {"k": keys, "v": values}
        if self.c.attention != "resolvent":
            y = F.scaled_dot_product_attention(q, keys, values)  # one query sees every cached key
        else:
            y = self._resolvent_step(x, q, keys, values, cache, new)
        return self.proj(y.transpose(1, 2).reshape(b, 1, d)), new

    def _resolvent_step(self, x, q, keys, values, cache, new):
        """W_ij = G_ij e^{qk s_ij} / Z_i^beta for the newest query i over the cached keys j <= i."""
        u, theta = self.gates(x)  # [B, 1, 1]
        g = self.g.view(1, -1)
        m = (1 + g * (u[:, :, 0] - 1)).clamp(0.0, 1.0)  # blend: clamp(lerp(1, u, g), 0, 1), [B, H]
        if cache is None:
            logmag = m.new_zeros(m.shape[0], self.h, 1)
            angle = m.new_zeros(m.shape[0], self.h, 1)
        else:  # G_{i,j} = a_i G_{i-1,j}; the new diagonal G_ii = 1
            step_angle = g * theta[:, :, 0] if theta is not None else torch.zeros_like(m)
            logmag = torch.cat([cache["logmag"] + torch.log(m).unsqueeze(-1), m.new_zeros(m.shape[0], self.h, 1)], -1)
            angle = torch.cat([cache["angle"] + step_angle.unsqueeze(-1), m.new_zeros(m.shape[0], self.h, 1)], -1)
        new["logmag"], new["angle"] = logmag, angle
        scores = (q @ keys.transpose(-1, -2))[:, :, 0] / math.sqrt(self.hd)  # [B, H, S]
        logits = logmag + self.qk.view(1, -1, 1) * scores
        live = logmag > float("-inf")
        logits = logits.masked_fill(~live, float("-inf"))
        top = logits.amax(-1, keepdim=True)
        weights = torch.exp(logits - top)  # dead entries are exactly 0
        log_z = top + weights.sum(-1, keepdim=True).log()
        scale = torch.exp(top - self.beta.view(1, -1, 1) * log_z)
        readout = ((weights * torch.cos(angle)).unsqueeze(-1) * values).sum(2, keepdim=True)
        return readout * scale.unsqueeze(-1)


class Block(nn.Module):
    """Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP."""

    def __init__(self, c: ResolventLMConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.attn = Attention(c)
        self.fc1, self.fc2 = nn.Linear(c.d_model, 4 * c.d_model), nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def step(self, x, cache):
        y, cache = self.attn.step(self.ln1(x), cache)
        x = x + y
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)))), cache


class ResolventLM(nn.Module):
    """Token embedding (tied output head) -> pre-LN blocks -> final LayerNorm -> logits."""

    def __init__(self, config: ResolventLMConfig, seed: int = 0, name: str = "RESOLVENT", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.model_name, self.preset = config, name, preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(config.vocab_size, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.d_model)
            self._init_weights()

    def _init_weights(self):
        """GPT-2's rule: N(0, 0.02) weights, zero biases, write-back projections / sqrt(2 n_layer)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.proj, block.fc2):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layer))
            gates = getattr(block.attn, "gates", None)
            if gates is not None:  # GateHead's own bias init (sigmoid 0.9) after the blanket init
                nn.init.constant_(gates.magnitude.bias, math.log(9.0))

    def _logits(self, x):
        return self.ln_f(x) @ self.embedding.weight.t()

    def forward(self, tokens: torch.Tensor, step: int | None = None) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, vocab]; ``step`` is accepted and unused."""
        check_tokens(tokens, self.config.vocab_size)
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return ModelOutput(logits=self._logits(x))

    def init_state(self, batch_size: int) -> list:
        return [None] * len(self.blocks)

    def step(self, tokens_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """One token [B] -> (logits [B, vocab], new per-layer caches)."""
        if tokens_t.dim() != 1:
            raise ValueError(f"step expects tokens of shape [batch], got shape {tuple(tokens_t.shape)}")
        check_tokens(tokens_t.unsqueeze(1), self.config.vocab_size)
        x = self.embedding(tokens_t).unsqueeze(1)
        new = []
        for block, cache in zip(self.blocks, state):
            x, cache = block.step(x, cache)
            new.append(cache)
        return self._logits(x)[:, 0], new


def build_resolvent_lm(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> ResolventLM:
    fields = {f.name for f in dataclasses.fields(ResolventLMConfig)}
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {name} config key {key!r}{hint}")
    values = {**PRESETS[preset], "attention": ATTENTION_KINDS[name], "vocab_size": vocab_size, **overrides}
    return ResolventLM(ResolventLMConfig(**values), seed=seed, name=name, preset=preset)


register(tuple(ATTENTION_KINDS), build_resolvent_lm)
