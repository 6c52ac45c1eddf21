"""The geometry and prefix stage (``docs/drm.md`` sections 6 and 7, A.4.1) and its recurrent form.

``block_cumsum``: the geometry is evaluated once at the block start z_s, the local deltas
delta_t = F_s(z_s, e_t) - z_s are prefix-summed and bounded, z~_t = B(z_s + sum_{k<=t} delta_k).
Stepping keeps the block-start geometry (and metric-first frame) and the unbounded running sum; the
fast step also keeps what the transition computes from the block start alone (:class:`StepConstants`).
``recurrent`` (section 6): z_{t+1} = F(z_t, e_t) with the geometry recomputed at every token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..rank import fit_width
from . import stepping
from .base import Block, BlockGeometry, Stage


class StepConstants(NamedTuple):
    """What the one-token velocity at the block start z_s reads that does not depend on the token,
    computed once per block by the reference's own operations (``docs/drm.md`` section A.4.5).

    ``state_part`` [B, H]: the first layer's state half at z_s; ``gates`` [B, n] (None without
    directions); ``directions`` [B, n, d]: V, or the metric-first blend (1 - s) V + s F (section U);
    ``solve``: the Woodbury pieces of (G + lambda I)^-1 at z_s (section 5), (d + lambda as [B, 1, d],
    U, D'^-1 U, the Cholesky factor of the capacitance), with None for U's three on a rank-0 metric,
    or None where the velocity is not naturalized; ``dim_d`` [B]; ``strength``: the s they hold."""

    strength: float
    state_part: torch.Tensor
    gates: torch.Tensor | None
    directions: torch.Tensor | None
    solve: tuple | None
    dim_d: torch.Tensor


class PrefixState(NamedTuple):
    """Inside an open block: the block-start geometry (gates, directions, gamma, U, rho), its
    metric-first frame (None where unused), the running delta sum [B, 1, d] and the fast step's
    :class:`StepConstants` (None until a fast step or a prefill computes them)."""

    geometry: tuple
    frame: torch.Tensor | None
    delta_sum: torch.Tensor
    constants: StepConstants | None = None

    # derived from the rest (recomputable); not counted as the state a sequence carries (state_nbytes)
    CACHE_FIELDS = ("constants",)


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
        if not keep:
            return None
        return PrefixState(geometry, frame, delta_sum[:, -1:], self._constants(block, geometry, frame))

    def _constants(self, block: Block, geometry: tuple, frame) -> StepConstants | None:
        """The block's :class:`StepConstants` where the fast step runs (None elsewhere), each by the
        reference's operations on the reference's operands (``Transition.velocity``, ``naturalize``,
        ``woodbury_solve``, ``compose_metric_first``)."""
        c, f, strength = self.config, self.transition, block.strength
        if c.step_mode != "velocity" or not stepping.fast_step_supported(block.start):
            return None
        if block.width is not None:  # the sliced variable rank (docs/variable-rank.md section 5): the plain step
            return None
        if c.metric == "pullback" or c.has_degenerate_metric:  # their naturalizers (metric_options): the plain step
            return None
        gates, directions, gamma, u_factor, rho = geometry
        module = f.flow if directions is not None else f.direct_transition
        state_part = F.linear(f.read(block.start), module.fc1.weight[:, : module.d_read])
        if directions is not None and f.metric_first and strength > 0:
            directions = (1.0 - strength) * directions + strength * frame
        solve = None
        if gamma is not None and strength > 0 and (directions is None or not f.metric_first):
            damped = gamma + c.metric_damping
            solve = (damped.unsqueeze(-2), None, None, None)
            if u_factor.shape[-1]:
                scaled = u_factor / damped.unsqueeze(-1)
                eye = torch.eye(u_factor.shape[-1], dtype=u_factor.dtype, device=u_factor.device)
                capacitance = eye + u_factor.mT @ scaled
                capacitance = 0.5 * (capacitance + capacitance.mT)
                solve = (solve[0], u_factor, scaled, torch.linalg.cholesky(capacitance))
        dim_d = gates.sum(-1) if gates is not None else rho.new_zeros(block.start.shape[0])
        return StepConstants(strength, state_part, gates, directions, solve, dim_d)

    def step(self, block: Block, part, state: PrefixState | None):
        """The fast step: :meth:`step_reference`'s values from the block's :class:`StepConstants`."""
        constants = None if state is None else state.constants
        if constants is None or constants.strength != block.strength:
            if state is None:
                geometry = self.transition.geometry_at(block.start, block.width)
                frame = self.transition.metric_frame(geometry, block.strength)
            else:
                geometry, frame = state.geometry, state.frame
            constants = self._constants(block, geometry, frame)
            if constants is None:
                return self.step_reference(block, part.unsqueeze(1), state)  # the 2-D rows as token_part gives them
            state = PrefixState(geometry, frame, None if state is None else state.delta_sum, constants)
        c, k, anchor = self.config, constants, block.anchor
        module = self.transition.flow if k.directions is not None else self.transition.direct_transition
        v = torch.tanh(F.linear(F.gelu(k.state_part + part), module.fc2.weight, module.fc2.bias))
        if k.directions is not None:
            v = (v * k.gates).unsqueeze(1) @ k.directions  # [B, 1, d]
        else:
            v = v.unsqueeze(1)
        if k.solve is not None:
            damped, u_factor, scaled, chol = k.solve
            solved = v / damped
            if u_factor is not None:
                solved = solved - (scaled @ torch.cholesky_solve((solved @ u_factor).mT, chol)).mT
            v = v * stepping.scalar(1.0 - k.strength, v) + solved * stepping.scalar(k.strength, v)
        v = block.project(v)  # variable rank: P(v) before it enters the state, as Transition.endpoints
        delta = stepping.bound(anchor + v * stepping.scalar(c.dt, v), c) - anchor
        delta_sum = delta if state.delta_sum is None else state.delta_sum + delta
        block.z, block.delta = stepping.bound(anchor + delta_sum, c), delta
        block.rho, block.dim_d, block.flow_tokens = state.geometry[4], k.dim_d, part.unsqueeze(1)
        return PrefixState(state.geometry, state.frame, delta_sum, k)

    def step_token_part(self, e):
        return self.transition.token_part(e[:, 0])

    def step_reference(self, block: Block, part, state: PrefixState | None):
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
