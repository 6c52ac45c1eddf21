"""The fast-weight memory stage (``docs/drm.md`` section V): z' = z + the memory's read, written as it
goes (:class:`~drmlab.models.drm.fast_weight.FastWeightMemory`). Its state (the fast and slow matrices
and the previous token) is the only one that crosses block boundaries. With the epistemic gates
(section V.4) the parallel pass leaves their confidences on the block's geometry record."""

from __future__ import annotations

from .base import Block, Stage


class FastWeightStage(Stage):
    crosses_blocks = True

    def __init__(self, transition, memory):
        super().__init__("fast_weight_memory", transition, fast_weight_memory=memory)

    def init_state(self, batch, like):
        return self.fast_weight_memory.init_state(batch, like)

    def _run(self, block: Block, state):
        rank = block.rank if self.config.rank_aware_memory else None  # docs/variable-rank.md section 6
        block.z, state, confidence = self.fast_weight_memory(
            block.z, self.transition.read(block.z), block.tokens, state, return_confidence=True, rank=rank
        )
        if confidence is not None and block.record:  # the record of this block (the geometry stage's)
            block.record[-1].fast_weight_confidence = confidence
        return state

    def forward(self, block: Block, part, state, keep):
        return self._run(block, state)

    def step(self, block: Block, part, state):
        return self._run(block, state)
