"""The fused state bound (``drmlab.ops.state_bound``, ``docs/drm.md`` sections 6 and A.3.8) against its
plain reference: forward and gradient within 1e-5 relative in float32 and 1e-12 in float64, inside, on and
beyond the radius, at the norm floor, with the residual sum taken inside, and through double backward."""

import pytest
import torch

from drmlab.ops.fusion import plain_reference
from drmlab.ops.state_bound import c, fused_bound_applies, state_bound, state_bound_reference

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _rows(dtype, radius: float, d: int = 37) -> torch.Tensor:
    """Rows at norms well inside, just inside, just beyond and far beyond the radius, and zero. (Exactly on
    the radius the gradient jumps -- the clip's derivative switches on -- and which side a row's round-off
    puts it is not a property of either path.)"""
    gen = torch.Generator().manual_seed(1)
    y = torch.randn(6, 3, d, dtype=dtype, generator=gen)
    y = y / y.norm(dim=-1, keepdim=True)
    norms = torch.tensor([0.01, 0.999, 1.001, 3.0, 40.0, 0.0], dtype=dtype) * radius
    return y * norms.view(6, 1, 1)


def test_the_kernel_is_built_here():
    """The C kernel builds on this machine (``.ci/run`` requires the kernels), so the tests below compare it."""
    assert c.unavailable(torch.device("cpu"), torch.float32) is None
    assert fused_bound_applies(torch.zeros(2, 3))
    with plain_reference():
        assert not fused_bound_applies(torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [0.5, 8.0])
@pytest.mark.parametrize("with_sum", [False, True])
def test_forward_and_gradient_match_the_reference(dtype, radius, with_sum):
    y = _rows(dtype, radius)
    x = torch.randn(y.shape, dtype=dtype, generator=torch.Generator().manual_seed(2)) * 1e-3 if with_sum else None
    z = (y - x if with_sum else y).requires_grad_(True)
    xs = x.requires_grad_(True) if with_sum else None
    g = torch.randn(y.shape, dtype=dtype, generator=torch.Generator().manual_seed(3))
    inputs = (z, xs) if with_sum else (z,)
    fused = state_bound(z, radius, xs)
    fused_grads = torch.autograd.grad(fused, inputs, g)
    plain = state_bound_reference(z + xs if with_sum else z, radius)
    plain_grads = torch.autograd.grad(plain, inputs, g)
    assert _rel(fused, plain) < TOL[dtype]
    for a, b in zip(fused_grads, plain_grads):
        assert _rel(a, b) < TOL[dtype]
    if with_sum:  # d/dz and d/dx of B(z + x) are one gradient
        assert torch.equal(fused_grads[0], fused_grads[1])


def test_the_sum_inside_is_the_sum_outside_bit_for_bit():
    """B(z, x) adds as torch adds: the fast decode step (bound of a sum) equals the reference step (the sum inside)."""
    gen = torch.Generator().manual_seed(4)
    z, x = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    assert torch.equal(state_bound(z, 2.0, x), state_bound(z + x, 2.0))


def test_double_backward_goes_through_the_reference():
    y = _rows(torch.float64, 1.0)[:-1].requires_grad_(True)  # not the zero row: |y|'s second derivative is NaN there
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (first,) = torch.autograd.grad(state_bound(y, 1.0), y, g, create_graph=True)
    (second,) = torch.autograd.grad(first.pow(2).sum(), y)
    (first_ref,) = torch.autograd.grad(state_bound_reference(y, 1.0), y, g, create_graph=True)
    (second_ref,) = torch.autograd.grad(first_ref.pow(2).sum(), y)
    assert _rel(second, second_ref) < 1e-12


def test_a_planted_error_is_seen():
    """The comparison above can fail: a bound with a radius off by 1e-4 is outside the float32 tolerance."""
    y = _rows(torch.float32, 1.0)
    assert _rel(state_bound(y, 1.0001), state_bound_reference(y, 1.0)) > TOL[torch.float32]


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_over_threads_give_the_same_bits(threads):
    y = torch.randn(300, 128, generator=torch.Generator().manual_seed(6))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = state_bound(y, 3.0)
        torch.set_num_threads(threads)
        assert torch.equal(state_bound(y, 3.0), one)
    finally:
        torch.set_num_threads(before)
