"""Layers shared by several model families: the pre-LN residual block with its causal
self-attention and MLP (LOOPED, RESOLVENT*), Mamba's mixer (MAMBA, LOOPED's ``ssm_variant="mamba"``)
and the decode-state helper of causal convolutions."""

from .attention import CausalSelfAttention, KVCache, rotate
from .block import MLP, PreLNBlock
from .conv_context import trailing_context
from .mamba_mixer import MambaMixer, MambaMixerState, mamba_mixer_parameter_count

__all__ = [
    "CausalSelfAttention",
    "KVCache",
    "MLP",
    "MambaMixer",
    "MambaMixerState",
    "PreLNBlock",
    "mamba_mixer_parameter_count",
    "rotate",
    "trailing_context",
]
