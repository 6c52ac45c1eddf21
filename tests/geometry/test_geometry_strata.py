"""Rank strata (docs/geometry.md section 2) on a metric whose rank is known in closed form."""

from __future__ import annotations

import torch

from drmlab.geometry.metric import dense
from drmlab.geometry.strata import exact_ranks, numerical_ranks, stratify

F64 = torch.float64


def _metric_along(z):
    """gamma_k(z) = max(z_k, 0)^2 and U(z) = 0 except one column (z_0 + z_1 ... ) living on coordinate 3:
    rank G(z) = #{k < 3: z_k > 0} + [z_3 != 0] exactly."""
    gamma = torch.cat([z[:, :3].clamp_min(0) ** 2, torch.zeros_like(z[:, 3:])], dim=1)
    U = torch.zeros(z.shape[0], 4, 1, dtype=F64)
    U[:, 3, 0] = z[:, 3]
    return gamma, U


def test_exact_strata_of_a_line_crossing_the_coordinate_planes():
    t = torch.linspace(0, 1, 101, dtype=F64).unsqueeze(1)
    # z_0 > 0 for t > 0.2, z_1 > 0 for t > 0.5, z_2 > 0 for t > 0.8 (strictly); z_3 = 0 then 1 past t = 0.5
    z = torch.cat([t - 0.2, t - 0.5, t - 0.8, (t > 0.5).to(F64)], dim=1)
    ranks = exact_ranks(*_metric_along(z))
    expected = (t[:, 0] > 0.2).long() + (t[:, 0] > 0.5).long() * 2 + (t[:, 0] > 0.8).long()
    assert torch.equal(ranks, expected)
    summary = stratify(ranks)
    assert summary["strata"] == [0, 1, 3, 4]
    assert summary["transitions"] == {"0->1": 1, "1->3": 1, "3->4": 1} and summary["changes"] == 3
    assert summary["occupancy"] == {0: 21 / 101, 1: 30 / 101, 3: 30 / 101, 4: 20 / 101}
    assert summary["mean_dwell"] == 101 / 4


def test_numerical_ranks_agree_away_from_the_boundaries_and_say_their_tolerance():
    z = torch.tensor([[0.5, -1.0, 0.3, 0.0], [0.5, 0.4, 0.3, 2.0]], dtype=F64)
    gamma, U = _metric_along(z)
    sigma = torch.linalg.eigvalsh(dense(gamma, U))
    assert torch.equal(numerical_ranks(sigma, 1e-6), exact_ranks(gamma, U))
    assert numerical_ranks(sigma, 0.5).tolist() == [1, 1]  # a coarse tolerance merges strata: approximate


def test_transitions_are_counted_within_trajectories_only():
    labels = torch.tensor([[2, 2, 3], [3, 3, 3]])
    summary = stratify(labels)
    assert summary["transitions"] == {"2->3": 1} and summary["occupancy"] == {2: 2 / 6, 3: 4 / 6}
