"""Geometry diagnostics of ``docs/drm.md`` sections 2, 4 and 14 to 16 (and V.4's memory confidences).

Everything here is a *measurement*, never a claim: dimD is gate activity (section 2),
G is full rank by construction (section 4; a degenerate floor, ``docs/geometry.md`` section 8, has
its exact rank from the floor's zero set), so the spectral ranks below are labelled numerical
approximations, and a low action is a diagnostic, not evidence of a geodesic (section 14).
"""

from __future__ import annotations

import torch

from drmlab.ops import coupling_matrix, exact_rank, metric_dense, metric_energy

from .model import DRMModel


def _entropy_rank(values: torch.Tensor) -> torch.Tensor:
    """exp of the Shannon entropy of the normalised non-negative spectrum (last axis)."""
    p = values.clamp_min(0) / values.clamp_min(0).sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.exp(-(p * p.clamp_min(1e-300).log()).sum(-1))


def _participation_ratio(values: torch.Tensor) -> torch.Tensor:
    """(sum lambda)^2 / sum lambda^2 over the last axis."""
    return values.sum(-1) ** 2 / (values**2).sum(-1).clamp_min(1e-300)


@torch.no_grad()
def geometry_report(model: DRMModel, tokens: torch.Tensor, rank_tolerance: float = 1e-6) -> dict:
    """Measure the geometry of ``model`` on ``tokens`` [B, T] (evaluation mode, full strength)."""
    c = model.config
    states, record = model.states(tokens)
    report: dict = {"variant": model.model_name, "blocks": len(record), "positions": int(tokens.shape[1])}
    if not record:
        report["note"] = "geometry-free model: no directions, gates or metric to report"
        return report
    if record[0].gates is not None:
        gates = torch.stack([g.gates for g in record], dim=1)  # [B, nb, n]
        dim_d = gates.sum(-1)
        report["dimD_mean"] = float(dim_d.mean())
        report["dimD_std"] = float(dim_d.std(unbiased=False))
        report["dimD_max_possible"] = c.n_directions
        quantiles = torch.quantile(gates.flatten().double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
        report["gate_quantiles_10_50_90"] = [float(q) for q in quantiles]  # on individual gates
        for threshold in (0.25, 0.5, 0.75, 0.9):
            report[f"gates_above_{threshold}"] = float((gates > threshold).double().mean())
        directions = torch.stack([g.directions for g in record], dim=1)  # [B, nb, n, d]
        sv = torch.linalg.svdvals(directions.double())
        report["direction_frame_rank_numerical"] = float((sv > rank_tolerance * sv[..., :1]).sum(-1).double().mean())
        report["direction_frame_entropy_rank"] = float(_entropy_rank(sv**2).mean())
        if c.direction_basis_size:
            report["direction_subspace_dim"] = c.direction_basis_size  # every V_i lies in the basis row space
    velocity = torch.cat([g.velocity for g in record], dim=1)
    if record[0].gamma is not None:
        energies = torch.cat(
            [metric_energy(g.gamma + g.rho.unsqueeze(-1), g.u_factor, g.velocity) for g in record], dim=1
        )
        g_dense = torch.stack([metric_dense(g.gamma, g.u_factor) for g in record], dim=1).double()  # [B, nb, d, d]
        eig = torch.linalg.eigvalsh(g_dense)
        report["metric_energy_mean"] = float(energies.mean())
        report["action"] = float((c.dt * energies).sum(-1).mean())  # sum_t dt v^T G v, mean over the batch
        report["metric_entropy_rank_approx"] = float(_entropy_rank(eig).mean())
        report["metric_participation_ratio_approx"] = float(_participation_ratio(eig).mean())
        if c.metric == "pullback":  # rank G_pb <= min(d, V - 1) (F 1 = 0); its exact rank is not constructed
            report["metric_exact_rank_bound"] = min(c.d_state, c.vocab_size - 1)
        elif c.has_degenerate_metric:  # the floor's zero set (docs/geometry.md section 8): cond G is infinite
            ranks = torch.stack([exact_rank(g.gamma, g.u_factor) for g in record], dim=1).double()
            report["metric_exact_rank_mean"] = float(ranks.mean())
            report["metric_exact_rank_min"] = int(ranks.min())
        else:
            report["metric_exact_rank"] = c.d_state  # diagonal floor eps > 0: full rank in exact arithmetic
            report["metric_condition_number"] = float((eig[..., -1] / eig[..., 0]).mean())
        report["metric_low_rank_width"] = c.metric_rank
        if record[0].directions is not None:
            coupling = torch.stack([coupling_matrix(g.directions, g.gamma, g.u_factor) for g in record], dim=1)
            report["coupling_matrix_first_block"] = coupling[0, 0].tolist()
            off = coupling - torch.diag_embed(torch.diagonal(coupling, dim1=-2, dim2=-1))
            report["coupling_offdiag_abs_mean"] = float(off.abs().mean())
    else:
        report["action_euclidean"] = float((c.dt * velocity.pow(2).sum(-1)).sum(-1).mean())
    if record[0].fast_weight_confidence is not None:  # section V.4: the memory's read and write confidences
        for index, gate in enumerate(("read", "write")):
            values = torch.cat([g.fast_weight_confidence[index] for g in record], dim=1)
            report[f"fast_weight_{gate}_confidence_mean"] = float(values.mean())
    report["state_norm_mean"] = float(states.norm(dim=-1).mean())
    if c.toroidal_dims:
        report["toroidal_dims"] = c.toroidal_dims
    return report
