"""The geometry and prefix stage (``docs/drm.md`` sections 6 and 7, A.4.1) and its recurrent form.

``block_cumsum``: the geometry is evaluated once at the block start z_s, the local deltas
delta_t = F_s(z_s, e_t) - z_s are prefix-summed and bounded, z~_t = B(z_s + sum_{k<=t} delta_k).
Stepping keeps the block-start geometry (and metric-first frame) and the unbounded running sum.
``recurrent`` (section 6): z_{t+1} = F(z_t, e_t) with the geometry recomputed at every token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..rank import fit_width
from .base import Block, BlockGeometry, Stage


class PrefixState(NamedTuple):
    """Inside an open block: the block-start geometry (gates, directions, gamma, U, rho), its
    metric-first frame (None where unused) and the running delta sum [B, 1, d]."""

    geometry: tuple
    frame: torch.Tensor | None
    delta_sum: torch.Tensor


class PrefixStage(Stage):
    """Section 7 with the geometry at the block start; records the block's geometry."""

    def __init__(self, transition):
        super().__init__("geometry", transition)

    def token_part(self, e, width=None):
        return self.transition.token_part(e)

    def _endpoints(self, block: Block, geometry, frame, part):
        """The one-token endpoints from the block start; under variable rank the velocity is projected
        onto the block's rank before it enters the state (docs/variable-rank.md section 2)."""
        project = None if block.rank is None else block.project
        return self.transition.endpoints(block.start, geometry, part, block.strength, frame, project, block.width)

    def forward(self, block: Block, part, state, keep):
        f, anchor = self.transition, block.anchor
        geometry = f.geometry_at(block.start, block.width)
        frame = f.metric_frame(geometry, block.strength)  # section U: once per block and sample
        delta = self._endpoints(block, geometry, frame, part) - anchor
        delta_sum = delta.cumsum(dim=1)
        _hand_on(block, f.bound(anchor + delta_sum), delta, geometry, part)
        velocity = delta if block.width is None else fit_width(delta, self.config.d_state)  # the record is full width
        block.record.append(BlockGeometry(delta.shape[1], *geometry, velocity / self.config.dt))
        return PrefixState(geometry, frame, delta_sum[:, -1:]) if keep else None

    def step(self, block: Block, part, state: PrefixState | None):
        f, anchor = self.transition, block.anchor
        if state is None:
            geometry = f.geometry_at(block.start, block.width)
            frame = f.metric_frame(geometry, block.strength)
        else:
            geometry, frame = state.geometry, state.frame
        delta = self._endpoints(block, geometry, frame, part) - anchor
        delta_sum = delta if state is None else state.delta_sum + delta
        _hand_on(block, f.bound(anchor + delta_sum), delta, geometry, part)
        return PrefixState(geometry, frame, delta_sum)


def _hand_on(block: Block, z, delta, geometry, part) -> None:
    """What the later stages read: the prefix states, the increments, dimD and rho at the block
    start, and the transition's token part."""
    gates, rho = geometry[0], geometry[4]
    block.z, block.delta, block.rho, block.flow_tokens = z, delta, rho, part
    block.dim_d = gates.sum(-1) if gates is not None else rho.new_zeros(block.start.shape[0])


class RecurrentStage(Stage):
    """Section 6: the Euler rollout. ``forward`` runs it over the whole sequence (the model hands a
    recurrent model's sequence over as one block) and records each position's geometry; ``step`` is
    one transition (in decoding every token is a block of its own), so the stage keeps no state."""

    def __init__(self, transition):
        super().__init__("geometry", transition)

    def token_part(self, e, width=None):
        return self.transition.token_part(e)

    def forward(self, block: Block, part, state, keep):
        f, z, outputs = self.transition, block.start, []
        for t in range(part.shape[1]):
            geometry = f.geometry_at(z)
            z_next = f.endpoints(z, geometry, part[:, t : t + 1], block.strength)[:, 0]
            block.record.append(BlockGeometry(1, *geometry, ((z_next - z) / self.config.dt).unsqueeze(1)))
            z = z_next
            outputs.append(z)
        block.z = torch.stack(outputs, dim=1)
        return None

    def step(self, block: Block, part, state):
        f = self.transition
        block.z = f.endpoints(block.start, f.geometry_at(block.start), part, block.strength)
        return None
