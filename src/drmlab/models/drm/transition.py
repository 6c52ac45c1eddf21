"""The one-token transition F(z, e) of ``docs/drm.md`` sections 2-6 and S.0, over the model's geometry modules.

The geometry at a state (directions and gates, metric, risk; section 2, 4 and A.3.9), the
naturalized velocity (sections 3, 5 and U), the endpoint under ``step_mode`` (section S) and the
exact sequential rollout. The block path's stages share one :class:`Transition`: the geometry stage
evaluates it at each block start, the block solver and the consistency loss at every position.
"""

from __future__ import annotations

import torch

from drmlab.ops.state_bound import state_bound

from . import solvers
from .components import bound_state, compose_metric_first, metric_first_frame, raw_velocity, toroidal_lift
from .config import DRMConfig
from .metric_options import naturalizer


class Transition:
    """F over the model's direction field, metric, flow (or direct transition) and risk field.

    Not an ``nn.Module``: it owns nothing. The modules stay the model's attributes, so their parameters
    keep their names (``flow.fc1.weight``, ...) and their order; absent ones are None.
    """

    def __init__(self, config: DRMConfig, direction_field, metric, flow, direct_transition, risk):
        self.config = config
        self.direction_field, self.metric, self.flow = direction_field, metric, flow
        self.direct_transition, self.risk = direct_transition, risk
        self.naturalize = naturalizer(config)  # section 5, or the metric option's (docs/geometry.md 8, 9)

    def read(self, z: torch.Tensor) -> torch.Tensor:
        """The state as every reader sees it (section 16: toroidal coordinates as cos/sin), contiguous:
        the readers' matmuls would otherwise pick their kernel by whether the weights require grad
        (see DRMStateInitializer), and a frozen model would differ from a trainable one."""
        return toroidal_lift(z, self.config.toroidal_dims).contiguous()

    def bound(self, z: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """B(z + x) (B(z) without x; the sum itself where the state is unbounded): the fused
        :func:`~drmlab.ops.state_bound` where it applies, else :func:`bound_state`."""
        c = self.config
        if not c.bounded_state:
            return z if x is None else z + x
        if not c.toroidal_dims:
            return state_bound(z, c.state_clip_norm, x)
        return bound_state(z if x is None else z + x, c.state_clip_norm, c.toroidal_dims)

    @property
    def metric_first(self) -> bool:
        """Whether the metric meets the directions through a metric-first composition (section U)."""
        return self.config.directional_metric_composition != "post_naturalize"

    def token_part(self, e: torch.Tensor) -> torch.Tensor:
        """The flow's (or direct transition's) first-layer token projection of e [B, T, d_token]."""
        module = self.flow if self.flow is not None else self.direct_transition
        return module.token_part(e)

    def geometry_at(self, z: torch.Tensor, width: int | None = None) -> tuple:
        """(gates, directions, gamma, U, rho) at states z [N, d] (None for absent modules). ``width``: z
        holds the state's first ``width`` coordinates only (variable rank, docs/variable-rank.md section 5);
        the metric is still full width."""
        z_read = self.read(z)
        gates = directions = gamma = u_factor = None
        if self.direction_field is not None:
            directions, gates = self.direction_field(z_read)
        if self.metric is not None:
            gamma, u_factor = self.metric(z_read, width)
        rho = self.risk(z_read, width) if self.risk is not None else z_read.new_zeros(z_read.shape[:-1])
        return gates, directions, gamma, u_factor, rho

    def metric_frame(self, geometry: tuple, strength: float) -> torch.Tensor | None:
        """Section U: the metric-first frame F [N..., n, d] at a geometry (one Gram and one solve or
        Cholesky per sample); None where the composition is post-naturalization or s <= 0."""
        _, directions, gamma, u_factor, _ = geometry
        if not self.metric_first or strength <= 0:
            return None
        c = self.config
        return metric_first_frame(directions, gamma, u_factor, c.metric_damping, c.directional_metric_composition)

    def velocity(
        self,
        z: torch.Tensor,
        geometry: tuple,
        token_part: torch.Tensor,
        strength: float,
        frame: torch.Tensor | None = None,
        width: int | None = None,
    ) -> torch.Tensor:
        """Naturalized velocity at z for each position's token: token_part [N, L, H] -> [N, L, d].

        With a metric-first composition (section U) the velocity is composed in span(V) from the
        frame of :meth:`metric_frame` (``frame``, when the caller holds it for the block; computed here otherwise).
        ``width`` (direct transition only): z holds the state's first ``width`` coordinates and only the
        velocity's first ``width`` are returned; the metric's solve couples every coordinate, so with a
        metric the transition's output and the solve stay full width (docs/variable-rank.md section 5)."""
        gates, directions, gamma, u_factor, _ = geometry
        z_read = self.read(z).unsqueeze(-2)
        if directions is not None:
            coeff = self.flow(z_read, token_part)
            if self.metric_first:
                frame = frame if frame is not None else self.metric_frame(geometry, strength)
                return compose_metric_first(gates, coeff, directions, frame, strength)
            v = raw_velocity(gates, coeff, directions)
        else:
            v = self.direct_transition(z_read, token_part, width, None if gamma is not None else width)
        if gamma is not None:
            v = self.naturalize(v, gamma, u_factor, strength, self.config.metric_damping)
            if width is not None:
                v = v[..., :width]
        return v

    def endpoints(
        self,
        z: torch.Tensor,
        geometry: tuple,
        token_part: torch.Tensor,
        strength: float,
        frame: torch.Tensor | None = None,
        project=None,
        width: int | None = None,
    ) -> torch.Tensor:
        """One-token endpoints from z [N..., d] with the geometry at z, under ``step_mode``.

        token_part [N..., L, H] -> [N..., L, d]. ``velocity`` gives the Euler anchor
        z^a = B(z + dt v); ``candidate`` and ``geodesic`` start from it (``solvers``). ``frame``: the
        metric-first frame at this geometry, if the caller already holds it (section U). ``project``: the
        block's rank projection of the velocity before it enters the state, ``width`` its width (variable
        rank, docs/variable-rank.md section 2).
        """
        v = self.velocity(z, geometry, token_part, strength, frame, width)
        if project is not None:
            v = project(v)
        start = z.unsqueeze(-2)
        anchor = self.bound(start + self.config.dt * v)
        if self.config.step_mode == "candidate":
            return solvers.candidate_step(self, start, anchor, geometry)
        if self.config.step_mode == "geodesic":
            return solvers.geodesic_step(self, start, anchor, geometry)
        return anchor

    def one_token(self, z: torch.Tensor, token_part: torch.Tensor, strength: float) -> torch.Tensor:
        """F(z, e): the one-token transition with the geometry recomputed at z (``docs/drm.md`` section S.0).

        z [N..., d], token_part [N..., H] -> [N..., d]. In velocity mode F = B(z^a), the bound applied twice.
        """
        out = self.endpoints(z, self.geometry_at(z), token_part.unsqueeze(-2), strength).squeeze(-2)
        return self.bound(out) if self.config.step_mode == "velocity" else out

    def rollout(self, z_start: torch.Tensor, token_part: torch.Tensor, strength: float) -> torch.Tensor:
        """The exact sequential rollout z_t = F(z_{t-1}, e_t) from z_start [B, d]: [B, L, d]."""
        z, outputs = z_start, []
        for t in range(token_part.shape[1]):
            z = self.one_token(z, token_part[:, t], strength)
            outputs.append(z)
        return torch.stack(outputs, dim=1)
