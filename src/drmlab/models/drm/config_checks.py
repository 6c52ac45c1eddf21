"""The checks of a DRM config (:meth:`DRMConfig.validate <drmlab.models.drm.config.DRMConfig.validate>`):
each field's range and the combinations the model refuses, one line each naming the field and what to
set instead (the compositions of ``docs/drm.md`` section U, the metric options of ``docs/geometry.md``
sections 8 and 9, the solvers, the fast-weight memory of section V and its gates, variable rank's rules
of ``docs/variable-rank.md`` section 7)."""

from __future__ import annotations

import math

from drmlab.naming import unknown

from .config_options import (
    COMPOSITIONS,
    LOSS_WEIGHTS_BASE,
    METRIC_DIAGONALS,
    METRICS,
    RANK_POLICIES,
    RELATIONAL_METRIC_LOSSES,
)


class DRMConfigChecks:
    """The validation of :class:`~drmlab.models.drm.config.DRMConfig`, as its methods."""

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
