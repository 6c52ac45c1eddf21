"""The selective memory stage (``docs/drm.md`` section 9): m_t = f_t * m_{t-1} + u_t from the previous
position's state, m_0 = z_s, then z <- B(z + eta_m m). The block form is one ``linear_scan``; stepping
keeps the previous position's state and m_{t-1}; the fast step runs ``SelectiveMemory.gates`` over
2-D rows without its casts and autocast guard (no-ops where it runs)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from drmlab.ops import linear_scan
from drmlab.ops.fusion import fused_enabled

from . import stepping
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
        weight = block.once(f"{self.name}:{block.width}", lambda: self.memory.state_weight(block.width))
        packed = None
        if fused_enabled():  # the three gate layers as one product, stacked once per pass
            packed = block.once(f"{self.name}:packed:{block.width}", lambda: self.memory.packed_gates(block.width))
        forget, update = self.memory.gates(f.read(previous), part, weight, block.width, packed)
        m = linear_scan(forget, update, init=block.start)
        kept = MemoryState(z[:, -1:], m[:, -1]) if keep else None
        block.z = f.bound(z, block.project(self.memory.scale * m))
        return kept

    def step_token_part(self, e):
        memory = self.memory
        return F.linear(e[:, 0], memory.in_proj.weight[:, memory.d_read :], memory.in_proj.bias)

    def step(self, block: Block, part, state: MemoryState | None):
        """The fast step: :meth:`step_reference`'s values."""
        memory, z = self.memory, block.z
        previous = block.anchor if state is None else state.previous
        m_prev = block.start if state is None else state.memory
        h = F.silu(F.linear(self.transition.read(previous[:, 0]), memory.in_proj.weight[:, : memory.d_read]) + part)
        forget = F.linear(h, memory.forget.weight, memory.forget.bias) + stepping.scalar(memory.forget_bias, h)
        forget = torch.sigmoid(forget)
        update = torch.sigmoid(F.linear(h, memory.write.weight, memory.write.bias)) * torch.tanh(
            F.linear(h, memory.candidate.weight, memory.candidate.bias)
        )
        m = forget * m_prev + update
        block.z = stepping.bound(z + block.project((m * stepping.scalar(memory.scale, m)).unsqueeze(1)), self.config)
        return MemoryState(z, m)

    def step_reference(self, block: Block, part, state: MemoryState | None):
        f, z = self.transition, block.z
        previous = block.anchor if state is None else state.previous
        m_prev = block.start if state is None else state.memory
        forget, update = self.memory.gates(f.read(previous), part, width=block.width)
        m = forget[:, 0] * m_prev + update[:, 0]
        block.z = f.bound(z + block.project(self.memory.scale * m.unsqueeze(1)))
        return MemoryState(z, m)
