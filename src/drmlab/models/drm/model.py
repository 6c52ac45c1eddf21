"""The DRM language model: embedding -> latent state path -> emitter (``docs/drm.md`` sections 1-13).

Two sequence paths:

* ``block_cumsum`` (sections 7, A.4.1 and A.4.2): per block of L tokens the
  geometry is evaluated once at the block-start state z_s, the local deltas
  delta_t = B(z_s + dt v_t) - z_s are prefix-summed, then the causal mixer, the
  token residual and the selective memory each add a bounded correction; the last
  state of a block starts the next. SSM_CONTROL takes the geometry-free form.
* ``recurrent`` (section 6): the Euler rollout z_{t+1} = B(z_t + dt v_t) with the
  geometry recomputed at every token.

Everything that depends only on the tokens (first-layer token projections of the
flow, mixer and memory, the token residual) is computed once for the whole sequence;
only state-dependent work runs inside the block loop.

Decoding (section A.4.5): ``init_state`` / ``step`` continue the same block path one token at a
time, and ``forward(tokens, return_state=True)`` returns, from the parallel pass, the state that
stepping through the tokens would reach -- mid-block included -- so a prompt needs no stepping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from drmlab.models.inputs import check_batch_size, check_step_tokens, check_tokens
from drmlab.models.output import ModelOutput
from drmlab.ops import linear_scan

from .components import (
    CausalConvMixer,
    DirectionField,
    DirectStateTransition,
    DRMFlow,
    DRMStateInitializer,
    LanguageEmitter,
    RefinementLayer,
    RelationalMetric,
    RiskField,
    SelectiveMemory,
    TokenStateResidual,
    bound_state,
    compose_metric_first,
    metric_first_frame,
    naturalize,
    raw_velocity,
    toroidal_lift,
)
from . import solvers
from .config import DRMConfig
from .fast_weight import FastWeightMemory
from .losses import auxiliary_losses

# Per-component seed offsets (``docs/drm.md`` section A.2): each component draws its
# initialisation from the stream seed + offset, so removing one never changes another.
SEED_OFFSETS = {
    "embedding": 101, "initial_state": 102, "direction_field": 103, "metric": 104, "flow": 105,
    "risk": 106, "emitter": 107, "mixer": 108, "token_residual": 109, "memory": 110,
    "refinement": 111, "direct_transition": 112, "fast_weight_memory": 113,
}


@dataclass
class BlockGeometry:
    """What one block (or one recurrent step) leaves for the losses and diagnostics."""

    length: int
    gates: torch.Tensor | None  # [B, n] block-start gates (None without a direction field)
    directions: torch.Tensor | None  # [B, n, d]
    gamma: torch.Tensor | None  # [B, d] metric diagonal (None without a metric)
    u_factor: torch.Tensor | None  # [B, d, r]
    rho: torch.Tensor  # [B] risk mass
    velocity: torch.Tensor  # [B, L, d] delta_t / dt (includes the bound's effect)
    refined_velocity: torch.Tensor | None = None  # [B, L, d] of the solver-refined states
    solver_residual: torch.Tensor | None = None  # [B, L] |Phi(X) - X| at the last iteration
    consistency: tuple | None = None  # {"block_consistency": (sum, count), ...}


@dataclass
class DecodeState:
    """Everything :meth:`DRMModel.step` needs to continue the block path in O(1) per token
    (``docs/drm.md`` section A.4.5): the block-start state and its geometry, the running delta sum,
    the previous prefix state, each mixer layer's left context, the memory path's previous
    state and memory, and each refinement layer's previous input."""

    z_start: torch.Tensor
    position: int = 0  # position inside the current block
    geometry: tuple | None = None  # (gates, directions, gamma, U, rho) at z_start
    delta_sum: torch.Tensor | None = None
    z_tilde_prev: torch.Tensor | None = None
    mixer_context: list | None = None
    memory_prev_state: torch.Tensor | None = None
    memory: torch.Tensor | None = None
    refine_prev: list | None = None
    solver_prev: list | None = None  # X_k at the previous position, one per solver iteration
    solver_gram: torch.Tensor | None = None  # causal Anderson: prefix Gram sums [B, K, K]
    metric_frame: torch.Tensor | None = None  # section U: the block's metric-first frame F [B, n, d]
    fast_weight: object | None = None  # section V: the fast-weight memory's FastWeightState (crosses blocks)


