"""The block solver stage (``docs/drm.md`` sections S.3.3 and S.3.4): the prefix states X of a block
refined towards X = Phi(X), Phi(X)_t = F(X_{t-1}, e_t) with X_0 = z_s, by fixed-point iteration or
(causal) Anderson acceleration. Stepping keeps, for every iteration k, the iterate X_k at the previous
position and, for Anderson, the prefix Gram sums of the residuals, so it equals the block form.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import solvers
from .base import Block, Stage


class SolverState(NamedTuple):
    """X_k at the previous position, one [B, d] per iteration k, and for Anderson the prefix Gram
    sums of the residuals [B, K, K] (None for the fixed-point iteration)."""

    previous: list
    gram: torch.Tensor | None


class SolverStage(Stage):
    """Refines the geometry stage's prefix states; records the residual and the refined velocity."""

    def __init__(self, transition):
        super().__init__("solver", transition)

    def check_steppable(self) -> None:
        c = self.config
        if c.block_solver == "anderson" and not c.solver_causal:
            raise ValueError(
                "the global Anderson form reads later positions of its block (and other batch rows), "
                "so it cannot be stepped; use solver_causal=True"
            )

    def _solve(self, z, anchor, token_part, strength) -> solvers.BlockSolution:
        """The block refiner over the prefix states z [B, L, d] (the caller bounds the solution's X)."""
        c, f = self.config, self.transition

        def phi(x):  # Phi(X)_t = F(X_{t-1}, e_t), X_0 = z_s
            return f.one_token(torch.cat([anchor, x[:, :-1]], dim=1), token_part, strength)

        if c.block_solver == "fixed_point":
            return solvers.fixed_point(phi, z, c.solver_iters, c.solver_relaxation)
        return solvers.anderson(
            phi, z, c.solver_iters, c.anderson_history, c.anderson_ridge, c.solver_relaxation, causal=c.solver_causal
        )

    def forward(self, block: Block, part, state, keep):
        c, anchor = self.config, block.anchor
        solution = self._solve(block.z, anchor, block.flow_tokens, block.strength)
        z, block.record[-1].solver_residual = self.transition.bound(solution.x), solution.residual
        block.record[-1].refined_velocity = (z - torch.cat([anchor, z[:, :-1]], dim=1)) / c.dt
        block.z = z
        if not keep:
            return None
        gram = None
        if c.block_solver == "anderson":
            stacked = torch.stack(solution.residuals, dim=-2)  # [B, L, K, d]
            gram = (stacked @ stacked.transpose(-1, -2)).sum(dim=1)
        return SolverState([x[:, -1] for x in solution.iterates], gram)

    def step(self, block: Block, part, state: SolverState | None):
        self.check_steppable()
        c, f, strength = self.config, self.transition, block.strength
        fresh, token_part = state is None, block.flow_tokens[:, 0]
        iterations, x = c.solver_iters, block.z[:, 0]
        previous = [block.start] * iterations if fresh else state.previous
        kept = []
        if c.block_solver == "fixed_point":
            for k in range(iterations):
                kept.append(x)
                x = x + c.solver_relaxation * (f.one_token(previous[k], token_part, strength) - x)
            block.z = f.bound(x).unsqueeze(1)
            return SolverState(kept, None)
        gram = x.new_zeros(x.shape[0], iterations, iterations) if fresh else state.gram.clone()
        fs, rs = [], []
        for k in range(iterations):
            kept.append(x)
            value = f.one_token(previous[k], token_part, strength)
            fs.append(value)
            rs.append(value - x)
            dots = torch.stack([(rs[k] * r).sum(-1) for r in rs], dim=-1)  # [B, k + 1]
            gram[:, k, : k + 1] += dots
            gram[:, :k, k] += dots[:, :k]
            window = list(range(max(0, k - c.anderson_history + 1), k + 1))
            if len(window) < 2:
                x = x + c.solver_relaxation * rs[k]
                continue
            weights = solvers._anderson_weights(gram[:, window][:, :, window], c.anderson_ridge)
            mixed = (weights.unsqueeze(-1) * torch.stack([fs[j] for j in window], dim=1)).sum(1)
            x = x + c.solver_relaxation * (mixed - x)
        block.z = f.bound(x).unsqueeze(1)
        return SolverState(kept, gram)
