"""Counting a built model's parameters: the one ``count_parameters``.

Each family also has a ``closed_form_parameter_count(config)`` that predicts the count from a
config without building the model (used to match widths across families); the tests check that
the two agree.
"""

from __future__ import annotations

import torch.nn as nn


def count_parameters(model: nn.Module) -> int:
    """The number of parameters of ``model`` (a tied weight counted once)."""
    return sum(p.numel() for p in model.parameters())
