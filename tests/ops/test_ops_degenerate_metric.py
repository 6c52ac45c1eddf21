"""The degenerate metric G = diag(d) + U U^T, d >= 0 (``drmlab.ops.woodbury.degenerate``,
``docs/geometry.md`` section 8), in float64: the kernel projector against G itself (annihilated to
1e-12) and against the per-metric SVD split of ``drmlab.geometry.metric``, the damped pseudo-inverse
against a dense SVD, the exact rank against ``torch.linalg.matrix_rank``, the positive-floor case equal
to the Woodbury solve bit for bit, gradients by finite differences, and the rank-deficient fallback."""

from __future__ import annotations

import pytest
import torch

from drmlab.geometry.metric import kernel_basis, kernel_split
from drmlab.ops import exact_rank, kernel_project, metric_dense, pseudo_inverse_solve, woodbury_solve

N, R = 12, 4
ZEROS = (0, 2, 4, 7, 12)  # |Z| = 0, below r, = r, above r (a kernel of 3), everything (G = U U^T, kernel 8)


def _batch(zero_counts=ZEROS, n=N, r=R, seed=0):
    """gamma [B, n] >= 0 with exactly the given numbers of zeros (at random places), U [B, n, r]."""
    g = torch.Generator().manual_seed(seed)
    gammas = []
    for count in zero_counts:
        gamma = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
        gamma[torch.randperm(n, generator=g)[:count]] = 0.0
        gammas.append(gamma)
    u = torch.randn(len(zero_counts), n, r, generator=g, dtype=torch.float64) / r**0.5
    return torch.stack(gammas), u


def _dense_pinv(gamma, u, damping):
    """sum over the nonzero singular triples of G (a dense SVD) of q q^T / (sigma + lambda)."""
    g = metric_dense(gamma, u)
    left, sigma, _ = torch.linalg.svd(g)
    keep = (sigma > 1e-12 * sigma[..., :1]).to(g.dtype)
    return (left * (keep / (sigma + damping)).unsqueeze(-2)) @ left.mT


def _projector(gamma, u):
    """P_ker as a matrix [B, n, n]: the projection of the identity's columns."""
    eye = torch.eye(gamma.shape[-1], dtype=gamma.dtype).expand(gamma.shape[0], -1, -1)
    return kernel_project(gamma, u, eye).mT


def test_kernel_is_annihilated_and_has_the_exact_dimension():
    gamma, u = _batch()
    p = _projector(gamma, u)
    g = metric_dense(gamma, u)
    for count, gi, pi in zip(ZEROS, g, p):
        dim = max(count - R, 0)
        assert abs(float(torch.trace(pi)) - dim) < 1e-12
        if dim:
            assert float((gi @ pi).norm() / gi.norm()) < 1e-12
        else:
            assert float(pi.abs().max()) == 0.0
    assert float((p - p.mT).abs().max()) < 1e-14
    assert float((p @ p - p).abs().max()) < 1e-12


def test_kernel_projector_equals_the_svd_split_of_each_metric():
    gamma, u = _batch()
    p = _projector(gamma, u)
    for gi, ui, pi in zip(gamma, u, p):
        basis = kernel_basis(gi, ui)
        assert float((pi - basis @ basis.mT).abs().max()) < 1e-12


def test_exact_rank_against_the_dense_matrix():
    gamma, u = _batch()
    ranks = exact_rank(gamma, u)
    assert ranks.tolist() == [N - c + min(c, R) for c in ZEROS]
    assert ranks.tolist() == torch.linalg.matrix_rank(metric_dense(gamma, u), hermitian=True).tolist()
    assert ranks.tolist() == [kernel_split(gi, ui).rank for gi, ui in zip(gamma, u)]


@pytest.mark.parametrize("damping", [1e-3, 0.3, 2.0])
def test_pseudo_inverse_against_a_dense_svd(damping):
    gamma, u = _batch()
    v = torch.randn(len(ZEROS), 5, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = pseudo_inverse_solve(gamma, u, v, damping)
    want = v @ _dense_pinv(gamma, u, damping)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-10
    # and it maps every kernel vector to zero, so its output lies in the range
    assert float(kernel_project(gamma, u, got).abs().max()) < 1e-12


def test_positive_floor_is_the_woodbury_solve_bit_for_bit():
    gamma, u = _batch(zero_counts=(0, 0, 0))
    v = torch.randn(3, 5, N, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.equal(pseudo_inverse_solve(gamma, u, v, 0.3), woodbury_solve(gamma, u, v, damping=0.3))
    assert torch.equal(kernel_project(gamma, u, v), torch.zeros_like(v))


def test_broadcast_over_positions_and_no_low_rank_part():
    gamma, u = _batch(zero_counts=(3, 12), r=0)
    v = torch.randn(2, 4, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = pseudo_inverse_solve(gamma, u, v, 0.5)
    want = v @ _dense_pinv(gamma, u, 0.5)
    assert float((got - want).abs().max()) < 1e-14
    assert exact_rank(gamma, u).tolist() == [N - 3, 0]


def test_gradients_by_finite_differences():
    """Differentiable in the floor's nonzero entries, U and v, with the zero set held."""
    gamma, u = _batch(zero_counts=(4, 7), n=7, r=2, seed=4)
    zero = gamma == 0
    v = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def f(positive, u_, v_):
        return pseudo_inverse_solve(torch.where(zero, 0.0, positive), u_, v_, 0.3)

    inputs = (gamma.clamp_min(0.05).requires_grad_(), u.requires_grad_(), v.requires_grad_())
    assert torch.autograd.gradcheck(f, inputs)


def test_rank_deficient_block_falls_back_to_the_exact_projector():
    """A U_Z below its generic rank (a column vanishing on Z): A^T A does not factor, the batch takes the
    pseudo-inverse, and the projector is still the exact one (the kernel is one dimension larger)."""
    gamma, u = _batch(zero_counts=(7, 7), seed=6)
    zero = gamma[0] == 0
    u[0, zero, -1] = 0.0
    p = _projector(gamma, u)
    assert abs(float(torch.trace(p[0])) - (7 - (R - 1))) < 1e-12
    assert abs(float(torch.trace(p[1])) - (7 - R)) < 1e-12
    for gi, ui, pi in zip(gamma, u, p):
        basis = kernel_basis(gi, ui)
        assert float((pi - basis @ basis.mT).abs().max()) < 1e-12
    v = torch.randn(2, 3, N, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    want = v @ _dense_pinv(gamma, u, 0.3)
    assert float((pseudo_inverse_solve(gamma, u, v, 0.3) - want).abs().max() / want.abs().max()) < 1e-10


@pytest.mark.parametrize("damping", [0.0, -0.1])
def test_damping_must_be_positive(damping):
    gamma, u = _batch(zero_counts=(7,))
    with pytest.raises(ValueError, match="damping > 0"):
        pseudo_inverse_solve(gamma, u, torch.zeros(1, 1, N, dtype=torch.float64), damping)
