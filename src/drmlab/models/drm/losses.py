"""Auxiliary objective of ``docs/drm.md`` section 11 (the terms: section A.6).

L = CE + lambda_action L_action + sum_k lambda_k R_k. Every term is computed from the
per-block geometry record, each block's values counting once per position of the block.
Only terms whose weight is nonzero are evaluated. ``dim_entropy`` enters with a minus
sign (it rewards gate entropy).
"""

from __future__ import annotations

import math

import torch

from drmlab.ops import metric_energy

from .config import DRMConfig


def _position_mean(values: list[torch.Tensor], lengths: list[int]) -> torch.Tensor:
    """Mean over (batch, positions) of per-block values [B] that repeat over each block."""
    total = sum(v.sum() * n for v, n in zip(values, lengths))
    return total / (values[0].shape[0] * sum(lengths))


def auxiliary_losses(config: DRMConfig, record, states: torch.Tensor, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Return ``{"loss/<term>": value, ..., "loss_aux": weighted sum}`` for the nonzero weights."""
    weights = {k: v for k, v in config.loss_weights.items() if v != 0}
    lengths = [g.length for g in record]
    n = max(config.n_directions, 1)
    has_gates = record[0].gates is not None
    has_metric = record[0].gamma is not None
    zero = states.new_zeros(())

    def dim_d():
        return [g.gates.sum(-1) if has_gates else g.rho * 0 for g in record]

    terms: dict[str, torch.Tensor] = {}
    for name in weights:
        if name == "action":
            energies = []
            for g in record:
                if has_metric:
                    energies.append(metric_energy(g.gamma + g.rho.unsqueeze(-1), g.u_factor, g.velocity))
                else:
                    energies.append(g.velocity.pow(2).sum(-1))
            terms[name] = torch.cat(energies, dim=1).mean()
        elif name == "dim_sparsity":
            terms[name] = _position_mean(dim_d(), lengths)
        elif name == "dim_entropy":
            if has_gates:
                ent = []
                for g in record:
                    a = g.gates.clamp(1e-8, 1 - 1e-8)
                    ent.append((-(a * a.log()) - (1 - a) * (1 - a).log()).mean())
                terms[name] = torch.stack(ent).mean()
            else:
                terms[name] = zero
        elif name == "dim_variance":
            values = dim_d()
            mean = _position_mean(values, lengths)
            var = _position_mean([(v - mean) ** 2 for v in values], lengths)
            std = torch.sqrt(var + 1e-12)  # population std; the 1e-12 keeps the gradient finite at 0
            terms[name] = torch.relu(config.target_dim_std - std) ** 2
        elif name == "active_fraction":
            fraction = _position_mean(dim_d(), lengths) / n
            if config.active_fraction_mode == "upper_bound":
                terms[name] = torch.relu(fraction - config.target_active_fraction) ** 2
            else:
                terms[name] = (fraction - config.target_active_fraction) ** 2
        elif name == "metric_reg" and has_metric:
            terms[name] = torch.stack(
                [g.gamma.pow(2).mean() + (g.u_factor.pow(2).mean() if g.u_factor.numel() else 0) for g in record]
            ).mean()
        elif name == "metric_diversity" and has_metric:
            total = sum(lengths)
            mean = sum(g.gamma * g.length for g in record) / total  # [B, d]
            var = sum((g.gamma - mean) ** 2 * g.length for g in record) / total
            terms[name] = -var.mean()
        elif name == "condition" and has_metric:
            chi = [
                (g.gamma.amax(-1) + g.u_factor.pow(2).sum((-1, -2))) / g.gamma.amin(-1).clamp_min(1e-8) for g in record
            ]
            terms[name] = torch.relu(_position_mean(chi, lengths).log() - math.log(config.target_condition)) ** 2
        elif name == "metric_u_floor" and has_metric and config.metric_rank > 0:
            norms = [g.u_factor.pow(2).sum((-1, -2)).sqrt() for g in record]
            terms[name] = _position_mean([torch.relu(config.metric_u_min_norm - u) ** 2 for u in norms], lengths)
        elif name == "metric_u_target" and has_metric and config.metric_rank > 0:
            norms = [g.u_factor.pow(2).sum((-1, -2)).sqrt() for g in record]
            terms[name] = (_position_mean(norms, lengths) - config.metric_u_target_norm) ** 2
        elif name == "recurrence":
            terms[name] = (states[:, -1].norm(dim=-1) - states[:, 0].norm(dim=-1)).pow(2).mean()
        elif name == "stability":
            terms[name] = (logits[:, 1:] - logits[:, :-1]).pow(2).mean() if logits.shape[1] > 1 else zero
        elif name == "blindspot":
            terms[name] = _position_mean([g.rho for g in record], lengths)
        elif name in ("block_consistency", "sampled_block_consistency"):
            parts = [g.consistency[name] for g in record if g.consistency and name in g.consistency]
            if parts:
                terms[name] = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    total = zero
    for name, value in terms.items():
        sign = -1.0 if name == "dim_entropy" else 1.0
        total = total + sign * weights[name] * value
    out = {f"loss/{name}": value for name, value in terms.items()}
    out["loss_aux"] = total
    return out
