"""A pre-LN transformer whose attention heads are the resolvent operator, and its controls.

The resolvent head of ``docs/resolvent.md`` (W_ij = G_ij e^{qk s_ij} / Z_i^beta with the gated path
product G_ij = prod_{k=j+1}^{i} a_k) used as an attention layer, as its section 8 describes: per
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

The block is the pre-LN block shared with LOOPED (:class:`~drmlab.models.layers.PreLNBlock`); the
twins' attention is :class:`~drmlab.models.layers.CausalSelfAttention`, the resolvent heads are
:class:`ResolventAttention` on the same projections. Settings and presets: :mod:`.config`.

Decoding keeps a key/value cache; the resolvent heads also keep, per cached position j,
log |G_ij| and arg G_ij, updated in O(S) per token (G_{i+1,j} = a_{i+1} G_{i,j}).
``forward(tokens, return_state=True)`` builds the same cache from the parallel pass (log |G_ij|
and arg G_ij as suffix sums of the gates' logarithms and angles).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens, leading_batch
from drmlab.models.layers import CausalSelfAttention, PreLNBlock
from drmlab.models.legacy_names import accept_legacy_names
from drmlab.models.output import ModelOutput
from drmlab.resolvent.attention import resolvent_attention
from drmlab.resolvent.gates import GateHead

from .config import ResolventLMConfig

# parameter names of checkpoints written before the block was shared with LOOPED
LEGACY_NAMES = (
    (".attn.qkv.weight", ".mixer.qkv_weight"),
    (".attn.qkv.bias", ".mixer.qkv_bias"),
    (".attn.proj.", ".mixer.out_proj."),
    (".attn.", ".mixer."),
    (".fc1.", ".mlp.fc."),
    (".fc2.", ".mlp.proj."),
)


class ResolventCache(NamedTuple):
    """Per layer: keys and values [B, H, S, hd] and, per cached position j, log |G_ij| and
    arg G_ij [B, H, S] for the newest position i."""

    keys: torch.Tensor
    values: torch.Tensor
    logmag: torch.Tensor
    angle: torch.Tensor


class ResolventAttention(CausalSelfAttention):
    """Causal multi-head attention whose heads are the resolvent operator: one gate head shared
    across heads, learnable switches (beta, qk, g) per head initialised at 1."""

    def __init__(self, c: ResolventLMConfig):
        super().__init__(c.d_model, c.n_head)
        self.gates = GateHead(c.d_model, 1, c.gate_parameterisation, phase=c.gate_phase)
        shape = (c.n_head,)
        if c.learnable_switches:
            self.beta, self.qk, self.g = (nn.Parameter(torch.ones(shape)) for _ in range(3))
        else:
            for name in ("beta", "qk", "g"):
                self.register_buffer(name, torch.ones(shape))

    def _blend(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per position and head the gate a_k = m_k e^{i th_k}: (log m, th) [B, H, T], with
        m = clamp(lerp(1, u, g), 0, 1) and th = g theta."""
        u, theta = self.gates(x)  # [B, 1, T]
        g = self.g.view(1, -1, 1)
        m = (1 + g * (u - 1)).clamp(0.0, 1.0)
        step_angle = g * theta if theta is not None else torch.zeros_like(m)
        return torch.log(m), step_angle

    def forward(self, x: torch.Tensor, return_state: bool = False):
        q, k, v = self.project(x)
        u, theta = self.gates(x)
        out = self.merge(resolvent_attention(q, k, v, u, theta, self.beta, self.qk, self.g))
        if not return_state:
            return out
        log_m, step_angle = self._blend(x)
        return out, ResolventCache(k, v, _sum_after(log_m), _sum_after(step_angle))

    def init_state(self, batch_size: int, dtype: torch.dtype, device) -> ResolventCache:
        keys, values = super().init_state(batch_size, dtype, device)
        empty = torch.zeros(batch_size, self.n_head, 0, dtype=dtype, device=device)
        return ResolventCache(keys, values, empty, empty)

    def step(self, x_t: torch.Tensor, cache: ResolventCache) -> tuple[torch.Tensor, ResolventCache]:
        """W_ij = G_ij e^{qk s_ij} / Z_i^beta for the newest query i over the cached keys j <= i."""
        x = x_t.unsqueeze(1)
        q, k, v = self.project(x)  # [B, H, 1, hd]
        keys, values = torch.cat([cache.keys, k], dim=2), torch.cat([cache.values, v], dim=2)
        log_m, step_angle = self._blend(x)  # [B, H, 1]
        new_diagonal = log_m.new_zeros(log_m.shape)  # G_ii = 1; G_{i,j} = a_i G_{i-1,j}
        logmag = torch.cat([cache.logmag + log_m, new_diagonal], -1)
        angle = torch.cat([cache.angle + step_angle, new_diagonal], -1)
        scores = (q @ keys.transpose(-1, -2))[:, :, 0] / math.sqrt(self.head_dim)  # [B, H, S]
        logits = logmag + self.qk.view(1, -1, 1) * scores
        live = logmag > float("-inf")
        logits = logits.masked_fill(~live, float("-inf"))
        top = logits.amax(-1, keepdim=True)
        weights = torch.exp(logits - top)  # dead entries are exactly 0
        log_z = top + weights.sum(-1, keepdim=True).log()
        scale = torch.exp(top - self.beta.view(1, -1, 1) * log_z)
        readout = ((weights * torch.cos(angle)).unsqueeze(-1) * values).sum(2, keepdim=True)
        return self.merge(readout * scale.unsqueeze(-1))[:, 0], ResolventCache(keys, values, logmag, angle)


