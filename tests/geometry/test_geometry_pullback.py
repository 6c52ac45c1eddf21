"""Decoder pullback metric (docs/geometry.md section 3), float64, against closed forms."""

from __future__ import annotations

import math

import torch

from drmlab.geometry.pullback import (
    fisher_matrix,
    metric_agreement,
    principal_angles,
    pullback_auto,
    pullback_energy,
    pullback_estimate,
    pullback_metric,
)

D, V = 5, 11


def _map(seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, 7, generator=g, dtype=torch.float64)
    A = torch.randn(7, D, generator=g, dtype=torch.float64) / 2
    b = torch.randn(V, generator=g, dtype=torch.float64)

    def f(z):
        return torch.tanh(z @ A.mT) @ W.mT + b

    def closed_form(z):  # J = W diag(1 - tanh^2(A z)) A, G = J^T (diag p - p p^T) J
        h = torch.tanh(A @ z)
        J = W @ torch.diag(1 - h * h) @ A
        return J.mT @ fisher_matrix(W @ h + b) @ J

    return f, closed_form


def _states(n=4):
    return torch.randn(n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def test_the_exact_pullback_equals_the_closed_form():
    f, closed = _map()
    z = _states()
    G = pullback_metric(f, z)
    for i in range(len(z)):
        want = closed(z[i])
        assert (G[i] - want).abs().max() / want.abs().max() < 1e-12
    assert torch.equal(G, G.mT)


def test_the_energy_is_twice_the_second_order_kl():
    f, _ = _map()
    z = _states(1)
    v = torch.randn(1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    energy = pullback_energy(f, z, v)
    assert torch.allclose(energy, torch.einsum("ni,nij,nj->n", v, pullback_metric(f, z), v), rtol=1e-12)
    for eps in (1e-3, 1e-4):
        p, q = torch.softmax(f(z), -1), torch.softmax(f(z + eps * v), -1)
        kl = (p * (p.log() - q.log())).sum(-1)
        assert abs(float(2 * kl / eps**2 / energy) - 1) < 20 * eps  # O(eps) remainder


def test_the_pullback_rank_is_at_most_vocab_minus_one():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(3, D, generator=g, dtype=torch.float64)  # V = 3 < d: rank <= 2

    def f(z):
        return z @ W.mT

    sigma = torch.linalg.eigvalsh(pullback_metric(f, _states(2)))
    assert int((sigma > 1e-12 * sigma.max()).sum(-1).max()) == 2


def test_the_estimator_is_unbiased_within_its_stated_error():
    f, _ = _map()
    z = _states(2)
    exact = pullback_metric(f, z)
    est = pullback_estimate(f, z, samples=4000, generator=torch.Generator().manual_seed(0))
    z_scores = (est.matrix - exact) / est.stderr.clamp_min(1e-300)
    assert float(z_scores.abs().max()) < 5.0  # every entry within 5 stated standard errors
    assert float(z_scores.square().mean()) < 2.0  # and their spread is about one standard error
    small = pullback_estimate(f, z, samples=250, generator=torch.Generator().manual_seed(0))
    ratio = float(small.relative_error.mean() / est.relative_error.mean())
    assert 3.0 < ratio < 5.5  # sqrt(4000 / 250) = 4


def test_a_large_vocabulary_uses_the_estimator_and_says_so():
    f, _ = _map()
    _, note = pullback_auto(f, _states(1), vocab_size=V, max_exact_vocab=V - 1, samples=16)
    assert note.startswith("estimated: the vocabulary (11) is above 10") and "relative standard error" in note
    _, note = pullback_auto(f, _states(1), vocab_size=V)
    assert note.startswith("exact")


def test_principal_angles_of_a_rotated_plane():
    theta = 0.3
    a = torch.eye(4, dtype=torch.float64)[:, :2]
    b = a.clone()
    b[:, 1] = torch.tensor([0.0, math.cos(theta), math.sin(theta), 0.0], dtype=torch.float64)
    angles = principal_angles(a, b)
    assert torch.allclose(angles, torch.tensor([0.0, theta], dtype=torch.float64), atol=1e-7)


def test_agreement_of_a_metric_with_itself_and_with_a_foreign_one():
    f, _ = _map()
    z = _states(6)
    G = pullback_metric(f, z)
    v = torch.randn(6, D, dtype=torch.float64)
    same = metric_agreement(G, G, v, k=2)
    assert abs(same["energy_log_pearson"] - 1) < 1e-12 and same["principal_angle_largest_mean_rad"] < 1e-6
    inverse = metric_agreement(torch.linalg.pinv(G, hermitian=True) + 1e-3 * torch.eye(D), G, v, k=2)
    assert inverse["principal_angle_largest_mean_rad"] > 0.5