@dataclass
class TokenParts:
    """What the block path needs from the tokens alone, [B, T, ...] each (None where the component
    is absent): the flow's, mixer's and memory's token projections, the token residual, and each
    refinement layer's flow projection."""

    flow: torch.Tensor | None
    mixer: torch.Tensor | None
    residual: torch.Tensor | None
    memory: torch.Tensor | None
    refine: list

    def window(self, positions: slice) -> "TokenParts":
        def cut(part):
            return None if part is None else part[:, positions]
        return TokenParts(cut(self.flow), cut(self.mixer), cut(self.residual), cut(self.memory),
                          [part[:, positions] for part in self.refine])


class DRMModel(nn.Module):
    """One member of the DRM family, configured by a :class:`DRMConfig`."""

    def __init__(self, config: DRMConfig, seed: int = 0, name: str = "DRM", preset: str = "custom"):
        super().__init__()
        config.validate()
        self.config, self.seed, self.model_name, self.preset = config, seed, name, preset
        c = config

        def seeded(component: str, build):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + SEED_OFFSETS[component])
                return build()

        self.embedding = seeded("embedding", lambda: nn.Embedding(c.vocab_size, c.d_token))
        self.initial_state = seeded("initial_state", lambda: DRMStateInitializer(c))
        self.direction_field = seeded("direction_field", lambda: DirectionField(c)) if c.has_direction_field else None
        self.metric = seeded("metric", lambda: RelationalMetric(c)) if c.has_metric else None
        self.flow = seeded("flow", lambda: DRMFlow(c)) if c.has_direction_field else None
        self.risk = (seeded("risk", lambda: RiskField(c, enabled=c.risk == "powerlaw"))
                     if c.has_geometry and c.risk != "none" else None)
        self.emitter = seeded("emitter", lambda: LanguageEmitter(c))
        self.mixer = seeded("mixer", lambda: CausalConvMixer(c)) if c.mixer == "causal_conv" else None
        self.token_residual = seeded("token_residual", lambda: TokenStateResidual(c)) if c.token_state_residual else None
        self.memory = seeded("memory", lambda: SelectiveMemory(c)) if c.selective_memory else None
        self.refinement = seeded("refinement", lambda: nn.ModuleList(
            RefinementLayer(c) for _ in range(c.refinement_layers if c.has_geometry else 0)))
        self.direct_transition = (seeded("direct_transition", lambda: DirectStateTransition(c))
                                  if c.has_direct_transition else None)
        self.fast_weight_memory = (seeded("fast_weight_memory", lambda: FastWeightMemory(c))
                                   if c.fast_weight_memory else None)

    # ------------------------------------------------------------------ small helpers
    def read(self, z: torch.Tensor) -> torch.Tensor:
        """The state as every reader sees it (section 16: toroidal coordinates as cos/sin), contiguous:
        the readers' matmuls would otherwise pick their kernel by whether the weights require grad
        (see DRMStateInitializer), and a frozen model would differ from a trainable one."""
        return toroidal_lift(z, self.config.toroidal_dims).contiguous()

    def bound(self, z: torch.Tensor) -> torch.Tensor:
        c = self.config
        return bound_state(z, c.state_clip_norm, c.toroidal_dims) if c.bounded_state else z

    def naturalization_strength(self, step: int | None) -> float:
        """Section 5 warm-up: s_k = s_max min(max(k, 0) / W, 1); s_max when no step is given."""
        c = self.config
        if not (c.has_metric and c.use_metric_naturalization):
            return 0.0
        if step is None or c.naturalization_warmup_steps <= 0:
            return c.naturalization_strength
        return c.naturalization_strength * min(max(step, 0) / c.naturalization_warmup_steps, 1.0)

    # ------------------------------------------------------------------ geometry
    def _solver_step(self, state, new, z, anchor, token_part, strength, fresh):
        """One position of :meth:`_refine_block`, keeping X_k of the previous position for every
        iteration k (and, for Anderson, the prefix Gram sums), so stepping equals the block form."""
        c = self.config
        self._check_steppable()
        iterations, x = c.solver_iters, z[:, 0]
        previous = [anchor[:, 0]] * iterations if fresh else state.solver_prev
        new.solver_prev = []
        if c.block_solver == "fixed_point":
            for k in range(iterations):
                new.solver_prev.append(x)
                x = x + c.solver_relaxation * (self._one_token(previous[k], token_part, strength) - x)
            return self.bound(x).unsqueeze(1)
        gram = x.new_zeros(x.shape[0], iterations, iterations) if fresh else state.solver_gram.clone()
        fs, rs = [], []
        for k in range(iterations):
            new.solver_prev.append(x)
            f = self._one_token(previous[k], token_part, strength)
            fs.append(f)
            rs.append(f - x)
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
        new.solver_gram = gram
        return self.bound(x).unsqueeze(1)

    def _check_steppable(self) -> None:
        c = self.config
        if c.block_solver == "anderson" and not c.solver_causal:
            raise ValueError("the global Anderson form reads later positions of its block (and other batch rows), "
                             "so it cannot be stepped; use solver_causal=True")

    def _geometry_at(self, z: torch.Tensor) -> tuple:
        """(gates, directions, gamma, U, rho) at states z [N, d] (None for absent modules)."""
        z_read = self.read(z)
        gates = directions = gamma = u_factor = None
        if self.direction_field is not None:
            directions, gates = self.direction_field(z_read)
        if self.metric is not None:
            gamma, u_factor = self.metric(z_read)
        rho = self.risk(z_read) if self.risk is not None else z_read.new_zeros(z_read.shape[:-1])
        return gates, directions, gamma, u_factor, rho

    @property
    def metric_first(self) -> bool:
        """Whether the metric meets the directions through a metric-first composition (section U)."""
        return self.config.directional_metric_composition != "post_naturalize"

    def _metric_frame(self, geometry: tuple, strength: float) -> torch.Tensor | None:
        """Section U: the metric-first frame F [N..., n, d] at a geometry (one Gram and one solve or
        Cholesky per sample); None where the composition is post-naturalization or s <= 0."""
        _, directions, gamma, u_factor, _ = geometry
        if not self.metric_first or strength <= 0:
            return None
        c = self.config
        return metric_first_frame(directions, gamma, u_factor, c.metric_damping, c.directional_metric_composition)

    def _velocity(self, z: torch.Tensor, geometry: tuple, token_part: torch.Tensor, strength: float,
                  frame: torch.Tensor | None = None) -> torch.Tensor:
        """Naturalized velocity at z for each position's token: token_part [N, L, H] -> [N, L, d].

        With a metric-first composition (section U) the velocity is composed in span(V) from the
        frame of :meth:`_metric_frame` (``frame``, when the caller holds it for the block; computed here otherwise)."""
        gates, directions, gamma, u_factor, _ = geometry
        z_read = self.read(z).unsqueeze(-2)
        if directions is not None:
            coeff = self.flow(z_read, token_part)
            if self.metric_first:
                frame = frame if frame is not None else self._metric_frame(geometry, strength)
                return compose_metric_first(gates, coeff, directions, frame, strength)
            v = raw_velocity(gates, coeff, directions)
        else:
            v = self.direct_transition(z_read, token_part)
        if gamma is not None:
            v = naturalize(v, gamma, u_factor, strength, self.config.metric_damping)
        return v

    def _transition(self, z: torch.Tensor, geometry: tuple, token_part: torch.Tensor, strength: float,
                    frame: torch.Tensor | None = None) -> torch.Tensor:
        """One-token endpoints from z [N..., d] with the geometry at z, under ``step_mode``.

        token_part [N..., L, H] -> [N..., L, d]. ``velocity`` gives the Euler anchor
        z^a = B(z + dt v); ``candidate`` and ``geodesic`` start from it (``solvers``). ``frame``: the
        metric-first frame at this geometry, if the caller already holds it (section U).
        """
        v = self._velocity(z, geometry, token_part, strength, frame)
        start = z.unsqueeze(-2)
        anchor = self.bound(start + self.config.dt * v)
        if self.config.step_mode == "candidate":
            return solvers.candidate_step(self, start, anchor, geometry)
        if self.config.step_mode == "geodesic":
            return solvers.geodesic_step(self, start, anchor, geometry)
        return anchor

    def _one_token(self, z: torch.Tensor, token_part: torch.Tensor, strength: float) -> torch.Tensor:
        """F(z, e): the one-token transition with the geometry recomputed at z (``docs/drm.md`` section S.0).

        z [N..., d], token_part [N..., H] -> [N..., d]. In velocity mode F = B(z^a), the bound applied twice.
        """
        out = self._transition(z, self._geometry_at(z), token_part.unsqueeze(-2), strength).squeeze(-2)
        return self.bound(out) if self.config.step_mode == "velocity" else out

    def _refine_block(self, z, anchor, token_part, strength) -> solvers.BlockSolution:
        """Block refiners (``docs/drm.md`` sections S.3.3, S.3.4) of the cumsum states z [B, L, d]
        (the caller bounds the solution's X)."""
        c = self.config

        def phi(x):  # Phi(X)_t = F(X_{t-1}, e_t), X_0 = z_s
            return self._one_token(torch.cat([anchor, x[:, :-1]], dim=1), token_part, strength)

        if c.block_solver == "fixed_point":
            return solvers.fixed_point(phi, z, c.solver_iters, c.solver_relaxation)
        return solvers.anderson(phi, z, c.solver_iters, c.anderson_history, c.anderson_ridge,
                                c.solver_relaxation, causal=c.solver_causal)

    def rollout(self, z_start: torch.Tensor, token_part: torch.Tensor, strength: float) -> torch.Tensor:
        """The exact sequential rollout z_t = F(z_{t-1}, e_t) from z_start [B, d]: [B, L, d]."""
        z, outputs = z_start, []
        for t in range(token_part.shape[1]):
            z = self._one_token(z, token_part[:, t], strength)
            outputs.append(z)
        return torch.stack(outputs, dim=1)

    def _consistency(self, index, z_final, z_start, token_part, strength) -> dict:
        """``docs/drm.md`` section S.4: MSE of the block's final states against a detached sequential rollout."""
        c, out = self.config, {}
        weights = c.loss_weights
        if weights.get("block_consistency", 0):
            with torch.no_grad():
                target = self.rollout(z_start.detach(), token_part.detach(), strength)
            err = c.block_consistency_weight * (z_final - target).pow(2).mean(-1)
            out["block_consistency"] = (err.sum(), err.numel())
        if weights.get("sampled_block_consistency", 0) and index % c.sampled_consistency_interval == 0:
            length = z_final.shape[1]
            size = min(c.sampled_consistency_size, length)
            segments = -(-length // size)
            begin = min(((index // c.sampled_consistency_interval) % segments) * size, length - size)
            teacher_start = z_start if begin == 0 else z_final[:, begin - 1]
            with torch.no_grad():
                target = self.rollout(teacher_start.detach(), token_part[:, begin: begin + size].detach(), strength)
            err = c.block_consistency_weight * (z_final[:, begin: begin + size] - target).pow(2).mean(-1)
            out["sampled_block_consistency"] = (err.sum(), err.numel())
        return out

    def _flow_token_part(self, e):
        module = self.flow if self.flow is not None else self.direct_transition
        return module.token_part(e)

    # ------------------------------------------------------------------ sequence paths
    def states(self, tokens: torch.Tensor, step: int | None = None) -> tuple[torch.Tensor, list[BlockGeometry]]:
        """The output states [B, T, d_state] and the per-block geometry record."""
        states, record, _ = self._states(tokens, step, return_state=False)
        return states, record

    def _states(self, tokens, step, return_state):
        """(states, record, the decoding state after the last token or None)."""
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        if return_state:
            self._check_steppable()
        e = self.embedding(tokens.long())
        strength = self.naturalization_strength(step)
        if self.config.sequence_mode == "recurrent":
            states, record = self._recurrent(e, strength)
            return states, record, DecodeState(z_start=states[:, -1]) if return_state else None
        return self._block_cumsum(e, strength, return_state)

    def _recurrent(self, e, strength):
        c = self.config
        z = self.initial_state(e.shape[0]).to(e.dtype)
        flow_tokens = self._flow_token_part(e)
        outputs, record = [], []
        for t in range(e.shape[1]):
            geometry = self._geometry_at(z)
            z_next = self._transition(z, geometry, flow_tokens[:, t: t + 1], strength)[:, 0]
            record.append(BlockGeometry(1, *geometry, ((z_next - z) / c.dt).unsqueeze(1)))
            z = z_next
            outputs.append(z)
        return torch.stack(outputs, dim=1), record

    def _token_parts(self, e: torch.Tensor) -> TokenParts:
        """Everything the block path needs from the tokens alone, for the whole sequence."""
        return TokenParts(
            flow=self._flow_token_part(e) if self.config.has_geometry else None,
            mixer=self.mixer.token_part(e) if self.mixer is not None else None,
            residual=self.token_residual(e) if self.token_residual is not None else None,
            memory=self.memory.token_part(e) if self.memory is not None else None,
            refine=[layer.flow.token_part(e) for layer in self.refinement],
        )

    def _block_cumsum(self, e, strength, return_state=False):
        """The block path over e [B, T, d_token]: (states, record, the state after the last token
        when ``return_state``, else None). Only the last state of a block crosses into the next."""
        c = self.config
        length = e.shape[1]
        z_start = self.initial_state(e.shape[0]).to(e.dtype)
        parts = self._token_parts(e)
        outputs, record, state = [], [], None
        memory = self.fast_weight_memory.init_state(e.shape[0], e) if self.fast_weight_memory is not None else None
        for start in range(0, length, c.block_size):
            block = slice(start, min(start + c.block_size, length))
            if return_state and block.stop == length:
                state = DecodeState(z_start=z_start, position=block.stop - start, refine_prev=[])
            z = self._block(z_start, parts.window(block), block.stop - start, strength, record, state)
            if memory is not None:  # section V: z' = z + the memory's read, written as it goes
                z, memory = self.fast_weight_memory(z, self.read(z), e[:, block], memory)
            outputs.append(z)
            z_start = z[:, -1]
        if state is not None:
            state.fast_weight = memory
        if state is not None and state.position == c.block_size:  # complete: the next block starts afresh
            state = DecodeState(z_start=z_start, fast_weight=memory)
        return torch.cat(outputs, dim=1), record, state

    def _block(self, z_start, parts: TokenParts, length: int, strength, record: list, state: DecodeState | None):
        """One block of ``length`` positions from z_start [B, d] -> its states [B, length, d].

        Appends the block's geometry to ``record``. A ``state`` is filled with what :meth:`step`
        holds after the block's last position (the running delta sum, the last prefix state, the
        mixer's contexts, the memory, the refiners' last inputs and the solver's last iterates).
        """
        c = self.config
        batch = z_start.shape[0]
        anchor = z_start.unsqueeze(1)  # [B, 1, d]
        if c.has_geometry:
            z, delta, rho, dim_d = self._prefix_states(z_start, anchor, parts.flow, strength, record, state)
        else:
            z, delta, rho, dim_d = anchor, None, z_start.new_zeros(batch), z_start.new_zeros(batch)
        if self.mixer is not None:
            diffs = None if delta is None else z - torch.cat([anchor, z[:, :-1]], dim=1)
            scalars = torch.stack([dim_d, rho], dim=-1)
            h = self.mixer.input_features(z, diffs, delta, scalars, parts.mixer)
            if state is not None:
                correction, state.mixer_context = self.mixer(h, return_state=True)
            else:
                correction = self.mixer(h)
            z = self.bound(z + correction)
        if self.token_residual is not None:
            z = self.bound(z + parts.residual)
        if z.shape[1] == 1 and length > 1:
            z = z.expand(batch, length, -1).contiguous()  # a copy: see DRMStateInitializer
        if self.memory is not None:
            previous = torch.cat([anchor, z[:, :-1]], dim=1)
            forget, update = self.memory.gates(self.read(previous), parts.memory)
            m = linear_scan(forget, update, init=z_start)
            if state is not None:
                state.memory_prev_state, state.memory = z[:, -1:], m[:, -1]
            z = self.bound(z + self.memory.scale * m)
        for layer, token_part in zip(self.refinement, parts.refine):
            if state is not None:
                state.refine_prev.append(z[:, -1:])
            z = self._refine(layer, z, anchor, token_part, strength)
        if c.has_geometry and c.has_consistency_loss:
            record[-1].consistency = self._consistency(len(record) - 1, z, z_start, parts.flow, strength)
        return z

    def _prefix_states(self, z_start, anchor, flow_tokens, strength, record: list, state: DecodeState | None):
        """Section 7 with the geometry at the block start: z~_t = B(z_s + sum_{k<=t} delta_k), refined
        by the block solver if one is set (anchor = z_s as [B, 1, d]). Returns (z~ [B, L, d], delta, rho, dimD) and records the
        block's geometry (and, in ``state``, what stepping keeps of it)."""
        c = self.config
        geometry = self._geometry_at(z_start)
        frame = self._metric_frame(geometry, strength)  # section U: once per block and sample
        delta = self._transition(z_start, geometry, flow_tokens, strength, frame) - anchor
        delta_sum = delta.cumsum(dim=1)
        z = self.bound(anchor + delta_sum)
        gates, rho = geometry[0], geometry[4]
        dim_d = gates.sum(-1) if gates is not None else rho.new_zeros(z_start.shape[0])
        record.append(BlockGeometry(delta.shape[1], *geometry, delta / c.dt))
        if c.block_solver is not None:
            solution = self._refine_block(z, anchor, flow_tokens, strength)
            z, record[-1].solver_residual = self.bound(solution.x), solution.residual
            record[-1].refined_velocity = (z - torch.cat([anchor, z[:, :-1]], dim=1)) / c.dt
            if state is not None:
                _keep_solver_state(state, solution, c.block_solver)
        if state is not None:
            state.geometry, state.delta_sum, state.z_tilde_prev = geometry, delta_sum[:, -1:], z[:, -1:]
            state.metric_frame = frame
        return z, delta, rho, dim_d

    def _refine(self, layer: RefinementLayer, z, anchor, token_part, strength):
        """Variant G: z_t <- B(z_t + eta dt Nat(u(z_{t-1}, e_t))) with each position's own geometry."""
        c = self.config
        previous = self.read(torch.cat([anchor, z[:, :-1]], dim=1))  # [B, L, d_read]
        directions, gates = layer.direction_field(previous)  # [B, L, n, d], [B, L, n]
        coeff = layer.flow(previous, token_part)  # [B, L, n]
        gamma, u_factor = layer.metric(previous)
        if self.metric_first:  # section U, with each position's own geometry
            frame = self._metric_frame((gates, directions, gamma, u_factor, None), strength)
            v = compose_metric_first(gates, coeff.unsqueeze(-2), directions, frame, strength).squeeze(-2)
        else:
            v = raw_velocity(gates, coeff.unsqueeze(-2), directions)  # [B, L, 1, d]
            v = naturalize(v, gamma, u_factor, strength, c.metric_damping).squeeze(-2)
        return self.bound(z + c.refinement_scale * c.dt * v)

    # ------------------------------------------------------------------ forward
    def forward(self, tokens: torch.Tensor, step: int | None = None, return_state: bool = False) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, vocab]; logits[:, t] predicts token t + 1.

        ``step`` is the 1-based optimizer step (drives the naturalization warm-up);
        None means evaluation (full strength). ``return_state``: ``.state`` is the
        :class:`DecodeState` after the last token.
        """
        states, record, state = self._states(tokens, step, return_state)
        logits = self.emitter(self.read(states))
        aux = {}
        if record:
            aux["dimD"] = _per_position(record, lambda g: g.gates.sum(-1) if g.gates is not None else g.rho * 0)
        if self.config.block_solver is not None and record:
            aux["solver_iterations"] = torch.tensor(self.config.solver_iters)
            aux["solver_residual"] = torch.cat([g.solver_residual for g in record], dim=1).detach().mean()
            aux["refined_action"] = _refined_action(self.config, record)
        if self.config.has_geometry and any(w != 0 for w in self.config.loss_weights.values()):
            aux.update(auxiliary_losses(self.config, record, states, logits))
        return ModelOutput(logits=logits, aux=aux, state=state)

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> DecodeState:
        """The decoding state before the first token."""
        check_batch_size(batch_size, self.model_name)
        ref = self.embedding.weight
        memory = self.fast_weight_memory.init_state(batch_size, ref) if self.fast_weight_memory is not None else None
        return DecodeState(z_start=self.initial_state(batch_size).to(device=ref.device, dtype=ref.dtype), fast_weight=memory)

    def step(self, tokens_t: torch.Tensor, state: DecodeState, step: int | None = None) -> tuple[torch.Tensor, DecodeState]:
        """Advance by one token: tokens_t [B] -> (logits [B, vocab], new state).

        Computes exactly the function of :meth:`forward` (the same block path, mixer, residual,
        memory and refinement), one position at a time; stepping a sequence reproduces the
        parallel logits. The state passed in is not modified.
        """
        check_step_tokens(tokens_t, self.config.vocab_size, state.z_start.shape[0], self.model_name)
        c = self.config
        e = self.embedding(tokens_t.long()).unsqueeze(1)  # [B, 1, d_t]
        strength = self.naturalization_strength(step)
        if c.sequence_mode == "recurrent":
            z = state.z_start
            z = self._transition(z, self._geometry_at(z), self._flow_token_part(e), strength)[:, 0]
            return self.emitter(self.read(z)), DecodeState(z_start=z)

        z_start, batch = state.z_start, tokens_t.shape[0]
        anchor = z_start.unsqueeze(1)
        new = DecodeState(z_start=z_start, position=state.position + 1)
        fresh = state.position == 0
        if c.has_geometry:
            new.geometry = self._geometry_at(z_start) if fresh else state.geometry
            new.metric_frame = self._metric_frame(new.geometry, strength) if fresh else state.metric_frame
            gates, rho = new.geometry[0], new.geometry[4]
            dim_d = gates.sum(-1) if gates is not None else rho.new_zeros(batch)
            token_part = self._flow_token_part(e)
            delta = self._transition(z_start, new.geometry, token_part, strength, new.metric_frame) - anchor
            new.delta_sum = delta if fresh else state.delta_sum + delta
            z = self.bound(anchor + new.delta_sum)
            if c.block_solver is not None:
                z = self._solver_step(state, new, z, anchor, token_part[:, 0], strength, fresh)
            z_prev = anchor if fresh else state.z_tilde_prev
            new.z_tilde_prev = z
        else:
            z, delta, rho, dim_d = anchor, None, z_start.new_zeros(batch), z_start.new_zeros(batch)
        if self.mixer is not None:
            diffs = None if delta is None else z - z_prev
            scalars = torch.stack([dim_d, rho], dim=-1)
            h = self.mixer.input_features(z, diffs, delta, scalars, self.mixer.token_part(e))[:, 0]
            contexts = state.mixer_context if not fresh else [
                h.new_zeros(batch, dil * (c.mixer_kernel - 1), h.shape[-1]) for dil in self.mixer.dilations]
            correction, new.mixer_context = self.mixer.step(h, contexts)
            z = self.bound(z + correction.unsqueeze(1))
        if self.token_residual is not None:
            z = self.bound(z + self.token_residual(e))
        if self.memory is not None:
            previous = anchor if fresh else state.memory_prev_state
            m_prev = z_start if fresh else state.memory
            forget, update = self.memory.gates(self.read(previous), self.memory.token_part(e))
            new.memory = forget[:, 0] * m_prev + update[:, 0]
            new.memory_prev_state = z
            z = self.bound(z + self.memory.scale * new.memory.unsqueeze(1))
        new.refine_prev = []
        for i, layer in enumerate(self.refinement):
            previous = anchor if fresh else state.refine_prev[i]
            new.refine_prev.append(z)
            z = self._refine(layer, z, previous, layer.flow.token_part(e), strength)
        if self.fast_weight_memory is not None:
            z, new.fast_weight = self.fast_weight_memory(z, self.read(z), e, state.fast_weight)
        z = z[:, 0]
        if new.position == c.block_size:  # block complete: its last state starts the next block
            new = DecodeState(z_start=z, fast_weight=new.fast_weight)
        return self.emitter(self.read(z)), new



def _keep_solver_state(state: DecodeState, solution: solvers.BlockSolution, block_solver: str) -> None:
    """What :meth:`DRMModel._solver_step` holds after a block's last position: each iterate X_k
    there and, for Anderson, the Gram sums of the residuals over the block's positions."""
    state.solver_prev = [x[:, -1] for x in solution.iterates]
    if block_solver == "anderson":
        stacked = torch.stack(solution.residuals, dim=-2)  # [B, L, K, d]
        state.solver_gram = (stacked @ stacked.transpose(-1, -2)).sum(dim=1)


def _refined_action(config: DRMConfig, record: list[BlockGeometry]) -> torch.Tensor:
    """Mean over positions of the block-start metric energy of the refined path's velocities."""
    energies = []
    for g in record:
        v = g.refined_velocity
        if g.gamma is not None:
            energies.append((solvers.metric_apply(v, g.gamma, g.u_factor) * v).sum(-1))
        else:
            energies.append(v.pow(2).sum(-1))
    return torch.cat(energies, dim=1).mean().detach()


def _per_position(record: list[BlockGeometry], value) -> torch.Tensor:
    """Repeat a per-block [B] quantity over each block's positions: [B, T]."""
    return torch.cat([value(g).unsqueeze(1).expand(-1, g.length) for g in record], dim=1)
