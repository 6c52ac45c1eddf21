"""The DRM language model: embedding -> latent state path -> emitter (``docs/drm.md`` sections 1-13).

The state path is a list of stages (:mod:`.stages`), run over blocks of L tokens: per block the
geometry is evaluated once at the block-start state z_s and the local deltas are prefix-summed
(sections 7, A.4.1 and A.4.2; SSM_CONTROL has no geometry stage), an optional block solver refines
the prefix states (section S.3), then the causal mixer, the token residual, the selective memory and
the refinement layers each add a bounded correction and the fast-weight memory reads and writes
(section V); the last state of a block starts the next. ``sequence_mode="recurrent"`` (section 6)
is the Euler rollout with the geometry recomputed at every token: the same loop with blocks of one.

What a stage needs from the tokens alone is computed once for the whole sequence; only
state-dependent work runs inside the block loop.

Decoding (section A.4.5): ``init_state`` / ``step`` run the same stages one token at a time, each
over its own state, and ``forward(tokens, return_state=True)`` returns, from the parallel pass, the
state that stepping through the tokens would reach -- mid-block included -- so a prompt needs no stepping.
``step`` runs each stage's fast step, ``step_reference`` its plain one: the same logits, bit for bit.

Variable rank (``docs/variable-rank.md``): a controller reads each block's first token and the block
keeps a prefix of the state's coordinates; the block start and every increment are projected onto it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens
from drmlab.models.output import ModelOutput

from . import fused_step, solvers
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
)
from .config import DRMConfig
from .fast_weight import FastWeightMemory
from .losses import auxiliary_losses
from .metric_options import PullbackMetric
from .rank import RankController, RankMask, fit_width, rank_losses, rank_schedule
from .stages import Block, BlockGeometry, build_stages, stepping
from .transition import Transition

# Per-component seed offsets (``docs/drm.md`` section A.2): each component draws its
# initialisation from the stream seed + offset, so removing one never changes another.
SEED_OFFSETS = {
    "embedding": 101,
    "initial_state": 102,
    "direction_field": 103,
    "metric": 104,
    "flow": 105,
    "risk": 106,
    "emitter": 107,
    "mixer": 108,
    "token_residual": 109,
    "memory": 110,
    "refinement": 111,
    "direct_transition": 112,
    "fast_weight_memory": 113,
    "rank_controller": 114,
}


@dataclass
class DecodeState:
    """Everything :meth:`DRMModel.step` needs to continue the block path in O(1) per token
    (``docs/drm.md`` section A.4.5): the current block's start state, how many of its positions are
    done, and one entry per stage, in the order of ``DRMModel.stages``: that stage's state, None
    where it starts afresh with the block. Under variable rank, ``rank`` [B] is the open block's rank
    (None before its first token) and z_start, inside a block, the start already projected onto it;
    z_start is always d_state wide (zeros outside the rank)."""

    z_start: torch.Tensor
    position: int = 0
    stages: tuple = ()
    rank: torch.Tensor | None = None


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
        self.metric = seeded("metric", lambda: RelationalMetric(c)) if c.has_relational_metric else None
        self.flow = seeded("flow", lambda: DRMFlow(c)) if c.has_direction_field else None
        self.risk = (
            seeded("risk", lambda: RiskField(c, enabled=c.risk == "powerlaw"))
            if c.has_geometry and c.risk != "none"
            else None
        )
        self.emitter = seeded("emitter", lambda: LanguageEmitter(c))
        self.mixer = seeded("mixer", lambda: CausalConvMixer(c)) if c.mixer == "causal_conv" else None
        self.token_residual = (
            seeded("token_residual", lambda: TokenStateResidual(c)) if c.token_state_residual else None
        )
        self.memory = seeded("memory", lambda: SelectiveMemory(c)) if c.selective_memory else None
        self.refinement = seeded(
            "refinement",
            lambda: nn.ModuleList(RefinementLayer(c) for _ in range(c.refinement_layers if c.has_geometry else 0)),
        )
        self.direct_transition = (
            seeded("direct_transition", lambda: DirectStateTransition(c)) if c.has_direct_transition else None
        )
        self.fast_weight_memory = (
            seeded("fast_weight_memory", lambda: FastWeightMemory(c)) if c.fast_weight_memory else None
        )
        self.rank_controller = seeded("rank_controller", lambda: RankController(c)) if c.has_variable_rank else None
        # metric="pullback": the emitter's pullback J^T F J stands where the metric module would (docs/geometry.md 9)
        metric = PullbackMetric(self.emitter, c) if c.metric == "pullback" else self.metric
        self.transition = Transition(c, self.direction_field, metric, self.flow, self.direct_transition, self.risk)
        self.stages = nn.ModuleList(build_stages(self))  # parameter-free: see Stage
        # positions per block: in decoding a recurrent model's every token is a block of its own
        self.block_length = 1 if c.sequence_mode == "recurrent" else c.block_size

    # ------------------------------------------------------------------ small helpers
    def read(self, z: torch.Tensor) -> torch.Tensor:
        """The state as every reader sees it (:meth:`Transition.read`)."""
        return self.transition.read(z)

    def bound(self, z: torch.Tensor) -> torch.Tensor:
        return self.transition.bound(z)

    def naturalization_strength(self, step: int | None) -> float:
        """Section 5 warm-up: s_k = s_max min(max(k, 0) / W, 1); s_max when no step is given."""
        c = self.config
        if not (c.has_metric and c.use_metric_naturalization):
            return 0.0
        if step is None or c.naturalization_warmup_steps <= 0:
            return c.naturalization_strength
        return c.naturalization_strength * min(max(step, 0) / c.naturalization_warmup_steps, 1.0)

    # ------------------------------------------------------------------ the state path
    def states(self, tokens: torch.Tensor, step: int | None = None) -> tuple[torch.Tensor, list[BlockGeometry]]:
        """The output states [B, T, d_state] and the per-block geometry record."""
        states, record, _, _ = self._states(tokens, step, return_state=False)
        return fit_width(states, self.config.d_state), record

    def _states(self, tokens, step, return_state):
        """(states [B, T, W], the geometry record, the decoding state after the last token when
        ``return_state``, else None, the rank plan): the stages over each block in turn. Only the last
        state of a block, and the state of a stage that crosses blocks, passes into the next. W is
        d_state unless the rank is sliced (then the widest block's width; the rest is zero)."""
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        if return_state:
            for stage in self.stages:
                stage.check_steppable()
        e = self.embedding(tokens.long())
        strength = self.naturalization_strength(step)
        batch, length = e.shape[:2]
        z_start = self.initial_state(batch).to(e.dtype)
        kept = [stage.init_state(batch, e) for stage in self.stages]
        span = length if self.config.sequence_mode == "recurrent" else self.block_length  # one rollout (section 6)
        plan = self._rank_plan(e[:, ::span], step)
        widest = None if plan is None else plan["widest"]
        # every whole-sequence tensor is split into its blocks once: one gradient concatenation in the backward
        # instead of a zero-filled full-size gradient per block and their sum (the same values, bit for bit)
        blocks_e = e.split(span, dim=1)
        parts = [
            None if part is None else part.split(span, dim=1) for part in (s.token_part(e, widest) for s in self.stages)
        ]
        outputs, record, state, shared = [], [], None, {}
        for index, e_block in enumerate(blocks_e):
            keep = return_state and index == len(blocks_e) - 1
            rank = None if plan is None else plan["masks"][index]
            start = z_start if rank is None else rank.enter(z_start)
            block = Block.at(start, e_block, strength, record, rank, shared)
            for i, (stage, part) in enumerate(zip(self.stages, parts)):
                carried = kept[i] if stage.crosses_blocks else None
                kept[i] = stage(block, None if part is None else part[index], carried, keep)
            z = block.spread()
            outputs.append(z if widest is None else fit_width(z, widest))
            if keep:
                state = self._after(start, e_block.shape[1], kept, z[:, -1], rank)
            z_start = z[:, -1]
        return torch.cat(outputs, dim=1), record, state, plan

    def _rank_plan(self, e_first: torch.Tensor, step: int | None) -> dict | None:
        """Variable rank (docs/variable-rank.md sections 2-5): from each block's first token embedding
        e_first [B, blocks, d_token], the ranks [B, blocks], each block's :class:`RankMask`, the soft
        gates (adaptive policy: [B, blocks, d_state], else None), the widest width where sliced (else
        None) and the curriculum's schedule at ``step``. None without variable rank."""
        controller, c = self.rank_controller, self.config
        if controller is None:
            return None
        sliced = c.rank_compute == "sliced"
        ranks, logits = controller.decide(e_first)
        schedule = gates = None
        if logits is not None and controller.trainable:
            schedule = rank_schedule(c, step)
            gates = controller.soft_gates(logits, schedule.temperature)
        straight_through = gates is not None and self.training and torch.is_grad_enabled()  # upstream: training only
        if straight_through and sliced:
            raise ValueError(
                "rank_compute='sliced' cannot train the adaptive controller (its straight-through gradient reads "
                "the coordinates the slice drops): train with rank_compute='masked'"
            )
        masks = [
            RankMask.of(ranks[:, k], c.d_state, sliced, gates[:, k] if straight_through else None)
            for k in range(ranks.shape[1])
        ]
        widest = max((m.width for m in masks), default=c.d_state) if sliced else c.d_state
        return dict(
            ranks=ranks, masks=masks, gates=gates, schedule=schedule, widest=widest if widest < c.d_state else None
        )

    def _after(self, start, position: int, kept: list, z_last, rank: RankMask | None = None) -> DecodeState:
        """The decoding state ``position`` positions into the block from its start ``start``; a complete
        block hands its last state to the next, where every stage but those crossing blocks starts afresh."""
        d = self.config.d_state
        if position < self.block_length:
            return DecodeState(
                z_start=start if rank is None else fit_width(start, d),
                position=position,
                stages=tuple(kept),
                rank=None if rank is None else rank.ranks,
            )
        return DecodeState(
            z_start=z_last if rank is None else fit_width(z_last, d),
            stages=tuple(s if stage.crosses_blocks else None for stage, s in zip(self.stages, kept)),
        )

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: torch.Tensor,
        step: int | None = None,
        return_state: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens [B, T] -> logits [B, T, vocab]; logits[:, t] predicts token t + 1.

        ``step`` is the 1-based optimizer step (drives the naturalization warm-up);
        None means evaluation (full strength). ``return_state``: ``.state`` is the
        :class:`DecodeState` after the last token. ``logits_at``: the emitter at those positions only
        (:mod:`drmlab.models.inputs`); auxiliary losses that read the logits still see all of them.
        """
        check_logits_at(logits_at, tokens, self.model_name)
        states, record, state, plan = self._states(tokens, step, return_state)
        needs_all = self.config.has_geometry and any(w != 0 for w in self.config.loss_weights.values())
        read = self.read(states)
        width = None if plan is None else plan["widest"]
        logits = self.emitter(read if logits_at is None or needs_all else read[logits_at], width)
        aux = {}
        if record:
            aux["dimD"] = _per_position(record, lambda g: g.gates.sum(-1) if g.gates is not None else g.rho * 0)
        if self.config.block_solver is not None and record:
            aux["solver_iterations"] = torch.tensor(self.config.solver_iters)
            aux["solver_residual"] = torch.cat([g.solver_residual for g in record], dim=1).detach().mean()
            aux["refined_action"] = _refined_action(self.config, record)
        if record and record[0].fast_weight_confidence is not None:  # section V.4: c^r, c^w [B, T]
            aux["fast_weight_read_confidence"] = torch.cat([g.fast_weight_confidence[0] for g in record], dim=1)
            aux["fast_weight_write_confidence"] = torch.cat([g.fast_weight_confidence[1] for g in record], dim=1)
        if needs_all:
            aux.update(auxiliary_losses(self.config, record, states, logits))
        if plan is not None:
            aux["rank"] = _per_position_values(plan["ranks"], [g.length for g in record])
            if plan["gates"] is not None:  # the adaptive policy's curriculum (docs/variable-rank.md section 4)
                terms = rank_losses(plan["gates"], plan["schedule"])
                total = terms.pop("loss_aux")
                aux.update(terms)
                aux["loss_aux"] = aux["loss_aux"] + total if "loss_aux" in aux else total
        if logits_at is not None and needs_all:
            logits = logits[logits_at]
        return ModelOutput(logits=logits, aux=aux, state=state)

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> DecodeState:
        """The decoding state before the first token."""
        check_batch_size(batch_size, self.model_name)
        ref = self.embedding.weight
        z_start = self.initial_state(batch_size).to(device=ref.device, dtype=ref.dtype)
        return DecodeState(z_start=z_start, stages=tuple(stage.init_state(batch_size, ref) for stage in self.stages))

    def step(
        self, tokens_t: torch.Tensor, state: DecodeState, step: int | None = None
    ) -> tuple[torch.Tensor, DecodeState]:
        """Advance by one token: tokens_t [B] -> (logits [B, vocab], new state).

        Runs the stages of :meth:`forward` one position at a time, each over its own state; stepping
        a sequence reproduces the parallel logits. The state passed in is not modified. Each stage's
        fast step (``stages.stepping``) gives :meth:`step_reference`'s logits and states bit for bit.
        """
        return self._step(tokens_t, state, step, reference=False)

    def step_reference(
        self, tokens_t: torch.Tensor, state: DecodeState, step: int | None = None
    ) -> tuple[torch.Tensor, DecodeState]:
        """:meth:`step` by each stage's plain step (``Stage.step_reference``): the reference the fast
        step is tested against and benchmarked beside."""
        return self._step(tokens_t, state, step, reference=True)

    def step_fused(
        self, tokens_t: torch.Tensor, state: DecodeState, step: int | None = None
    ) -> tuple[torch.Tensor, DecodeState]:
        """:meth:`step` by the fused C step where it applies (``fused_step``, docs/drm.md A.4.5 "The fused
        step"): one kernel call per token inside a block, equal to :meth:`step_reference` to round-off
        (not bit for bit: opt-in). Elsewhere, and for every token it does not take (a block's first,
        autograd, autocast, another dtype or device), this is :meth:`step`; :meth:`fused_step_unsupported`
        says why a model never takes it."""
        if self.fused_step_unsupported() is None:
            check_step_tokens(tokens_t, self.config.vocab_size, state.z_start.shape[0], self.model_name)
            out = fused_step.step(self, tokens_t, state, self.naturalization_strength(step))
            if out is not None:  # checked against the fast step on its first token (drmlab.ops.self_check)
                return fused_step.first_use_check(out, state.z_start.dtype, lambda: self.step(tokens_t, state, step))
        return self.step(tokens_t, state, step)

    def fused_step_unsupported(self) -> str | None:
        """Why :meth:`step_fused` never applies to this model (its stages or settings), or None; the reason
        for one token (a block's first, autograd, autocast, dtype, device, the C kernel) is
        ``fused_step.token_unsupported``."""
        if "_fused_reason" not in self.__dict__:
            self.__dict__["_fused_reason"] = fused_step.unsupported(self)
        return self.__dict__["_fused_reason"]

    def _step(self, tokens_t, state: DecodeState, step, reference: bool):
        check_step_tokens(tokens_t, self.config.vocab_size, state.z_start.shape[0], self.model_name)
        e = self.embedding(tokens_t.long()).unsqueeze(1)  # [B, 1, d_t]
        start, rank = state.z_start, None
        if self.rank_controller is not None:  # the rank is chosen at the block's first token, then kept
            ranks = state.rank if state.rank is not None else self.rank_controller.decide(e[:, 0])[0]
            rank = RankMask.of(ranks, self.config.d_state, self.config.rank_compute == "sliced")
            start = rank.enter(start)
        block = Block.at(start, e, self.naturalization_strength(step), None, rank)
        # the fast steps apply the rank projection as the plain ones do; the sliced form steps by the reference
        reference = reference or not stepping.fast_step_supported(start) or block.width is not None
        if reference:
            kept = [
                stage.step_reference(block, stage.token_part(e, block.width), s)
                for stage, s in zip(self.stages, state.stages)
            ]
        else:
            kept = [stage.step(block, stage.step_token_part(e), s) for stage, s in zip(self.stages, state.stages)]
        z = block.z[:, 0]
        if reference:
            logits = self.emitter(self.read(z), block.width)
        else:  # LanguageEmitter.forward without the module calls
            emitter = self.emitter
            hidden = F.rms_norm(self.read(z), emitter.norm.normalized_shape, emitter.norm.weight, emitter.norm.eps)
            hidden = F.gelu(F.linear(hidden, emitter.fc1.weight, emitter.fc1.bias))
            logits = F.linear(hidden, emitter.fc2.weight, emitter.fc2.bias)
        return logits, self._after(start, state.position + 1, kept, z, rank)


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


def _per_position_values(values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Repeat per-block values [B, blocks] over each block's positions: [B, T] (float)."""
    return torch.cat([values[:, k : k + 1].expand(-1, n) for k, n in enumerate(lengths)], dim=1).float()


def _per_position(record: list[BlockGeometry], value) -> torch.Tensor:
    """Repeat a per-block [B] quantity over each block's positions: [B, T]."""
    return torch.cat([value(g).unsqueeze(1).expand(-1, g.length) for g in record], dim=1)
