"""The model's geometry at a sampled evaluation, as plain numbers for the evaluation row of metrics.jsonl.

For a DRM model (docs/drm.md sections 2, 4 and 14) this is the scalar part of
:func:`drmlab.models.drm.diagnostics.geometry_report` on the first :data:`WINDOWS` windows of the
sampled evaluation: dimD (gate activity), the 10/50/90 % quantiles of the individual gates, the share
of gates above each threshold, the direction frame's ranks, the metric energy v^T G v and the action,
the metric's spectrum summaries and the mean state norm. Constants of the configuration (dimD's
ceiling, the metric's exact rank and width) and whole matrices are left out: a row holds what moves
during training. Other models, and geometry-free DRM variants (SSM_CONTROL), have nothing to report.

The report's spectra are dense float64 eigen-decompositions of every block's metric; on two windows
it costs about 15% of a 32-window sampled evaluation (J tiny 0.09 s beside 0.63 s, J small 0.56 s
beside 3.7 s, one CPU thread).
"""

from __future__ import annotations

import torch

# Entries of the geometry report that are settings, not measurements.
CONFIG_CONSTANTS = (
    "dimD_max_possible",
    "metric_exact_rank",
    "metric_low_rank_width",
    "direction_subspace_dim",
    "blocks",
    "positions",
    "toroidal_dims",
)
GATE_QUANTILES = ("gate_q10", "gate_q50", "gate_q90")
WINDOWS = 2  # validation windows the diagnostics are measured on


@torch.no_grad()
def evaluation_diagnostics(model: torch.nn.Module, windows: torch.Tensor, device: torch.device) -> dict[str, float]:
    """``{name: value}`` of the geometry of ``model`` (eval mode, full strength) on the inputs of
    ``windows`` [n, T + 1]; empty for a model without geometry diagnostics."""
    from drmlab.models.drm import DRMModel

    if not isinstance(model, DRMModel) or windows is None or windows.shape[0] == 0:
        return {}
    from drmlab.models.drm.diagnostics import geometry_report

    was_training = model.training
    model.eval()
    try:
        report = geometry_report(model, windows[:, :-1].to(device))
    finally:
        model.train(was_training)
    out: dict[str, float] = {}
    for key, value in report.items():
        if key == "gate_quantiles_10_50_90":
            out.update({name: float(q) for name, q in zip(GATE_QUANTILES, value)})
        elif isinstance(value, float) and key not in CONFIG_CONSTANTS:
            out[key] = value
    return out
