"""The selective memory stage (``docs/drm.md`` section 9): m_t = f_t * m_{t-1} + u_t from the previous
position's state, m_0 = z_s, then z <- B(z + eta_m m). The block form is one ``linear_scan``; stepping
keeps the previous position's state and m_{t-1}."""

from __future__ import annotations

from typing import NamedTuple

import torch

from drmlab.ops import linear_scan

from .base import Block, Stage


class MemoryState(NamedTuple):
    """The previous position's state [B, 1, d] (the gates read it) and m_{t-1} [B, d]."""

    previous: torch.Tensor
    memory: torch.Tensor


class MemoryStage(Stage):
    def __init__(self, transition, memory):
        super().__init__("memory", transition, memory=memory)

    def token_part(self, e, width=None):
        return self.memory.token_part(e)

    def forward(self, block: Block, part, state, keep):
        f, z = self.transition, block.spread()
        previous = torch.cat([block.anchor, z[:, :-1]], dim=1)
        forget, update = self.memory.gates(f.read(previous), part, block.width)
        m = linear_scan(forget, update, init=block.start)
        kept = MemoryState(z[:, -1:], m[:, -1]) if keep else None
        block.z = f.bound(z + block.project(self.memory.scale * m))
        return kept

    def step(self, block: Block, part, state: MemoryState | None):
        f, z = self.transition, block.z
        previous = block.anchor if state is None else state.previous
        m_prev = block.start if state is None else state.memory
        forget, update = self.memory.gates(f.read(previous), part, block.width)
        m = forget[:, 0] * m_prev + update[:, 0]
        block.z = f.bound(z + block.project(self.memory.scale * m.unsqueeze(1)))
        return MemoryState(z, m)
