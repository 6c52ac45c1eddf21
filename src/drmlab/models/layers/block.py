r"""The pre-LN residual block of GPT-2 style transformers (Radford et al. 2019), shared by LOOPED
(``docs/looped.md`` section 1.2) and the resolvent model and its twins (``docs/resolvent.md``
section 8):

    x <- x + s · Mixer(LN1(x));   x <- x + s · MLP(LN2(x)),   MLP(z) = W2 GELU(W1 z + b1) + b2

with the exact (erf) GELU. The scale s is absent (RESOLVENT*), a number passed at call time (LOOPED's
residual scale ε), or ε·λ with a learnable λ (init 1) when ``learnable_scale``. The mixer is any
module with ``forward(h, return_state=False)``, ``init_state(batch, dtype, device)``,
``step(h_t, state)`` and an ``out_proj`` Linear (attention, a selective SSM, Mamba's mixer).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """W2 GELU(W1 z + b1) + b2; ``proj`` (W2) writes back to the residual stream."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)  # W1
        self.proj = nn.Linear(hidden, d_model)  # W2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class PreLNBlock(nn.Module):
    """One pre-LN block around ``mixer``; see the module docstring."""

    def __init__(
        self,
        mixer: nn.Module,
        d_model: int,
        mlp_ratio: int = 4,
        layer_norm_eps: float = 1e-5,
        learnable_scale: bool = False,
    ):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.mixer = mixer
        self.ln2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.mlp = MLP(d_model, mlp_ratio * d_model)
        self.lam = nn.Parameter(torch.ones(())) if learnable_scale else None

    def scale(self, eps: float | None):
        """s: None (unscaled), eps, or eps·λ."""
        return eps * self.lam if self.lam is not None else eps

    def _residual(self, x: torch.Tensor, update: torch.Tensor, s) -> torch.Tensor:
        return x + update if s is None else x + s * update

    def forward(self, x: torch.Tensor, eps: float | None = None, return_state: bool = False):
        """x [B, T, d] -> [B, T, d]; with ``return_state`` also the mixer's decode state after x."""
        s = self.scale(eps)
        mixed = self.mixer(self.ln1(x), return_state=return_state)
        mixed, state = mixed if return_state else (mixed, None)
        x = self._residual(x, mixed, s)
        x = self._residual(x, self.mlp(self.ln2(x)), s)
        return (x, state) if return_state else x

    def init_state(self, batch_size: int, dtype: torch.dtype, device):
        return self.mixer.init_state(batch_size, dtype=dtype, device=device)

    def step(self, x_t: torch.Tensor, state, eps: float | None = None):
        """One position x_t [B, d] -> (x_t after the block, the mixer's new state)."""
        s = self.scale(eps)
        out, state = self.mixer.step(self.ln1(x_t), state)
        x_t = self._residual(x_t, out, s)
        return self._residual(x_t, self.mlp(self.ln2(x_t)), s), state

    def write_back_weights(self) -> list[torch.Tensor]:
        """The matrices writing into the residual stream (re-drawn by GPT-2's depth-scaled init)."""
        return [self.mixer.out_proj.weight, self.mlp.proj.weight]
