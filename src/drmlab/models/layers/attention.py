"""Causal multi-head softmax self-attention (Vaswani et al. 2017), optionally with rotary
positions (Su et al. 2021, RoFormer), as used by LOOPED and the resolvent model's twins.

One fused, biased QKV projection, scaled dot-product attention under the causal mask, and a
biased output projection (``out_proj``, the write-back matrix of the residual stream). The fused
QKV is held as two raw parameters (``qkv_weight``, ``qkv_bias``) that the owning model initialises.

Decoding keeps a key/value cache (:class:`KVCache`, keys already rotated): ``step`` appends one
position and attends from it to every cached key; ``forward(x, return_state=True)`` returns the
cache of the whole sequence, so a prompt is prefilled by one parallel pass.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache(NamedTuple):
    """Keys and values of the positions seen so far, each [B, H, S, head_dim]."""

    keys: torch.Tensor
    values: torch.Tensor


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions on x [B, H, S, hd] at integer positions [S]: the first and second
    halves of each head are rotated pairwise by angle position * base^(-i / (hd / 2))."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angle = positions.to(torch.float64).unsqueeze(-1) * freq  # [S, half]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    """x [B, T, d] -> [B, T, d]; ``rotary_base`` None means no positional information."""

    def __init__(self, d_model: int, n_head: int, rotary_base: float | None = None):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head, self.head_dim, self.rotary_base = n_head, d_model // n_head, rotary_base
        if rotary_base is not None and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {self.head_dim}")
        self.qkv_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.qkv_bias = nn.Parameter(torch.empty(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)

    def project(self, x: torch.Tensor, first_position: int = 0):
        """x [B, T, d] -> q, k, v [B, H, T, hd], q and k rotated to their positions."""
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.unflatten(-1, (3, self.n_head, self.head_dim)).permute(2, 0, 3, 1, 4)
        if self.rotary_base is not None:
            positions = torch.arange(first_position, first_position + x.shape[1], device=x.device)
            q, k = rotate(q, positions, self.rotary_base), rotate(k, positions, self.rotary_base)
        return q, k, v

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        """Heads [B, H, T, hd] -> the output projection of their concatenation [B, T, d]."""
        return self.out_proj(y.transpose(1, 2).flatten(-2))

    def forward(self, x: torch.Tensor, return_state: bool = False):
        """The causal attention of x; with ``return_state`` also the :class:`KVCache` of x."""
        q, k, v = self.project(x)
        out = self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return (out, KVCache(k, v)) if return_state else out

    def init_state(self, batch_size: int, dtype: torch.dtype, device) -> KVCache:
        empty = torch.zeros(batch_size, self.n_head, 0, self.head_dim, dtype=dtype, device=device)
        return KVCache(empty, empty)

    def step(self, x_t: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        """x_t [B, d] at the position after the cache -> (out [B, d], the extended cache)."""
        q, k, v = self.project(x_t.unsqueeze(1), first_position=cache.keys.shape[2])
        cache = KVCache(torch.cat([cache.keys, k], dim=2), torch.cat([cache.values, v], dim=2))
        y = F.scaled_dot_product_attention(q, cache.keys, cache.values)  # one query sees every key
        return self.merge(y)[:, 0], cache
