r"""Mamba (Gu & Dao, 2023): the selective state-space language model, registered as ``MAMBA``.

Embedding -> n_layer pre-norm residual blocks ``x + Mixer(RMSNorm(x))`` -> RMSNorm -> LM head
tied to the embedding (as Hugging Face's ``MambaForCausalLM`` does by default). The mixer is
:class:`~drmlab.models.layers.MambaMixer` (its equations in :mod:`drmlab.models.layers.mamba_mixer`),
on :func:`drmlab.ops.selective_scan`: on a CPU a fused C kernel that never materialises the
[B, T, d_inner, d_state] states (Mamba's cost on a CPU); on other devices time chunks of
``scan_chunk`` steps on :func:`drmlab.ops.linear_scan` (``scan_recompute`` = activation
checkpointing per chunk). Forward and gradients are exact: the same sequential recurrence, no
division by cumulative gate products, no logarithm of a gate.

Parameter names follow Hugging Face's (``layers.{i}.mixer.in_proj.weight``, ``A_log``, ...), so
:func:`load_hf_state_dict` loads a ``MambaForCausalLM`` state dict by dropping its ``backbone.``
prefix; with the same weights the logits agree to float32 rounding (``tests/models/test_mamba.py``).

Generation: ``init_state(batch)`` / ``step(tokens_t, state)`` advance one token in O(1)
(per layer: the last ``d_conv - 1`` conv inputs and the [B, d_inner, d_state] SSM state);
stepping a sequence reproduces ``forward`` (``tests/models/test_step_equivalence.py``), and
``forward(tokens, return_state=True)`` returns the state after the tokens from the parallel scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens, leading_batch
from drmlab.models.layers import MambaMixer, MambaMixerState
from drmlab.models.output import ModelOutput

from .config import MambaConfig


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


class MambaBlock(nn.Module):
    """x + Mixer(RMSNorm(x))."""

    def __init__(self, c: MambaConfig):
        super().__init__()
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer = MambaMixer(
            c.d_model,
            c.d_state,
            c.d_conv,
            c.expand,
            c.dt_rank,
            c.bias,
            c.conv_bias,
            c.dt_min,
            c.dt_max,
            c.dt_init,
            c.dt_scale,
            c.dt_init_floor,
            scan_chunk=c.scan_chunk,
            scan_recompute=c.scan_recompute,
        )

    def forward(self, x: torch.Tensor, return_state: bool = False):
        if not return_state:
            return x + self.mixer(self.norm(x))
        out, state = self.mixer(self.norm(x), return_state=True)
        return x + out, state


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

    def forward(
        self,
        tokens: torch.Tensor,
        step: int | None = None,
        return_state: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Logits [B, T, vocab] for ``tokens`` [B, T]; ``step`` is accepted and ignored.
        ``return_state``: ``.state`` is the decoding state after the last token. ``logits_at``: the head
        at those positions only (:mod:`drmlab.models.inputs`)."""
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        check_logits_at(logits_at, tokens, self.model_name)
        x = self.embeddings(tokens.long())
        conv, ssm = [], []
        for layer in self.layers:
            if return_state:
                x, layer_state = layer(x, return_state=True)
                conv.append(layer_state.conv)
                ssm.append(layer_state.ssm)
            else:
                x = layer(x)
        state = MambaState(tuple(conv), tuple(ssm), position=tokens.shape[1]) if return_state else None
        return ModelOutput(logits=self._head(x if logits_at is None else x[logits_at]), aux={}, state=state)

    # ------------------------------------------------------------------ generation
    def init_state(self, batch_size: int) -> MambaState:
        """The decoding state before the first token (zeros)."""
        check_batch_size(batch_size, self.model_name)
        ref = self.embeddings.weight
        states = [layer.mixer.init_state(batch_size, ref.dtype, ref.device) for layer in self.layers]
        return MambaState(conv=tuple(s.conv for s in states), ssm=tuple(s.ssm for s in states))

    def step(self, tokens_t: torch.Tensor, state: MambaState, step: int | None = None):
        """Advance by one token: tokens_t [B] -> (logits [B, vocab], new state), O(1) per token.
        The state passed in is not modified."""
        check_step_tokens(tokens_t, self.config.vocab_size, leading_batch(state.ssm), self.model_name)
        x = self.embeddings(tokens_t.long())
        conv, ssm = [], []
        for layer, context, s in zip(self.layers, state.conv, state.ssm):
            out, layer_state = layer.mixer.step(layer.norm(x), MambaMixerState(context, s))
            x = x + out
            conv.append(layer_state.conv)
            ssm.append(layer_state.ssm)
        return self._head(x), MambaState(conv=tuple(conv), ssm=tuple(ssm), position=state.position + 1)


def load_hf_state_dict(model: MambaLM, state_dict: dict) -> MambaLM:
    """Load a transformers ``MambaForCausalLM`` state dict into ``model`` (strict)."""
    mapped = {}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            key = key[len("backbone.") :]
        if key == "lm_head.weight" and model.lm_head is None:
            continue  # tied to the embedding
        mapped[key] = value
    model.load_state_dict(mapped, strict=True)
    return model
