"""Degenerate metric (docs/geometry.md section 1): exact kernel and damped pseudo-inverse, float64."""

from __future__ import annotations

import pytest
import torch

from drmlab.geometry.metric import (
    damped_pinv_apply,
    dense,
    exact_rank,
    kernel_basis,
    kernel_split,
    naturalize_degenerate,
    numerical_rank,
)
from drmlab.ops import woodbury_solve


def _metric(d=12, r=4, zeros=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(d, r, generator=g, dtype=torch.float64)
    gamma = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    gamma[: (d if zeros is None else zeros)] = 0.0
    return gamma, U


def _dense_pinv(G, rank, damping):
    """Sum over the top ``rank`` eigenpairs of q q^T / (sigma + damping): the dense reference."""
    sigma, q = torch.linalg.eigh(G)
    sigma, q = sigma[-rank:], q[:, -rank:]
    return (q / (sigma + damping)) @ q.mT


@pytest.mark.parametrize("zeros,expected_kernel", [(None, 8), (6, 2), (3, 0), (0, 0)])
def test_the_kernel_is_exact_and_annihilated(zeros, expected_kernel):
    gamma, U = _metric(zeros=zeros)
    G = dense(gamma, U)
    K = kernel_basis(gamma, U)
    assert K.shape == (12, expected_kernel)
    assert exact_rank(gamma, U) == 12 - expected_kernel
    if expected_kernel:
        assert (G @ K).abs().max() / G.abs().max() < 1e-12
        assert torch.allclose(K.mT @ K, torch.eye(expected_kernel, dtype=torch.float64), atol=1e-13)
    # the dense spectrum agrees: exactly expected_kernel eigenvalues at rounding level
    sigma = torch.linalg.eigvalsh(G)
    assert int((sigma.abs() < 1e-12 * sigma.max()).sum()) == expected_kernel


@pytest.mark.parametrize("zeros", [None, 6, 0])
@pytest.mark.parametrize("damping", [0.0, 1e-3, 0.3])
def test_the_damped_pseudo_inverse_matches_a_dense_eigendecomposition(zeros, damping):
    gamma, U = _metric(zeros=zeros)
    G = dense(gamma, U)
    v = torch.randn(5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = damped_pinv_apply(gamma, U, v, damping)
    want = v @ _dense_pinv(G, exact_rank(gamma, U), damping)
    assert (got - want).abs().max() / want.abs().max() < 1e-10
    if damping == 0.0:
        assert (got - v @ torch.linalg.pinv(G, hermitian=True)).abs().max() / want.abs().max() < 1e-10


def test_the_pseudo_inverse_is_moore_penrose_and_kills_the_kernel():
    gamma, U = _metric(zeros=None)
    G = dense(gamma, U)
    P = damped_pinv_apply(gamma, U, torch.eye(12, dtype=torch.float64))
    assert (G @ P @ G - G).abs().max() < 1e-10 * G.abs().max()
    assert (P @ G @ P - P).abs().max() < 1e-10 * P.abs().max()
    K = kernel_basis(gamma, U)
    assert damped_pinv_apply(gamma, U, K.mT, 0.3).abs().max() < 1e-12


def test_a_positive_floor_reduces_to_the_woodbury_solve():
    gamma, U = _metric(zeros=0)
    v = torch.randn(3, 12, dtype=torch.float64)
    assert torch.allclose(
        damped_pinv_apply(gamma, U, v, 0.3), woodbury_solve(gamma, U, v.unsqueeze(0), 0.3)[0], atol=1e-13, rtol=1e-12
    )


def test_naturalization_blends_and_removes_the_kernel_part():
    gamma, U = _metric(zeros=None)
    K = kernel_basis(gamma, U)
    u = K[:, 0] + U[:, 0]
    out = naturalize_degenerate(u, gamma, U, strength=1.0, damping=0.3)
    assert abs(float(out @ K[:, 0])) < 1e-12
    assert torch.equal(naturalize_degenerate(u, gamma, U, strength=0.0, damping=0.3), u)


def test_a_rank_deficient_u_block_is_seen_with_its_margin():
    gamma, U = _metric(zeros=None)
    U[:, 3] = U[:, 0] + U[:, 1]  # rank(U) = 3
    split = kernel_split(gamma, U)
    assert split.rank == 3 and split.kernel_dim == 9
    assert split.margin > 1e-3


def test_numerical_rank_states_its_tolerance():
    sigma = torch.tensor([1.0, 1e-3, 1e-5, 1e-9], dtype=torch.float64)
    ranks = numerical_rank(sigma)
    assert {k: int(v) for k, v in ranks.items()} == {"rank_rtol_1e-02": 1, "rank_rtol_1e-04": 2, "rank_rtol_1e-06": 3}


def test_negative_floor_is_refused():
    gamma, U = _metric(zeros=0)
    gamma[0] = -1.0
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        kernel_split(gamma, U)
