"""The block-consistency losses (``docs/drm.md`` section S.4) as a stage of the forward pass: the MSE of
a block's states against a detached sequential rollout from its start (all positions, or one sampled
segment every few blocks). It changes no state, so it has nothing to step."""

from __future__ import annotations

import torch

from .base import Block, Stage


class ConsistencyStage(Stage):
    def __init__(self, transition):
        super().__init__("consistency", transition)

    def forward(self, block: Block, part, state, keep):
        block.record[-1].consistency = self._losses(
            len(block.record) - 1, block.z, block.start, block.flow_tokens, block.strength
        )
        return None

    def step(self, block: Block, part, state):
        return None

    def _losses(self, index, z_final, z_start, token_part, strength) -> dict:
        c, f, out = self.config, self.transition, {}
        weights = c.loss_weights
        if weights.get("block_consistency", 0):
            with torch.no_grad():
                target = f.rollout(z_start.detach(), token_part.detach(), strength)
            err = c.block_consistency_weight * (z_final - target).pow(2).mean(-1)
            out["block_consistency"] = (err.sum(), err.numel())
        if weights.get("sampled_block_consistency", 0) and index % c.sampled_consistency_interval == 0:
            length = z_final.shape[1]
            size = min(c.sampled_consistency_size, length)
            segments = -(-length // size)
            begin = min(((index // c.sampled_consistency_interval) % segments) * size, length - size)
            teacher_start = z_start if begin == 0 else z_final[:, begin - 1]
            with torch.no_grad():
                target = f.rollout(teacher_start.detach(), token_part[:, begin : begin + size].detach(), strength)
            err = c.block_consistency_weight * (z_final[:, begin : begin + size] - target).pow(2).mean(-1)
            out["sampled_block_consistency"] = (err.sum(), err.numel())
        return out
