r"""The epistemic gates of the fast-weight memory (``docs/drm.md`` section V.4; the upstream
project's ASM-CM-E, ``../shared/notes/upstream-asm.md`` section 3.4).

Two confidences per position, one for the memory's read gate and one for its write gate, from the
memory's gate input h_t = [z_t; e_t; e_{t-1}]:

    c_t = clamp(q_loc(h_t) q_cons(h_t), 0, 1),       u_t = 1 - c_t (the uncertainty)
    q(h) = sigmoid(w . relu(... relu(W_1 h + b_1) ...) + b)        (one MLP per factor)

so four MLPs in all (q_loc and q_cons for the read, the same pair for the write), each with
``fast_weight_confidence_layers`` hidden layers of ``fast_weight_confidence_hidden`` units and
dropout after each hidden layer.  The memory multiplies its read gate by c^r and its hard write gate
by c^w.  Initialisation: PyTorch's defaults, except that each factor's last layer has zero weights
and the bias logit(sqrt(c_0)), so every confidence is exactly c_0 (0.9 upstream) before training.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import DRMConfig

__all__ = ["ConfidenceFactor", "EpistemicGates", "FACTORS"]

# the four factors: (gate, upstream's name of the factor); c^gate = q_loc * q_cons
FACTORS = ("read_loc", "read_cons", "write_loc", "write_cons")

Linear = Callable[[torch.Tensor, nn.Linear], torch.Tensor]
FirstLayer = Callable[[nn.Linear], torch.Tensor]


class ConfidenceFactor(nn.Module):
    """One factor q(h) in (0, 1): hidden ReLU layers (dropout after each), a linear unit, a sigmoid."""

    def __init__(self, width_in: int, hidden: int, layers: int, dropout: float, initial: float):
        super().__init__()
        widths = [width_in] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(hidden, 1)
        self.dropout = dropout
        with torch.no_grad():
            self.out.weight.zero_()
            self.out.bias.fill_(math.log(initial) - math.log1p(-initial))  # logit(initial)

    def forward(
        self, h: torch.Tensor | None, linear: Linear = F.linear, first: FirstLayer | None = None
    ) -> torch.Tensor:
        """q(h) [...] from h [..., width_in]; ``linear(x, layer)`` applies a layer (the memory passes
        one that casts the weights to its compute dtype); ``first(layer)``, where given, applies the first
        hidden layer to h instead (the sliced variable rank, where h is not built at full width)."""
        x = h
        for index, layer in enumerate(self.hidden):
            y = first(layer) if index == 0 and first is not None else linear(x, layer)
            x = F.dropout(torch.relu(y), self.dropout, self.training)
        return torch.sigmoid(linear(x, self.out)).squeeze(-1)


class EpistemicGates(nn.Module):
    """Section V.4: the read and write confidences (c^r, c^w) of the fast-weight memory."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        width_in = c.d_read + 2 * c.d_token  # h_t = [z_t; e_t; e_{t-1}], as the memory's gates see it
        factor_initial = math.sqrt(c.fast_weight_confidence_initial)  # the product starts at c_0
        self.factors = nn.ModuleDict(
            {
                name: ConfidenceFactor(
                    width_in,
                    c.fast_weight_confidence_hidden,
                    c.fast_weight_confidence_layers,
                    c.fast_weight_confidence_dropout,
                    factor_initial,
                )
                for name in FACTORS
            }
        )

    def forward(
        self, h: torch.Tensor | None, linear: Linear = F.linear, first: FirstLayer | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(c^r, c^w), each [B, L], from h [B, L, d_read + 2 d_token] (or ``first``: see ConfidenceFactor)."""
        q = {name: factor(h, linear, first) for name, factor in self.factors.items()}
        read = (q["read_loc"] * q["read_cons"]).clamp(0.0, 1.0)
        write = (q["write_loc"] * q["write_cons"]).clamp(0.0, 1.0)
        return read, write
