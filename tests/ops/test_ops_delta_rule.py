"""The gated delta rule operator (``drmlab.ops.delta_rule``, ``docs/drm.md`` section V.2): the chunked
WY form equals the float64 sequential reference forward and backward (gradcheck on tiny shapes,
zero retention, zero writes, hard 0/1 writes), zero gates stay exact, and bad input is refused."""

from __future__ import annotations

import pytest
import torch

from drmlab.ops.delta_rule import delta_rule, delta_rule_reference
from drmlab.ops.delta_rule.chunked import gap_products

F64 = torch.float64


def inputs(batch=2, length=7, d_k=3, d_v=2, seed=0, dtype=F64, decay=None, write=None, with_init=True):
    """(q, k, v, decay, write, init): unit keys, gates in (0, 1) unless given."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, d_k, generator=g, dtype=F64)
    k = torch.nn.functional.normalize(torch.randn(batch, length, d_k, generator=g, dtype=F64), dim=-1)
    v = torch.randn(batch, length, d_v, generator=g, dtype=F64)
    f = torch.rand(batch, length, generator=g, dtype=F64) if decay is None else decay
    w = torch.rand(batch, length, generator=g, dtype=F64) if write is None else write
    init = torch.randn(batch, d_k, d_v, generator=g, dtype=F64) if with_init else None
    return tuple(None if t is None else t.to(dtype) for t in (q, k, v, f, w, init))


def edge_gates(batch, length, seed=1):
    """Retention with exact zeros and ones, hard 0/1 writes."""
    g = torch.Generator().manual_seed(seed)
    decay = torch.rand(batch, length, generator=g, dtype=F64)
    decay[:, 1] = 0.0
    decay[:, -2] = 1.0
    write = (torch.rand(batch, length, generator=g, dtype=F64) > 0.5).to(F64)
    write[:, 0], write[:, 2] = 0.0, 1.0
    return decay, write


@pytest.mark.parametrize("length, chunk", [(1, 64), (7, 3), (20, 8), (20, 64), (33, 1)])
@pytest.mark.parametrize("with_init", [True, False])
def test_forward_equals_the_reference(length, chunk, with_init):
    args = inputs(length=length, d_k=4, d_v=3, with_init=with_init)
    out, state = delta_rule(*args, chunk=chunk)
    ref_out, ref_state = delta_rule_reference(*args)
    assert out.dtype == F64 and out.shape == ref_out.shape and state.shape == ref_state.shape
    assert (out - ref_out).abs().max() <= 1e-12
    assert (state - ref_state).abs().max() <= 1e-12


@pytest.mark.parametrize("case", ["soft", "edges", "no_decay"])
def test_gradcheck_on_tiny_shapes(case):
    """Every input, two chunks and a partial one; 'edges': f = 0 and 1, hard 0/1 writes;
    'no_decay': decay=None (retention 1)."""
    decay, write = edge_gates(2, 5) if case == "edges" else (None, None)
    args = [t.requires_grad_() for t in inputs(length=5, decay=decay, write=write)]
    if case == "no_decay":
        q, k, v, _, w, init = args
        assert torch.autograd.gradcheck(
            lambda q, k, v, w, init: delta_rule(q, k, v, None, w, init, chunk=2), [q, k, v, w, init]
        )
        for got, want in zip(
            delta_rule(q, k, v, None, w, init, chunk=2), delta_rule_reference(q, k, v, torch.ones_like(w), w, init)
        ):
            assert (got - want).abs().max() <= 1e-12
        return
    assert torch.autograd.gradcheck(lambda *a: delta_rule(*a, chunk=2), args)


@pytest.mark.parametrize("case", ["soft", "edges", "zero_retention", "no_writes", "no_decay"])
def test_gradients_equal_the_reference(case):
    length = 23
    decay, write = {
        "soft": (None, None),
        "edges": edge_gates(3, length),
        "zero_retention": (torch.zeros(3, length, dtype=F64), None),
        "no_writes": (None, torch.zeros(3, length, dtype=F64)),
        "no_decay": (None, None),  # decay=None: retention 1 everywhere (the slow matrix)
    }[case]
    args = list(inputs(batch=3, length=length, d_k=5, d_v=4, decay=decay, write=write))
    if case == "no_decay":
        args[3] = None
    g = torch.Generator().manual_seed(9)
    d_out, d_state = torch.randn(3, length, 4, generator=g, dtype=F64), torch.randn(3, 5, 4, generator=g, dtype=F64)
    grads = []
    for fn in (lambda *a: delta_rule(*a, chunk=8), delta_rule_reference):
        leaves = [None if t is None else t.clone().requires_grad_() for t in args]
        out, state = fn(*leaves)
        grads.append(
            torch.autograd.grad((out * d_out).sum() + (state * d_state).sum(), [t for t in leaves if t is not None])
        )
    names = [n for n, t in zip(("q", "k", "v", "decay", "write", "init"), args) if t is not None]
    for name, got, want in zip(names, *grads):
        assert torch.isfinite(got).all(), name
        assert (got - want).abs().max() <= 1e-10 * max(1.0, want.abs().max().item()), name


def test_zero_gates_are_exact():
    """Zero retention with no write (A_t = f_t I - g_t k_t k_t^T = 0) cuts the past exactly: no
    gradient crosses it, in the same chunk or the next; zero writes leave the state exactly at the
    decayed init. (Zero retention alone keeps the k_t-component: -g_t k_t k_t^T S_{t-1}.)"""
    g = torch.Generator().manual_seed(3)
    decay, write = torch.rand(2, 12, dtype=F64, generator=g), torch.rand(2, 12, dtype=F64, generator=g)
    decay[:, 5], write[:, 5] = 0.0, 0.0
    args = [t.requires_grad_() for t in inputs(length=12, decay=decay, write=write)]
    out, state = delta_rule(*args, chunk=4)
    grads = torch.autograd.grad(out[:, 6:].sum() + state.sum(), args)
    q, k, v, f, g, init = grads
    assert (init == 0).all()
    assert (k[:, :5] == 0).all() and (v[:, :5] == 0).all() and (g[:, :5] == 0).all() and (f[:, :5] == 0).all()
    # no writes at all: the state is the init times the product of the retentions, reads likewise
    q, k, v, f, _, init = inputs(length=9)
    f[:, 4] = 0.0
    out, state = delta_rule(q, k, v, f, torch.zeros_like(f), init, chunk=4)
    assert (state == 0).all() and (out[:, 5:] == 0).all()
    assert torch.equal(out[:, 0], torch.einsum("bkv,bk->bv", init, q[:, 0]))


def test_gap_products_exact_products_and_zeros():
    gates = torch.rand(2, 9, dtype=F64, generator=torch.Generator().manual_seed(4))
    gates[0, 3] = 0.0
    table = gap_products(gates)
    for p in range(9):
        for r in range(9):
            want = torch.prod(gates[:, r + 1 : p], dim=-1) if r < p else torch.zeros(2, dtype=F64)
            assert torch.allclose(table[:, p, r], want, rtol=1e-15, atol=0), (p, r)
    assert (table[0, 4:, :3] == 0).all() and (table[0, 4, 3] == 1)


def test_float32_and_tiny_gates_over_long_sequences():
    """float32 tracks the float64 reference; gates of 1e-30 underflow to the exact limit (no nan)."""
    args = inputs(length=150, d_k=8, d_v=8, seed=5)
    ref_out, _ = delta_rule_reference(*args)
    out, _ = delta_rule(*(t.float() for t in args))
    assert out.dtype == torch.float32
    assert (out.double() - ref_out).abs().max() <= 1e-4 * ref_out.abs().max()
    q, k, v, _, w, init = (t.float() for t in args)
    out, _ = delta_rule(q, k, v, torch.full_like(w, 1e-30), w, init)
    ref_out, _ = delta_rule_reference(
        q.double(), k.double(), v.double(), torch.full_like(w, 1e-30).double(), w.double(), init.double()
    )
    assert torch.isfinite(out).all() and (out.double() - ref_out).abs().max() <= 1e-5


def test_reduced_precision_and_autocast_compute_in_float32():
    args = inputs(length=10, dtype=torch.float32)
    want, _ = delta_rule(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, state = delta_rule(*args)
    assert got.dtype == state.dtype == torch.float32 and torch.equal(got, want)
    got, _ = delta_rule(*(t.bfloat16() for t in args))
    assert got.dtype == torch.float32


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: {**a, "q": a["q"][:, :, :2]}, "q and k"),
        (lambda a: {**a, "v": a["v"][:, :3]}, "v must be"),
        (lambda a: {**a, "decay": a["decay"][:, :, None]}, "decay must be"),
        (lambda a: {**a, "write": a["write"][:1]}, "write must be"),
        (lambda a: {**a, "init": a["init"][:, :2]}, "init must be"),
        (lambda a: {**a, "chunk": 0}, "chunk must be"),
    ],
)
def test_bad_input_is_refused(change, match):
    args = dict(zip(("q", "k", "v", "decay", "write", "init"), inputs()))
    with pytest.raises(ValueError, match=match):
        delta_rule(**change(args))
