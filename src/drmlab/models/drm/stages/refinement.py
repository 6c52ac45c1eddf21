"""A refinement stage (variant G, ``docs/drm.md`` section A.3.13): z_t <- B(z_t + eta dt Nat(u(z_{t-1}, e_t)))
with the layer's own direction field, metric and flow evaluated at each position's previous state.
Stepping keeps the previous position's input state."""

from __future__ import annotations

import torch

from ..components import compose_metric_first, naturalize, raw_velocity
from .base import Block, Stage


class RefinementStage(Stage):
    def __init__(self, transition, layer, index: int):
        super().__init__(f"refinement.{index}", transition, layer=layer)

    def token_part(self, e, width=None):
        return self.layer.flow.token_part(e)

    def _refine(self, z, anchor, token_part, strength):
        c, f, layer = self.config, self.transition, self.layer
        previous = f.read(torch.cat([anchor, z[:, :-1]], dim=1))  # [B, L, d_read]
        directions, gates = layer.direction_field(previous)  # [B, L, n, d], [B, L, n]
        coeff = layer.flow(previous, token_part)  # [B, L, n]
        gamma, u_factor = layer.metric(previous)
        if f.metric_first:  # section U, with each position's own geometry
            frame = f.metric_frame((gates, directions, gamma, u_factor, None), strength)
            v = compose_metric_first(gates, coeff.unsqueeze(-2), directions, frame, strength).squeeze(-2)
        else:
            v = raw_velocity(gates, coeff.unsqueeze(-2), directions)  # [B, L, 1, d]
            v = naturalize(v, gamma, u_factor, strength, c.metric_damping).squeeze(-2)
        return f.bound(z + c.refinement_scale * c.dt * v)

    def forward(self, block: Block, part, state, keep):
        kept = block.z[:, -1:] if keep else None
        block.z = self._refine(block.z, block.anchor, part, block.strength)
        return kept

    def step(self, block: Block, part, state):
        previous = block.anchor if state is None else state
        kept, block.z = block.z, self._refine(block.z, previous, part, block.strength)
        return kept
