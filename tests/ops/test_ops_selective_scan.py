"""drmlab.ops.selective_scan: both backends (fused C kernel, chunked torch) against the plain loop
in float64, the kernel's float32 exp, segment boundaries, threads, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drmlab.ops.backends import BackendUnavailable
from drmlab.ops.selective_scan import BACKENDS, selective_scan, selective_scan_backend, selective_scan_reference
from drmlab.ops.selective_scan import c as selective_c

needs_c = pytest.mark.usefixtures("c_kernel")  # tests/conftest.py


def _inputs(b=2, t=23, e=5, n=3, dtype=torch.float64, seed=0, h0=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, e, dtype=dtype, generator=gen).requires_grad_()
    dt = torch.rand(b, t, e, dtype=dtype, generator=gen).requires_grad_()
    A = (-2 * torch.rand(e, n, dtype=dtype, generator=gen)).requires_grad_()
    Bm = torch.randn(b, t, n, dtype=dtype, generator=gen).requires_grad_()
    Cm = torch.randn(b, t, n, dtype=dtype, generator=gen).requires_grad_()
    h = torch.randn(b, e, n, dtype=dtype, generator=gen).requires_grad_() if h0 else None
    return x, dt, A, Bm, Cm, h


def _check(inputs, tol_y, tol_g, **kw):
    y, h = selective_scan(*inputs, **kw)
    y_ref, h_ref = selective_scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=tol_y)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=tol_y)
    wrt = [t for t in inputs if t is not None]
    gen = torch.Generator().manual_seed(1)
    gy = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    gh = torch.randn(h.shape, dtype=h.dtype, generator=gen)
    grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), wrt)
    grads_ref = torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), wrt)
    for got, ref in zip(grads, grads_ref):
        torch.testing.assert_close(got, ref, rtol=tol_g, atol=tol_g)


@pytest.mark.parametrize("chunk, recompute", [(1, False), (4, False), (0, False), (64, False), (3, True)])
def test_torch_path_is_exact(chunk, recompute):
    _check(_inputs(), 1e-12, 1e-10, chunk=chunk, recompute=recompute, backend="torch")


@needs_c
@pytest.mark.parametrize("h0", [True, False])
@pytest.mark.parametrize("segment_elements", [selective_c.SEGMENT_ELEMENTS, 1])
def test_c_kernel_is_exact_in_float64(monkeypatch, h0, segment_elements):
    # segment_elements=1 forces the shortest segments (8 steps): the backward then crosses
    # several recomputed segments, one of them partial (23 = 8 + 8 + 7)
    monkeypatch.setattr(selective_c, "SEGMENT_ELEMENTS", segment_elements)
    _check(_inputs(h0=h0), 1e-12, 1e-10, backend="c")


@needs_c
def test_c_kernel_float32_agrees_with_the_float64_loop():
    inputs64 = _inputs(b=3, t=70, e=37, n=16)
    inputs32 = tuple(None if t is None else t.detach().float().requires_grad_() for t in inputs64)
    y, h = selective_scan(*inputs32, backend="c")
    y_ref, h_ref = selective_scan_reference(*inputs64)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(y.sum() + h.sum(), inputs32)
    grads_ref = torch.autograd.grad(y_ref.sum() + h_ref.sum(), inputs64)
    for got, ref in zip(grads, grads_ref):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)


@needs_c
def test_c_kernel_threads_give_identical_results():
    """Sequences split across threads (each with its own dA accumulator) give the same bits in
    y and every gradient but dA, whose per-thread partial sums are added in another order."""
    inputs = _inputs(b=5, t=31, e=9, n=4, dtype=torch.float32)
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            y, h = selective_scan(*inputs, backend="c")
            grads = torch.autograd.grad(y.square().sum() + h.sum(), inputs)
            results.append((y, h, grads))
    finally:
        torch.set_num_threads(old)
    (y1, h1, g1), (y3, h3, g3) = results
    assert torch.equal(y1, y3) and torch.equal(h1, h3)
    for i, (a, b) in enumerate(zip(g1, g3)):
        if i == 2:  # dA
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


@needs_c
def test_c_kernel_exp_is_accurate_and_exact_at_the_ends():
    lib = selective_c.KERNEL.library()
    x = torch.cat([torch.linspace(-90, 90, 200_001), torch.tensor([0.0, -87.31, -100.0, -1e30, 88.71, 1e30])])
    out = torch.empty_like(x)
    lib.drm_expf_array(x.data_ptr(), out.data_ptr(), x.numel())
    exact = torch.exp(x.double())
    normal = (x > -87.0) & (x < 88.0)
    rel = ((out.double() - exact) / exact)[normal].abs().max().item()
    assert rel < 3 * 2.0**-24  # within a few float32 ulp
    assert out[x == 0.0].item() == 1.0  # dt = 0: the state is carried exactly
    assert (out[x < -87.3] == 0).all()  # a closed gate cuts the past exactly
    assert torch.isinf(out[x > 88.7]).all()
    # monotone across the whole range (no seams between reduction intervals)
    grid = x[:200_001]
    inner = out[:200_001][(grid > -87.3) & (grid < 88.7)].numpy()
    assert np.all(np.diff(inner) >= 0)


@needs_c
def test_c_kernel_memory_does_not_hold_the_states():
    """The saved tensors are the inputs plus one state per segment, never [B, T, E, N]."""
    b, t, e, n = 2, 512, 16, 8
    x, dt, A, Bm, Cm, _ = _inputs(b, t, e, n, dtype=torch.float32, h0=False)
    y, _ = selective_scan(x, dt, A, Bm, Cm, backend="c")
    saved = sum(s.numel() for s in y.grad_fn.saved_tensors)
    inputs = sum(v.numel() for v in (x, dt, A, Bm, Cm))
    assert saved - inputs < b * t * e * n / 4


def test_zero_length_and_autocast():
    x, dt, A, Bm, Cm, h0 = _inputs(t=0, dtype=torch.float32)
    y, h = selective_scan(x, dt, A, Bm, Cm, h0)
    assert y.shape == (2, 0, 5) and torch.equal(h, h0)
    x, dt, A, Bm, Cm, _ = _inputs(t=6, dtype=torch.float32, h0=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = selective_scan(x, dt, A, Bm, Cm)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, selective_scan_reference(x, dt, A, Bm, Cm)[0], rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused():
    x, dt, A, Bm, Cm, h0 = _inputs()
    with pytest.raises(ValueError, match="x and dt"):
        selective_scan(x, dt[:, :-1], A, Bm, Cm)
    with pytest.raises(ValueError, match="A must be"):
        selective_scan(x, dt, A.t(), Bm, Cm)
    with pytest.raises(ValueError, match="Cm must be"):
        selective_scan(x, dt, A, Bm, Cm[:, :, :-1])
    with pytest.raises(ValueError, match="h0 must be"):
        selective_scan(x, dt, A, Bm, Cm, h0.transpose(1, 2))
    with pytest.raises(ValueError, match="backend"):
        selective_scan(x, dt, A, Bm, Cm, backend="cuda")
    assert math.isfinite(selective_scan(x, dt, A, Bm, Cm)[0].sum().item())


def test_every_backend_is_tested():
    # the tests above exercise "c" and "torch"; a backend added to the table must join them
    # ("triton" is tested under Triton's interpreter in tests/ops/test_ops_triton.py)
    assert set(BACKENDS.names) == {"c", "torch", "triton"}


@needs_c
def test_auto_takes_the_kernel_on_cpu_and_names_what_runs_elsewhere():
    x = torch.zeros(1, 2, 3)
    assert selective_scan_backend(x) == "c"
    assert selective_scan_backend(x.to(torch.bfloat16)) == "c"  # computed in float32
    assert selective_scan_backend(x.to("meta")) == "torch"
    meta = _inputs(dtype=torch.float32)
    meta = tuple(t.detach().to("meta") for t in meta)
    with pytest.raises(BackendUnavailable, match="'c' is not available on meta.*CPU.*available here: 'torch'"):
        selective_scan(*meta, backend="c")
