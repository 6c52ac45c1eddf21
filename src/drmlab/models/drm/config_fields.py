"""The DRM config itself: :class:`DRMConfig`, every field that changes a DRM model or its loss, with the
defaults of the reference configuration (``docs/drm.md`` section A.1), and the properties derived from
them; its checks are :mod:`~drmlab.models.drm.config_checks`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .config_checks import DRMConfigChecks
from .config_options import CE_ONLY


@dataclass
class DRMConfig(DRMConfigChecks):
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
    # under a reduced-precision autocast: False keeps the memory's matrix products in float32 too; True
    # runs them in the autocast dtype (bf16 operands) and widens their outputs to float32 before the
    # gates' nonlinearities, so the gates and the scan stay float32 (docs/drm.md appendix A.4.7)
    memory_products_in_autocast: bool = False
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