def _sum_after(x: torch.Tensor) -> torch.Tensor:
    """s_j = sum_{k > j} x_k along the last axis: log |G_{T-1,j}| from log m (arg G from the angles)."""
    suffix = torch.flip(torch.cumsum(torch.flip(x[..., 1:], [-1]), -1), [-1])
    return torch.cat([suffix, x.new_zeros(x[..., :1].shape)], -1)


def _attention(c: ResolventLMConfig) -> nn.Module:
    # Draw (and discard) what the former separate nn.Linear(d, 3d) QKV projection drew when it was
    # built, so that a seed still gives exactly the parameters it gave before (they are re-drawn
    # by the init below either way).
    nn.Linear(c.d_model, 3 * c.d_model)
    if c.attention == "resolvent":
        return ResolventAttention(c)
    return CausalSelfAttention(c.d_model, c.n_head, rotary_base=c.rope_base if c.attention == "rope" else None)


class ResolventLM(nn.Module):
    """Token embedding (tied output head) -> pre-LN blocks -> final LayerNorm -> logits."""

    def __init__(self, config: ResolventLMConfig, seed: int = 0, name: str = "RESOLVENT", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.model_name, self.preset = config, name, preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(config.vocab_size, config.d_model)
            self.blocks = nn.ModuleList(PreLNBlock(_attention(config), config.d_model) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.d_model)
            self._init_weights()
        accept_legacy_names(self, LEGACY_NAMES)

    def _init_weights(self):
        """GPT-2's rule: N(0, 0.02) weights, zero biases, write-back projections / sqrt(2 n_layer)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, CausalSelfAttention):  # the fused QKV, before the output projection
                nn.init.normal_(module.qkv_weight, std=0.02)
                nn.init.zeros_(module.qkv_bias)
        for block in self.blocks:
            for weight in block.write_back_weights():
                nn.init.normal_(weight, std=0.02 / math.sqrt(2 * self.config.n_layer))
            gates = getattr(block.mixer, "gates", None)
            if gates is not None:  # GateHead's own bias init (sigmoid 0.9) after the blanket init
                nn.init.constant_(gates.magnitude.bias, math.log(9.0))

    def _logits(self, x):
        return self.ln_f(x) @ self.embedding.weight.t()

    def forward(
        self,
        tokens: torch.Tensor,
        step: int | None = None,
        return_state: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, vocab]; ``step`` is accepted and unused. ``return_state``:
        ``.state`` is the per-layer cache after the last token. ``logits_at``: the head at those positions
        only (:mod:`drmlab.models.inputs`)."""
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        check_logits_at(logits_at, tokens, self.model_name)
        x = self.embedding(tokens.long())
        caches = []
        for block in self.blocks:
            x = block(x, return_state=return_state)
            if return_state:
                x, cache = x
                caches.append(cache)
        logits = self._logits(x if logits_at is None else x[logits_at])
        return ModelOutput(logits=logits, state=tuple(caches) if return_state else None)

    def init_state(self, batch_size: int) -> tuple:
        check_batch_size(batch_size, self.model_name)
        ref = self.embedding.weight
        return tuple(block.init_state(batch_size, ref.dtype, ref.device) for block in self.blocks)

    def step(self, tokens_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One token [B] -> (logits [B, vocab], new per-layer caches)."""
        check_step_tokens(tokens_t, self.config.vocab_size, leading_batch(state), self.model_name)
        x = self.embedding(tokens_t.long())
        caches = []
        for block, cache in zip(self.blocks, state):
            x, cache = block.step(x, cache)
            caches.append(cache)
        return self._logits(x), tuple(caches)
