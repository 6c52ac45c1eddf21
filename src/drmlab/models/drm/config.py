"""Configuration of the DRM family: one dataclass, the presets and the variant table.

The fields and their defaults follow the reference configuration of ``docs/drm.md``
section A.1; the variants A to J and the component ablations are its section A.5.3.
A config resolves in three layers: preset dimensions, then the variant's overrides,
then the caller's overrides.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from drmlab.naming import unknown
from drmlab.presets import PRESETS

# ---------------------------------------------------------------------------------------
# Loss weights (``docs/drm.md`` sections 11 and A.1.2). ``LOSS_WEIGHTS_BASE``
# is variant A; ``ce_only`` sets every weight to zero.
LOSS_WEIGHTS_BASE = {
    "action": 0.01,
    "dim_sparsity": 0.001,
    "dim_entropy": 0.001,
    "dim_variance": 0.01,
    "metric_reg": 0.001,
    "metric_diversity": 0.001,
    "recurrence": 0.0,
    "stability": 0.0,
    "blindspot": 0.0,
    "active_fraction": 0.01,
    "metric_u_floor": 0.001,
    "metric_u_target": 0.001,
    "condition": 0.001,
    "block_consistency": 0.0,
    "sampled_block_consistency": 0.0,
}
CE_ONLY = {k: 0.0 for k in LOSS_WEIGHTS_BASE}


# Variable-rank policies (``docs/variable-rank.md`` section 3).
RANK_POLICIES = ("off", "full", "fixed", "adaptive")

# How the metric meets the directions (``docs/drm.md`` sections 5 and U).
COMPOSITIONS = ("post_naturalize", "metric_subspace", "metric_orthonormal")
# The metric options (``docs/geometry.md`` sections 8 and 9) and the loss terms of the relational metric alone.
METRICS = ("relational", "pullback")
METRIC_DIAGONALS = ("softplus_eps", "softplus", "relu", "none")
RELATIONAL_METRIC_LOSSES = ("metric_reg", "metric_diversity", "condition", "metric_u_floor", "metric_u_target")


@dataclass
class DRMConfig:
    """Every field that changes a DRM model or its loss."""

    vocab_size: int = 256
    d_token: int = 128
    d_state: int = 128
    n_directions: int = 8
    metric_rank: int = 8
    hidden_size: int = 384
    direction_basis_size: int = 16
    metric_u_basis_size: int = 16
    dt: float = 0.08
    max_seq_len: int = 256  # training window only; there are no positional parameters
    # sequence path: "block_cumsum" (section 7) or "recurrent" (section 6: Euler step per token)
    sequence_mode: str = "block_cumsum"
    block_size: int = 64
    bounded_state: bool = True
    state_clip_norm: float = 8.0
    # geometry switches
    use_drm_geometry: bool = True
    use_direction_field: bool = True
    use_relational_metric: bool = True
    metric_eps: float = 1e-4
    # the metric naturalization uses (docs/geometry.md sections 8 and 9): "relational" (section 4), or
    # "pullback", the emitter's G_pb(z) = J^T (diag p - p p^T) J in place of the relational metric module
    metric: str = "relational"
    # the relational metric's diagonal: "softplus_eps" (softplus(d) + eps, section 4), or a floor that can
    # vanish, naturalized through the damped pseudo-inverse: "softplus" (no eps), "relu" (max(d, 0): exact
    # zeros), "none" (G = U U^T, rank metric_rank)
    metric_diagonal: str = "softplus_eps"
    direction_norm: bool = True
    gate_temperature: float = 1.5
    gate_logit_bias: float = -1.0
    # naturalization (section 5)
    use_metric_naturalization: bool = True
    naturalization_strength: float = 0.5
    naturalization_warmup_steps: int = 500
    metric_damping: float = 0.3
    # how the metric meets the directions (section U): "post_naturalize" (section 5: Woodbury in R^d
    # after the raw velocity), or a metric-first composition on the n x n Gram V G V^T:
    # "metric_subspace" (ASM-U) or "metric_orthonormal" (ASM-F)
    directional_metric_composition: str = "post_naturalize"
    # risk field: "none" (not built), "dead" (built, outputs zero: reference A-G), "powerlaw"
    risk: str = "none"
    # causal local mixer (section 7)
    mixer: str = "causal_conv"  # or "none"
    mixer_hidden: int = 128
    mixer_kernel: int = 8
    mixer_layers: int = 2
    mixer_dilation_growth: int = 1
    mixer_scale: float = 0.2
    # token-to-state residual (section 8)
    token_state_residual: bool = False
    token_state_residual_scale: float = 0.1
    # selective memory (section 9)
    selective_memory: bool = False
    memory_hidden: int = 64
    memory_scale: float = 0.1
    memory_forget_bias: float = 2.0
    # refinement layers (variant G)
    refinement_layers: int = 0
    refinement_scale: float = 0.1
    # solver options (``docs/drm.md`` section 14 and appendix S). Step mode of the one-token
    # transition: "velocity" (Euler), "candidate" or "geodesic"; block refiners of the
    # within-block states: None, "fixed_point" or "anderson" (causal, or global for comparison).
    step_mode: str = "velocity"
    candidate_scale: float = 1.0
    candidate_temperature: float = 1.0
    geodesic_steps: int = 3
    geodesic_lr: float = 0.05
    geodesic_anchor_weight: float = 1.0
    geodesic_metric_weight: float = 0.1
    geodesic_risk_weight: float = 0.01
    block_solver: str | None = None
    solver_iters: int = 2
    solver_causal: bool = True
    solver_relaxation: float = 1.0
    anderson_history: int = 4
    anderson_ridge: float = 1e-4
    endpoint_correction_weight: float = 0.0  # the reference's non-causal correction: refused if > 0
    block_consistency_weight: float = 1.0
    sampled_consistency_interval: int = 8
    sampled_consistency_size: int = 8
    # toroidal coordinates (section 16): the first k state coordinates are angles, read by
    # every state reader as (cos, sin) and left out of the bound operator.
    toroidal_dims: int = 0
    # losses (section 11)
    loss_weights: dict = field(default_factory=lambda: dict(CE_ONLY))
    active_fraction_mode: str = "upper_bound"  # or "target"
    target_active_fraction: float = 0.65
    target_dim_std: float = 0.15
    metric_u_min_norm: float = 0.05
    metric_u_target_norm: float = 1.0
    target_condition: float = 100.0
    # fast-weight memory (section V; the upstream ASM-C2-FW / ASM-CM memory): a d x d delta-rule
    # matrix per stream read and written after the block path. fast_weight_dim is d_k = d_v (the
    # presets set it); read scale rho, slow read scale beta, consolidation kappa; the write gate is
    # hard at fast_weight_write_threshold (straight-through gradient; 0 = soft gate); durable adds
    # the non-decaying slow matrix; the fp32 flags keep the state / run the memory in float32.
    fast_weight_memory: bool = False
    fast_weight_dim: int = 16
    fast_weight_read_scale: float = 0.1
    fast_weight_slow_read_scale: float = 1.0
    fast_weight_consolidation: float = 0.25
    fast_weight_write_threshold: float = 0.5
    fast_weight_durable: bool = True
    fast_weight_state_fp32: bool = True
    fast_weight_compute_fp32: bool = True
    # the value width d_v of the fast-weight matrices; 0 = fast_weight_dim (d_k = d_v). The rank-aware
    # memory (ASM_CM_VR) sets it to d_state, so that one prefix mask covers the state and the values.
    fast_weight_value_dim: int = 0
    # variable rank (``docs/variable-rank.md``; upstream ASM-VR): a causal controller reads each block's
    # first token embedding and keeps the first r state coordinates of that block, r = max(#{i: sigmoid(l_i)
    # >= rank_threshold}, rank_min); every increment of the block path is projected onto them before it
    # enters the state. rank_policy: "off" (no controller), "full" (r = d_state, frozen), "fixed" (r =
    # rank_fixed, frozen) or "adaptive" (trained through straight-through soft gates, with the curriculum
    # and the budget / binary / switching losses below). rank_compute: "masked" (the reference: every
    # tensor at d_state, zeros outside the prefix) or "sliced" (the same numbers computed on the batch's
    # largest rank only: docs/variable-rank.md section 5).
    rank_policy: str = "off"
    rank_fixed: int = 0
    rank_min: int = 1
    rank_threshold: float = 0.5
    rank_target_fraction: float = 0.5
    rank_open_probability: float = 0.95
    rank_temperature_initial: float = 2.0
    rank_temperature_final: float = 0.5
    rank_warmup_steps: int = 25
    rank_ramp_steps: int = 75
    rank_hardening_steps: int = 100
    rank_budget_weight: float = 1.0
    rank_binary_weight: float = 0.01
    rank_switch_weight: float = 0.01
    rank_compute: str = "masked"
    # the rank-aware fast-weight memory (upstream ASM-CM-VR, "project_io"): the same mask on the memory's
    # value axis, its read-out and its input state
    rank_aware_memory: bool = False
    # epistemic gates (section V.4; upstream ASM-CM-E): the read gate and the hard write gate are each
    # scaled by a confidence c = q_loc q_cons in [0, 1], two MLPs on h_t = [z_t; e_t; e_{t-1}] with
    # fast_weight_confidence_layers hidden layers of fast_weight_confidence_hidden units (ReLU), dropout
    # fast_weight_confidence_dropout after each, and a sigmoid; c = fast_weight_confidence_initial at init.
    fast_weight_epistemic_gates: bool = False
    fast_weight_confidence_hidden: int = 64
    fast_weight_confidence_layers: int = 2
    fast_weight_confidence_dropout: float = 0.0
    fast_weight_confidence_initial: float = 0.9

    # ---------------------------------------------------------------- derived properties
    @property
    def has_geometry(self) -> bool:
        return self.use_drm_geometry

    @property
    def has_direction_field(self) -> bool:
        return self.use_drm_geometry and self.use_direction_field

    @property
    def has_direct_transition(self) -> bool:
        return self.use_drm_geometry and not self.use_direction_field

    @property
    def has_metric(self) -> bool:
        return self.use_drm_geometry and self.use_relational_metric

    @property
    def has_variable_rank(self) -> bool:
        return self.rank_policy != "off"

    @property
    def fast_weight_values(self) -> int:
        """d_v of the fast-weight matrices (fast_weight_value_dim, or d_k where it is 0)."""
        return self.fast_weight_value_dim or self.fast_weight_dim

    @property
    def has_relational_metric(self) -> bool:
        """Whether the relational metric module is built (the pullback metric replaces it)."""
        return self.has_metric and self.metric == "relational"

    @property
    def has_degenerate_metric(self) -> bool:
        """Whether the metric's floor can vanish (``docs/geometry.md`` section 8)."""
        return self.has_relational_metric and self.metric_diagonal != "softplus_eps"

    @property
    def has_consistency_loss(self) -> bool:
        return any(self.loss_weights.get(k, 0) for k in ("block_consistency", "sampled_block_consistency"))

    @property
    def d_read(self) -> int:
        """Width of the state as its readers see it (toroidal coordinates become cos/sin)."""
        return self.d_state + self.toroidal_dims

    def validate(self) -> None:
        positive = [
            "vocab_size",
            "d_token",
            "d_state",
            "hidden_size",
            "block_size",
            "max_seq_len",
            "mixer_hidden",
            "mixer_kernel",
            "mixer_layers",
            "mixer_dilation_growth",
            "memory_hidden",
        ]
        if self.has_direction_field:
            positive.append("n_directions")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in (
            "metric_rank",
            "direction_basis_size",
            "metric_u_basis_size",
            "refinement_layers",
            "toroidal_dims",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.toroidal_dims > self.d_state:
            raise ValueError(f"toroidal_dims ({self.toroidal_dims}) exceeds d_state ({self.d_state})")
        if self.sequence_mode not in ("block_cumsum", "recurrent"):
            raise ValueError(f"sequence_mode must be 'block_cumsum' or 'recurrent', got {self.sequence_mode!r}")
        if self.mixer not in ("causal_conv", "none"):
            raise ValueError(f"mixer must be 'causal_conv' or 'none', got {self.mixer!r}")
        if self.risk not in ("none", "dead", "powerlaw"):
            raise ValueError(f"risk must be 'none', 'dead' or 'powerlaw', got {self.risk!r}")
        if self.active_fraction_mode not in ("upper_bound", "target"):
            raise ValueError(
                f"active_fraction_mode must be 'upper_bound' or 'target', got {self.active_fraction_mode!r}"
            )
        if not self.use_drm_geometry and not self.selective_memory:
            raise ValueError("a geometry-free model (use_drm_geometry=False) needs selective_memory=True")
        if self.sequence_mode == "recurrent":
            extras = [
                name
                for name, on in (
                    ("mixer", self.mixer != "none"),
                    ("token_state_residual", self.token_state_residual),
                    ("selective_memory", self.selective_memory),
                    ("refinement_layers", self.refinement_layers > 0),
                )
                if on
            ]
            if not self.use_drm_geometry or extras:
                raise ValueError(
                    "sequence_mode='recurrent' is the plain Euler rollout of docs/drm.md section 6 (geometry, flow and "
                    "naturalization only); turn off "
                    + (", ".join(extras) or "nothing")
                    + ("" if self.use_drm_geometry else " and keep use_drm_geometry=True")
                    + " or use 'block_cumsum'"
                )
        if self.dt <= 0 or self.gate_temperature <= 0 or self.state_clip_norm <= 0:
            raise ValueError("dt, gate_temperature and state_clip_norm must be positive")
        self._validate_solvers()
        self._validate_composition()
        self._validate_metric_options()
        self._validate_fast_weight()
        self._validate_variable_rank()
        strange = sorted(set(self.loss_weights) - set(LOSS_WEIGHTS_BASE))
        if strange:
            raise unknown("loss weight", strange[0], LOSS_WEIGHTS_BASE)

    def _validate_composition(self) -> None:
        composition = self.directional_metric_composition
        if composition not in COMPOSITIONS:
            raise ValueError(
                f"directional_metric_composition must be one of {', '.join(map(repr, COMPOSITIONS))}, "
                f"got {composition!r}"
            )
        if composition != "post_naturalize" and not (self.has_direction_field and self.has_metric):
            missing = [
                name
                for name in ("use_drm_geometry", "use_direction_field", "use_relational_metric")
                if not getattr(self, name)
            ]
            raise ValueError(
                f"directional_metric_composition={composition!r} composes the direction frame with the "
                f"metric (docs/drm.md section U) and needs both; this model sets {', '.join(missing)}=False "
                f"(use 'post_naturalize', or turn them on)"
            )

    def _validate_metric_options(self) -> None:
        """``docs/geometry.md`` sections 8 and 9: the degenerate floor and the pullback metric."""
        damping = self.metric_damping
        if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not math.isfinite(damping):
            raise ValueError(f"metric_damping must be a finite number >= 0, got {damping!r}")
        if damping < 0:
            raise ValueError(f"metric_damping must be >= 0, got {damping!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(map(repr, METRICS))}, got {self.metric!r}")
        if self.metric_diagonal not in METRIC_DIAGONALS:
            raise ValueError(
                f"metric_diagonal must be one of {', '.join(map(repr, METRIC_DIAGONALS))}, got {self.metric_diagonal!r}"
            )
        if self.metric == "relational" and self.metric_diagonal == "softplus_eps":
            return
        option = (
            f"metric={self.metric!r}" if self.metric != "relational" else f"metric_diagonal={self.metric_diagonal!r}"
        )
        if not self.has_metric:
            off = [name for name in ("use_drm_geometry", "use_relational_metric") if not getattr(self, name)]
            raise ValueError(f"{option} needs a metric; this model sets {', '.join(off)}=False")
        if self.metric == "pullback" and self.metric_diagonal != "softplus_eps":
            raise ValueError(
                f"metric_diagonal={self.metric_diagonal!r} sets the relational metric's floor; metric='pullback' has none"
            )
        if damping <= 0:
            raise ValueError(
                f"metric_damping must be > 0 with {option}: G(z) may be singular, and the damping bounds its "
                f"(pseudo-)inverse"
            )
        if self.refinement_layers:
            raise ValueError(f"{option} is not built for the refinement layers; set refinement_layers=0")
        if self.metric == "pullback":
            regularisers = [name for name in RELATIONAL_METRIC_LOSSES if self.loss_weights.get(name, 0)]
            if regularisers:
                raise ValueError(
                    f"loss weight {regularisers[0]!r} regularises the relational metric; metric='pullback' has none"
                )
            return
        if self.metric_rank > self.d_state:
            raise ValueError(f"metric_rank ({self.metric_rank}) exceeds d_state ({self.d_state}) with {option}")
        if self.metric_diagonal == "none" and self.metric_rank == 0:
            raise ValueError("metric_diagonal='none' gives G = U U^T: it needs metric_rank >= 1")
        if 0 < self.metric_u_basis_size < self.metric_rank:
            raise ValueError(
                f"metric_u_basis_size ({self.metric_u_basis_size}) < metric_rank ({self.metric_rank}) makes U "
                f"rank-deficient by construction; {option} needs U of full column rank"
            )
        if self.directional_metric_composition != "post_naturalize":
            raise ValueError(
                f"{option} naturalizes through the damped pseudo-inverse (directional_metric_composition="
                f"'post_naturalize'); the metric-first compositions damp the Gram V G V^T instead"
            )
        if self.loss_weights.get("condition", 0):
            raise ValueError(f"loss weight 'condition' penalises cond G, which is infinite with {option}")

    def _validate_solvers(self) -> None:
        if self.step_mode not in ("velocity", "candidate", "geodesic"):
            raise ValueError(f"step_mode must be 'velocity', 'candidate' or 'geodesic', got {self.step_mode!r}")
        if self.block_solver not in (None, "fixed_point", "anderson"):
            raise ValueError(f"block_solver must be None, 'fixed_point' or 'anderson', got {self.block_solver!r}")
        if self.endpoint_correction_weight:
            raise ValueError(
                "endpoint_correction_weight > 0 is refused: the reference's endpoint correction is not causal "
                "(every earlier position of a block is moved by a term that depends on the block's last token); "
                "use block_solver='anderson' or 'fixed_point', which are causal"
            )
        uses_solver = self.step_mode != "velocity" or self.block_solver is not None or self.has_consistency_loss
        if uses_solver and not self.use_drm_geometry:
            raise ValueError(
                "step modes, block solvers and consistency losses need the DRM geometry "
                "(a geometry-free model such as SSM_CONTROL has no transition to solve)"
            )
        if self.step_mode == "candidate" and not self.has_direction_field:
            raise ValueError(
                "step_mode='candidate' mixes per-direction candidates and needs the direction field "
                "(use_direction_field=True)"
            )
        if self.block_solver is not None:
            if self.sequence_mode != "block_cumsum":
                raise ValueError("block_solver refines the within-block states of sequence_mode='block_cumsum'")
            if not isinstance(self.solver_iters, int) or self.solver_iters < 1:
                raise ValueError(f"solver_iters must be a positive integer, got {self.solver_iters!r}")
            if self.block_solver == "anderson" and self.anderson_history < 1:
                raise ValueError(f"anderson_history must be >= 1, got {self.anderson_history!r}")
        if self.candidate_temperature < 0.01:
            raise ValueError(f"candidate_temperature must be >= 0.01, got {self.candidate_temperature!r}")
        if self.geodesic_steps < 0 or self.sampled_consistency_interval < 1 or self.sampled_consistency_size < 1:
            raise ValueError("geodesic_steps must be >= 0; sampled_consistency_interval and _size must be >= 1")

    def _validate_fast_weight(self) -> None:
        if not self.fast_weight_memory:
            if self.fast_weight_epistemic_gates:
                raise ValueError(
                    "fast_weight_epistemic_gates scales the fast-weight memory's read and write gates: "
                    "it needs fast_weight_memory=True"
                )
            return
        if (
            not isinstance(self.fast_weight_dim, int)
            or isinstance(self.fast_weight_dim, bool)
            or self.fast_weight_dim <= 0
        ):
            raise ValueError(f"fast_weight_dim must be a positive integer, got {self.fast_weight_dim!r}")
        if self.sequence_mode != "block_cumsum":
            raise ValueError("fast_weight_memory runs after the block path: it needs sequence_mode='block_cumsum'")
        if not 0 <= self.fast_weight_write_threshold < 1:
            raise ValueError(
                f"fast_weight_write_threshold must be in [0, 1) (0: soft write gate), "
                f"got {self.fast_weight_write_threshold!r}"
            )
        for name in ("fast_weight_read_scale", "fast_weight_slow_read_scale", "fast_weight_consolidation"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        value = self.fast_weight_value_dim
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(
                f"fast_weight_value_dim must be a non-negative integer (0: fast_weight_dim), got {value!r}"
            )
        if self.fast_weight_epistemic_gates:
            self._validate_epistemic_gates()

    def _validate_variable_rank(self) -> None:
        """The variable-rank rules of docs/variable-rank.md section 7, one line each."""
        if self.rank_policy not in RANK_POLICIES:
            raise ValueError(
                f"rank_policy must be one of {', '.join(map(repr, RANK_POLICIES))}, got {self.rank_policy!r}"
            )
        if self.rank_compute not in ("masked", "sliced"):
            raise ValueError(f"rank_compute must be 'masked' or 'sliced', got {self.rank_compute!r}")
        if self.rank_aware_memory and not self.has_variable_rank:
            raise ValueError(
                "rank_aware_memory masks the memory by the block's rank: it needs rank_policy other than 'off'"
            )
        if self.rank_aware_memory and not self.fast_weight_memory:
            raise ValueError("rank_aware_memory needs the fast-weight backend (fast_weight_memory=True)")
        if not self.has_variable_rank:
            return
        policy = f"rank_policy={self.rank_policy!r}"
        if self.has_direction_field:
            raise ValueError(
                f"{policy}: variable rank does not compose with the direction field (J and its direction variants); "
                "use_direction_field=False gives J_NO_DIRECTION, J_DIRECT_CONTROL or ASM_CM"
            )
        if not self.use_drm_geometry:
            raise ValueError(f"{policy}: variable rank needs the direct transition (use_drm_geometry=True)")
        refused = [
            (self.sequence_mode != "block_cumsum", f"sequence_mode={self.sequence_mode!r} (use 'block_cumsum')"),
            (self.step_mode != "velocity", f"step_mode={self.step_mode!r} (use 'velocity')"),
            (self.block_solver is not None, f"block_solver={self.block_solver!r}"),
            (self.refinement_layers > 0, f"refinement_layers={self.refinement_layers}"),
            (self.has_consistency_loss, "the block-consistency loss weights"),
            (self.toroidal_dims > 0, f"toroidal_dims={self.toroidal_dims} (a masked angle does not read as zero)"),
        ]
        for bad, what in refused:
            if bad:
                raise ValueError(f"{policy}: variable rank refuses {what}")
        if self.fast_weight_memory and not self.rank_aware_memory:
            raise ValueError(
                f"{policy} with fast_weight_memory=True needs rank_aware_memory=True (the memory would keep and "
                "write back the coordinates the mask discards)"
            )
        if self.rank_aware_memory and self.fast_weight_values != self.d_state:
            raise ValueError(
                f"rank_aware_memory needs fast_weight_value_dim equal to d_state ({self.d_state}), "
                f"got {self.fast_weight_values}"
            )
        for name in ("rank_min", "rank_fixed", "rank_warmup_steps", "rank_ramp_steps", "rank_hardening_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not 1 <= self.rank_min <= self.d_state:
            raise ValueError(f"rank_min must be in [1, d_state={self.d_state}], got {self.rank_min}")
        if self.rank_policy == "fixed":
            if self.rank_fixed > self.d_state:
                raise ValueError(f"rank_fixed ({self.rank_fixed}) exceeds d_state ({self.d_state})")
            if self.rank_fixed < self.rank_min:
                raise ValueError(f"rank_fixed ({self.rank_fixed}) is below rank_min ({self.rank_min})")
        for name in ("rank_threshold", "rank_open_probability"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < 1):
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        if not (isinstance(self.rank_target_fraction, (int, float)) and 0 < self.rank_target_fraction <= 1):
            raise ValueError(f"rank_target_fraction must be in (0, 1], got {self.rank_target_fraction!r}")
        for name in ("rank_temperature_initial", "rank_temperature_final"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("rank_budget_weight", "rank_binary_weight", "rank_switch_weight"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def _validate_epistemic_gates(self) -> None:
        for name in ("fast_weight_confidence_hidden", "fast_weight_confidence_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        dropout = self.fast_weight_confidence_dropout
        if not (isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0 <= dropout < 1):
            raise ValueError(f"fast_weight_confidence_dropout must be in [0, 1), got {dropout!r}")
        initial = self.fast_weight_confidence_initial
        if not (isinstance(initial, (int, float)) and not isinstance(initial, bool) and 0 < initial < 1):
            raise ValueError(
                f"fast_weight_confidence_initial must be in (0, 1) (each factor starts at its square root), "
                f"got {initial!r}"
            )


# ---------------------------------------------------------------------------------------
# Presets: the dimensions only. ``125m`` is the reference configuration; ``tiny`` and
# ``small`` give J about 1.0M and 10.2M parameters (``docs/drm.md`` section A.1).
PRESET_DIMS: dict[str, dict] = {
    "micro": dict(
        d_token=16,
        d_state=16,
        n_directions=4,
        metric_rank=4,
        hidden_size=32,
        direction_basis_size=8,
        metric_u_basis_size=8,
        mixer_hidden=16,
        mixer_kernel=4,
        memory_hidden=16,
        block_size=8,
        max_seq_len=32,
        fast_weight_dim=8,
    ),
    "tiny": dict(
        d_token=128,
        d_state=128,
        n_directions=8,
        metric_rank=8,
        hidden_size=384,
        direction_basis_size=16,
        metric_u_basis_size=16,
        mixer_hidden=128,
        mixer_kernel=8,
        memory_hidden=64,
        block_size=64,
        max_seq_len=256,
        fast_weight_dim=64,
    ),
    "small": dict(
        d_token=448,
        d_state=448,
        n_directions=16,
        metric_rank=16,
        hidden_size=1344,
        direction_basis_size=32,
        metric_u_basis_size=32,
        mixer_hidden=224,
        mixer_kernel=8,
        memory_hidden=112,
        block_size=64,
        max_seq_len=512,
        fast_weight_dim=64,
    ),
    "125m": dict(
        d_token=1536,
        d_state=1536,
        n_directions=64,
        metric_rank=64,
        hidden_size=3584,
        direction_basis_size=128,
        metric_u_basis_size=128,
        mixer_hidden=256,
        mixer_kernel=8,
        memory_hidden=256,
        block_size=64,
        max_seq_len=512,
        fast_weight_dim=128,
    ),
}


def _variant_overrides(name: str, dims: dict) -> dict:
    """The variant's changes relative to the preset (``docs/drm.md`` section A.5.3)."""
    m = dims["mixer_hidden"]
    dilated = dict(mixer_hidden=2 * m, mixer_layers=4, mixer_dilation_growth=2)
    gate_fix = dict(
        active_fraction_mode="target",
        target_active_fraction=0.5,
        gate_logit_bias=0.0,
        loss_weights={**CE_ONLY, "active_fraction": 0.01},
    )
    ce_only = dict(loss_weights=dict(CE_ONLY))
    a = dict(risk="dead", loss_weights=dict(LOSS_WEIGHTS_BASE))
    b = dict(a, **ce_only)
    c = dict(b, **gate_fix)
    d = dict(c, token_state_residual=True)
    j = dict(ce_only, risk="none", token_state_residual=True, selective_memory=True)
    direct = dict(
        j, use_direction_field=False, use_relational_metric=False, use_metric_naturalization=False, step_mode="velocity"
    )
    asm_cm = dict(
        j,
        use_direction_field=False,
        fast_weight_memory=True,
        fast_weight_durable=True,
        fast_weight_write_threshold=0.5,
        fast_weight_state_fp32=True,
        fast_weight_compute_fp32=True,
    )
    # the variable-rank line (docs/variable-rank.md): full rank by default, upstream's Phase 3A curriculum
    variable_rank = dict(
        rank_policy="full",
        rank_warmup_steps=50,
        rank_ramp_steps=150,
        rank_hardening_steps=200,
        rank_budget_weight=0.0025,
        rank_binary_weight=0.01,
        rank_switch_weight=0.001,
    )
    table = {
        "A": a,
        "B": b,
        "C": c,
        "D": d,
        "E": dict(d, block_size=max(1, dims["block_size"] // 4)),
        "F": dict(d, **dilated),
        "G": dict(c, token_state_residual=True, refinement_layers=1, **_narrow_two_stage(dims)),
        "H": dict(ce_only, risk="none", token_state_residual=True, **dilated),
        "I": dict(ce_only, risk="none", token_state_residual=True, **dilated, **gate_fix),
        "J": j,
        "J_DILATED": dict(j, mixer_hidden=max(1, round(m * 11 / 8)), mixer_layers=4, mixer_dilation_growth=2),
        "J_NO_METRIC": dict(j, use_relational_metric=False),
        "J_NO_DIRECTION": dict(j, use_direction_field=False),
        "J_NO_NATURALIZATION": dict(j, use_metric_naturalization=False),
        "SSM_CONTROL": dict(j, use_drm_geometry=False),  # memory width matched in build_config
        # the upstream project's later variants (docs/drm.md section U): the direct transition with
        # neither metric nor naturalization (ASM-D), and the same with its memory widened until its
        # count is nearest to J_NO_DIRECTION's (ASM-S; width matched in build_config)
        "J_DIRECT_CONTROL": direct,
        "J_DIRECT_CONTROL_MATCHED": direct,
        # ... and J with a metric-first composition in place of naturalization (ASM-U, ASM-F)
        "J_METRIC_SUBSPACE": dict(j, directional_metric_composition="metric_subspace"),
        "J_METRIC_ORTHONORMAL_DIRECTION": dict(j, directional_metric_composition="metric_orthonormal"),
        # ASM-CM (section V): J_NO_DIRECTION with the durable fast-weight memory, float32 state and compute
        "ASM_CM": asm_cm,
        # variable rank (docs/variable-rank.md): ASM-VR-R = J_NO_DIRECTION without selective memory,
        # ASM-VR-RS = J_NO_DIRECTION, ASM-VR-S = the direct control with its memory widened to ASM_CM's
        # count (width matched in build_config), ASM-CM-VR = ASM_CM with the rank-aware memory (d_v = d_state)
        "ASM_VR_R": dict(j, use_direction_field=False, selective_memory=False, **variable_rank),
        "ASM_VR_RS": dict(j, use_direction_field=False, **variable_rank),
        "ASM_VR_S": dict(direct, **variable_rank),
        "ASM_CM_VR": dict(asm_cm, rank_aware_memory=True, **variable_rank),
    }
    # ASM-CM-E (section V.4): ASM_CM with the epistemic gates on its memory's read and write
    table["ASM_CM_E"] = dict(table["ASM_CM"], fast_weight_epistemic_gates=True)
    return table[name]


def _narrow_two_stage(dims: dict) -> dict:
    """G's narrower dimensions: at 125m d 1024, n = r = 48, H 3200, bases 64, mixer 512."""

    def scale(value, ratio):
        return max(1, round(value * ratio))

    return dict(
        d_token=scale(dims["d_token"], 2 / 3),
        d_state=scale(dims["d_state"], 2 / 3),
        n_directions=scale(dims["n_directions"], 3 / 4),
        metric_rank=scale(dims["metric_rank"], 3 / 4),
        hidden_size=scale(dims["hidden_size"], 3200 / 3584),
        direction_basis_size=scale(dims["direction_basis_size"], 1 / 2),
        metric_u_basis_size=scale(dims["metric_u_basis_size"], 1 / 2),
        mixer_hidden=2 * dims["mixer_hidden"],
    )


VARIANTS = (
    "A",
    "B",
    "C",
    "D",
    "E",
    "F",
    "G",
    "H",
    "I",
    "J",
    "J_DILATED",
    "J_NO_DIRECTION",
    "J_NO_METRIC",
    "J_NO_NATURALIZATION",
    "SSM_CONTROL",
    "J_DIRECT_CONTROL",
    "J_DIRECT_CONTROL_MATCHED",
    "J_METRIC_SUBSPACE",
    "J_METRIC_ORTHONORMAL_DIRECTION",
    "ASM_CM",
    "ASM_VR_R",
    "ASM_VR_RS",
    "ASM_VR_S",
    "ASM_CM_VR",
    "ASM_CM_E",
)
# variant -> (the variant whose parameter count its memory width matches, the matching rule)
MATCHED_MEMORY = {
    "SSM_CONTROL": ("J", "floor"),
    "J_DIRECT_CONTROL_MATCHED": ("J_NO_DIRECTION", "nearest"),
    "ASM_VR_S": ("ASM_CM", "nearest"),  # upstream's PMCS-64 arm (S = 465 at its d = 64 preset)
}


def _quarter_state(values: dict) -> int:
    return max(1, values["d_state"] // 4)


# variant -> {field: its value from the resolved fields}, unless the caller sets the field: the
# variable-rank floor at a quarter of the state (upstream's r_min = 16 at d = 64) and the rank-aware
# memory's value width d_v = d_state
DERIVED_FIELDS = {
    "ASM_VR_R": {"rank_min": _quarter_state},
    "ASM_VR_RS": {"rank_min": _quarter_state},
    "ASM_VR_S": {"rank_min": _quarter_state},
    "ASM_CM_VR": {"rank_min": _quarter_state, "fast_weight_value_dim": lambda values: values["d_state"]},
}


def build_config(variant: str, preset: str, vocab_size: int = 256, **overrides) -> DRMConfig:
    """Resolve preset dimensions, then the variant, then ``overrides`` into a DRMConfig."""
    if variant not in VARIANTS:
        raise unknown("DRM variant", variant, VARIANTS)
    if preset not in PRESET_DIMS:
        raise unknown("preset", preset, PRESETS)
    names = {f.name for f in dataclasses.fields(DRMConfig)}
    for key in overrides:
        if key not in names:
            raise unknown("DRM config key", key, names)
    dims = dict(PRESET_DIMS[preset])
    values = {**dims, **_variant_overrides(variant, dims), "vocab_size": vocab_size}
    if "loss_weights" in overrides:  # a partial dict updates the variant's weights
        overrides = dict(overrides, loss_weights={**values.get("loss_weights", CE_ONLY), **overrides["loss_weights"]})
    values.update(overrides)
    for key, derive in DERIVED_FIELDS.get(variant, {}).items():
        if key not in overrides:
            values[key] = derive(values)
    config = DRMConfig(**values)
    config.validate()
    if variant in MATCHED_MEMORY and "memory_hidden" not in overrides:
        reference_variant, rule = MATCHED_MEMORY[variant]
        own = set(_variant_overrides(variant, dims)) - set(_variant_overrides(reference_variant, dims))
        reference = build_config(
            reference_variant, preset, vocab_size, **{k: v for k, v in overrides.items() if k not in own}
        )
        config.memory_hidden = matched_memory_width(config, closed_form_parameter_count(reference), rule=rule)
    return config


# ---------------------------------------------------------------------------------------
# Closed-form parameter counts (``docs/drm.md`` section A.5.1), used to match widths.
def _trunk(c: DRMConfig) -> int:
    return (c.d_read + 1) * c.hidden_size + (c.hidden_size + 1) * c.hidden_size


def _direction_field(c: DRMConfig) -> int:
    h, n = c.hidden_size, c.n_directions
    head = (
        (h + 1) * n * c.direction_basis_size + c.direction_basis_size * c.d_state
        if c.direction_basis_size
        else (h + 1) * n * c.d_state
    )
    return _trunk(c) + head + (h + 1) * n


def _metric(c: DRMConfig) -> int:
    h, r, p = c.hidden_size, c.metric_rank, c.metric_u_basis_size
    u = ((h + 1) * r * p + p * c.d_state if p else (h + 1) * c.d_state * r) if r else 0
    diagonal = (h + 1) * c.d_state if c.metric_diagonal != "none" else 0
    return _trunk(c) + diagonal + u


def _flow(c: DRMConfig) -> int:
    return (c.d_read + c.d_token + 1) * c.hidden_size + (c.hidden_size + 1) * c.n_directions


def closed_form_parameter_count(c: DRMConfig) -> int:
    """The exact parameter count of the model ``c`` describes, computed without building it (the
    tests check it against the built model; :func:`drmlab.models.count_parameters` counts a built one)."""
    ds, dt, h = c.d_state, c.d_token, c.hidden_size
    total = c.vocab_size * dt + ds  # embedding, z0
    total += c.d_read + (c.d_read + 1) * h + (h + 1) * c.vocab_size  # emitter
    if c.has_direction_field:
        total += _direction_field(c) + _flow(c)
    if c.has_direct_transition:
        total += (c.d_read + dt + 1) * h + (h + 1) * ds
    if c.has_relational_metric:
        total += _metric(c)
    if c.use_drm_geometry and c.risk != "none":
        total += (c.d_read + 1) * h + 2 * h + 2 + 4
    if c.mixer == "causal_conv":
        m = c.mixer_hidden
        total += (3 * ds + dt + 3) * m + c.mixer_layers * (m * c.mixer_kernel + m + m * m + m) + (m + 1) * ds
    if c.token_state_residual:
        total += dt * ds
    if c.selective_memory:
        total += (c.d_read + dt + 1) * c.memory_hidden + 3 * (c.memory_hidden + 1) * ds
    if c.has_geometry:
        total += c.refinement_layers * (_direction_field(c) + _metric(c) + _flow(c))
    if c.fast_weight_memory:  # section V: W_k, W_v and b_v, the gates (the consolidation gate if durable), W_o
        k, v = c.fast_weight_dim, c.fast_weight_values
        total += (
            k * dt + (c.d_read + dt + 1) * v + (4 if c.fast_weight_durable else 3) * (c.d_read + 2 * dt + 1) + ds * v
        )
        if c.fast_weight_epistemic_gates:  # section V.4: four MLPs (two factors for each of two gates)
            u = c.fast_weight_confidence_hidden
            total += 4 * ((c.d_read + 2 * dt + 1) * u + (c.fast_weight_confidence_layers - 1) * (u + 1) * u + u + 1)
    if c.has_variable_rank:  # the rank controller's score head (docs/variable-rank.md section 2)
        total += (dt + 1) * ds
    return total


def matched_memory_width(control: DRMConfig, target: int, rule: str = "floor") -> int:
    """The memory width S that matches ``control``'s parameter count to ``target``.

    ``rule="floor"``: the largest S whose model does not exceed ``target`` (the reference
    SSM_CONTROL, S = 14,944 at 125m). ``rule="nearest"``: the S whose count is nearest to
    ``target``, the upstream ASM-S rule (S = 7,212 at 125m, 300 parameters above J_NO_DIRECTION;
    the floor rule would give 7,211, 7,381 below); a tie goes to the smaller width.
    """
    if rule not in ("floor", "nearest"):
        raise ValueError(f"rule must be 'floor' or 'nearest', got {rule!r}")
    per_unit = control.d_read + control.d_token + 1 + 3 * control.d_state
    without = closed_form_parameter_count(dataclasses.replace(control, memory_hidden=0))
    width = max(1, (target - without) // per_unit)
    if rule == "nearest" and abs(without + (width + 1) * per_unit - target) < abs(without + width * per_unit - target):
        width += 1
    return width
