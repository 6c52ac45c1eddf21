"""Gate magnitude parameterisations of the resolvent operator (``docs/resolvent.md`` section 7):
maps from a pre-activation ``x`` to the raw magnitude ``u`` that the operator blends (``"clamp"``,
the reference's, which freezes; ``"hard_concrete"``; ``"sigmoid"``, the default) and
:class:`GateHead`, the per-position head ``x -> (u, theta)`` for
:func:`drmlab.resolvent.attention.resolvent_attention`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "clamp_magnitude",
    "hard_concrete_magnitude",
    "sigmoid_magnitude",
    "PARAMETERISATIONS",
    "DEFAULT_PARAMETERISATION",
    "GateHead",
]


def clamp_magnitude(x: torch.Tensor) -> torch.Tensor:
    """The reference operator's magnitude: ``clamp(x, 0, 1)`` (zero gradient outside (0, 1))."""
    return x.clamp(0.0, 1.0)


def hard_concrete_magnitude(x: torch.Tensor) -> torch.Tensor:
    """Hard-concrete (stretched sigmoid) magnitude: ``clamp(1.2 sigmoid(x) - 0.1, 0, 1)``."""
    return (1.2 * torch.sigmoid(x) - 0.1).clamp(0.0, 1.0)


def sigmoid_magnitude(x: torch.Tensor) -> torch.Tensor:
    """Sigmoid magnitude in (0, 1); never closes or fully opens a gate exactly."""
    return torch.sigmoid(x)


PARAMETERISATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "clamp": clamp_magnitude,
    "hard_concrete": hard_concrete_magnitude,
    "sigmoid": sigmoid_magnitude,
}

DEFAULT_PARAMETERISATION = "sigmoid"


class GateHead(nn.Module):
    """Gate magnitude and phase per position from ``x [B, S, d_model]``.

    ``u = param(Linear(d_model, n_heads)(x))`` and ``theta = Linear(d_model, n_heads)(x)``, both
    returned as ``[B, n_heads, S]`` (``n_heads = 1`` shares one gate across attention heads, as
    the reference study did). ``magnitude_bias`` initialises the magnitude pre-activation bias
    (default ``log 9``: ``sigmoid = 0.9``, a gate half-life of about 6.6 positions);
    ``phase=False`` returns ``theta = None``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 1,
        parameterisation: str = DEFAULT_PARAMETERISATION,
        phase: bool = True,
        magnitude_bias: float | None = None,
    ) -> None:
        super().__init__()
        if parameterisation not in PARAMETERISATIONS:
            raise ValueError(
                f"unknown gate parameterisation {parameterisation!r}; use one of {sorted(PARAMETERISATIONS)}"
            )
        self.parameterisation = parameterisation
        self.magnitude = nn.Linear(d_model, n_heads)
        self.phase = nn.Linear(d_model, n_heads) if phase else None
        bias = math.log(9.0) if magnitude_bias is None else float(magnitude_bias)
        with torch.no_grad():
            self.magnitude.bias.fill_(bias)
            if self.phase is not None:
                self.phase.bias.zero_()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        u = PARAMETERISATIONS[self.parameterisation](self.magnitude(x)).transpose(1, 2)
        theta = None if self.phase is None else self.phase(x).transpose(1, 2)
        return u, theta
