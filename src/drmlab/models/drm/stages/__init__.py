"""The stages of the DRM block path (``docs/drm.md`` sections 6-9, A.4 and S), one module each, in the
order the model runs them: geometry and prefix (or the recurrent rollout), block solver, mixer, token
residual, selective memory, refinement layers, consistency losses, fast-weight memory."""

from __future__ import annotations

from .base import Block, BlockGeometry, Stage
from .consistency import ConsistencyStage
from .fast_weight import FastWeightStage
from .geometry import PrefixStage, RecurrentStage
from .memory import MemoryStage
from .mixer import MixerStage
from .refinement import RefinementStage
from .residual import TokenResidualStage
from .solver import SolverStage


def build_stages(model) -> list[Stage]:
    """The active stages of a DRM model, in order, over its modules and its transition."""
    c, f = model.config, model.transition
    stages: list[Stage] = []
    if c.has_geometry:
        stages.append(RecurrentStage(f) if c.sequence_mode == "recurrent" else PrefixStage(f))
    if c.block_solver is not None:
        stages.append(SolverStage(f))
    if model.mixer is not None:
        stages.append(MixerStage(f, model.mixer))
    if model.token_residual is not None:
        stages.append(TokenResidualStage(f, model.token_residual))
    if model.memory is not None:
        stages.append(MemoryStage(f, model.memory))
    stages += [RefinementStage(f, layer, i) for i, layer in enumerate(model.refinement)]
    if c.has_geometry and c.has_consistency_loss and c.sequence_mode == "block_cumsum":
        stages.append(ConsistencyStage(f))
    if model.fast_weight_memory is not None:
        stages.append(FastWeightStage(f, model.fast_weight_memory))
    return stages


__all__ = ["Block", "BlockGeometry", "Stage", "build_stages"]
