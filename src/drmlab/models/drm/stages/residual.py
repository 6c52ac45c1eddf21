"""The token residual stage (``docs/drm.md`` section 8): z <- B(z + eta_tok W_tok e_t). No state."""

from __future__ import annotations

import torch.nn.functional as F

from . import stepping
from .base import Block, Stage


class TokenResidualStage(Stage):
    def __init__(self, transition, token_residual):
        super().__init__("token_residual", transition, token_residual=token_residual)

    def token_part(self, e, width=None):
        return self.token_residual(e, width)

    def _add(self, block: Block, part) -> None:
        z = block.z
        if part.shape[-1] != z.shape[-1]:  # sliced rank: the pass's widest width, cut to this block's
            part = part[..., : z.shape[-1]]
        block.z = self.transition.bound(z, block.project(part))

    def forward(self, block: Block, part, state, keep):
        self._add(block, part)
        return None

    def step_token_part(self, e):
        residual = self.token_residual
        return F.linear(e[:, 0], residual.proj.weight) * stepping.scalar(residual.scale, e)

    def step(self, block: Block, part, state):
        block.z = stepping.bound(block.z + block.project(part.unsqueeze(1)), self.config)
        return None

    def step_reference(self, block: Block, part, state):
        self._add(block, part)
        return None
