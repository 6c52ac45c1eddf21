"""The DRM config's option tables: the loss weights (``docs/drm.md`` sections 11 and A.1.2) and the
values its choice fields may take (``docs/variable-rank.md`` section 3, ``docs/drm.md`` sections 5 and U,
``docs/geometry.md`` sections 8 and 9)."""

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
