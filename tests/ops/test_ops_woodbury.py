"""Woodbury solve and metric helpers (drmlab.ops.woodbury)."""

import pytest
import torch
import torch.nn.functional as F

from drmlab.ops import coupling_matrix, metric_dense, metric_energy, woodbury_solve


def make(batch=(3,), n=7, r=3, L=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    d = F.softplus(torch.randn(*batch, n, generator=g, dtype=dtype)) + 1e-3
    U = torch.randn(*batch, n, r, generator=g, dtype=dtype)
    v = torch.randn(*batch, L, n, generator=g, dtype=dtype)
    return d, U, v


@pytest.mark.parametrize("r", [0, 1, 3, 9])
@pytest.mark.parametrize("damping", [0.0, 0.1])
def test_solve_equals_dense_inverse(r, damping):
    d, U, v = make(batch=(2, 3), r=r)
    x = woodbury_solve(d, U, v, damping=damping)
    G = metric_dense(d, U) + damping * torch.eye(d.shape[-1], dtype=d.dtype)
    ref = torch.linalg.solve(G, v.mT).mT
    assert x.shape == v.shape
    assert (x - ref).abs().max().item() <= 1e-10
    # and G x = v
    assert (x @ G.mT - v).abs().max().item() <= 1e-10


def test_solve_broadcasts_leading_dims():
    d, U, _ = make(batch=(3,), r=2)
    v = torch.randn(5, 3, 4, 7, dtype=torch.float64)  # extra leading dim on v only
    x = woodbury_solve(d, U, v)
    ref = torch.linalg.solve(metric_dense(d, U), v.mT).mT
    assert x.shape == (5, 3, 4, 7)
    assert (x - ref).abs().max().item() <= 1e-10
    # unbatched
    x1 = woodbury_solve(d[0], U[0], v[0, 0])
    assert (x1 - ref[0, 0]).abs().max().item() <= 1e-10


def test_tensor_damping():
    d, U, v = make(batch=(3,), r=2)
    lam = torch.tensor([[0.0], [0.5], [2.0]], dtype=torch.float64)
    x = woodbury_solve(d, U, v, damping=lam)
    for i in range(3):
        G = metric_dense(d[i], U[i]) + lam[i, 0] * torch.eye(7, dtype=torch.float64)
        assert (x[i] - torch.linalg.solve(G, v[i].mT).mT).abs().max().item() <= 1e-10


@pytest.mark.parametrize("r", [0, 2, 12])
def test_metric_is_symmetric_positive_definite(r):
    d, U, _ = make(batch=(4,), n=6, r=r)
    G = metric_dense(d, U)
    assert torch.equal(G, G.mT)
    eig = torch.linalg.eigvalsh(G)
    assert (eig > 0).all()
    assert (eig >= d.min(-1).values.unsqueeze(-1) - 1e-12).all()  # D is a floor


@pytest.mark.parametrize("r", [0, 3])
def test_energy_equals_quadratic_form(r):
    d, U, v = make(batch=(2, 3), r=r)
    e = metric_energy(d, U, v)
    G = metric_dense(d, U)
    ref = torch.einsum("...li,...ij,...lj->...l", v, G, v)
    assert e.shape == v.shape[:-1]
    assert (e - ref).abs().max().item() <= 1e-10
    assert (e > 0).all()


@pytest.mark.parametrize("r", [0, 3])
def test_coupling_matrix(r):
    d, U, _ = make(batch=(2,), n=6, r=r)
    V = torch.randn(2, 4, 6, dtype=torch.float64)
    C = coupling_matrix(V, d, U)
    ref = V @ metric_dense(d, U) @ V.mT
    assert C.shape == (2, 4, 4)
    assert torch.equal(C, C.mT)
    assert (C - ref).abs().max().item() <= 1e-10
    # diagonal entries are the energies of the directions
    assert (torch.diagonal(C, dim1=-2, dim2=-1) - metric_energy(d, U, V)).abs().max() <= 1e-10


def test_gradients_finite_and_correct():
    d, U, v = make(batch=(2,), n=5, r=2, L=3)
    args = (d.requires_grad_(), U.requires_grad_(), v.requires_grad_())
    assert torch.autograd.gradcheck(lambda d, U, v: woodbury_solve(d, U, v, 0.1), args)
    assert torch.autograd.gradcheck(metric_energy, args)
    V = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(coupling_matrix, (V, d, U))
    # float32, realistic sizes: finite gradients
    d32, U32, v32 = (x.detach().float().requires_grad_() for x in make(batch=(8, 16), n=64, r=16))
    out = woodbury_solve(d32, U32, v32, damping=1e-3)
    (out.square().sum() + metric_energy(d32, U32, v32).sum()).backward()
    for x in (d32, U32, v32):
        assert torch.isfinite(x.grad).all()


def test_float32_accuracy():
    d, U, v = make(batch=(4,), n=32, r=8)
    x32 = woodbury_solve(d.float(), U.float(), v.float(), 1e-2)
    x64 = woodbury_solve(d, U, v, 1e-2)
    assert torch.allclose(x32.double(), x64, rtol=1e-3, atol=1e-4)
