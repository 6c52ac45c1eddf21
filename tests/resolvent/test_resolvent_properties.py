"""The Lean statements listed in ``docs/resolvent.md`` section 5, as property-based
tests of the float64 reference ``drmlab.resolvent`` over random sizes, gates (closed, unit and
interior magnitudes) and phases.

Exact statements are checked exactly where float64 evaluates them exactly (zeros, unit gates,
integer row sums, causality); identities that hold up to rounding are checked with a bound of a
few ulps per factor (``c * n * eps``), stated at each test.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from drmlab.resolvent import Switches, blend, chain_label, gate, operator, path_product

EPS = np.finfo(np.float64).eps
PROP = settings(deadline=None)  # how many examples, and their seed: the profile in tests/conftest.py

# magnitudes: closed, unit, or interior and bounded away from 0 so no product underflows
magnitudes = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.01, 1.0))
phases = st.one_of(st.just(0.0), st.just(math.pi), st.floats(-2 * math.pi, 2 * math.pi))


@st.composite
def heads(draw, min_n=1, max_n=10):
    """q, k [n, d], gate magnitudes m [n] (used as u at g = 1), phases [n]."""
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.5, 1.0, 3.0]))
    q = rng.normal(size=(n, d)) * scale
    k = rng.normal(size=(n, d)) * scale
    m = np.array(draw(st.lists(magnitudes, min_size=n, max_size=n)))
    th = np.array(draw(st.lists(phases, min_size=n, max_size=n)))
    return q, k, m, th


switch_values = st.tuples(
    st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    st.sampled_from([0.0, 1.0, -0.5, 2.0]),
    st.sampled_from([0.0, 0.5, 1.0]),
)


def logits(q, k):
    n, d = q.shape
    s = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            acc = 0.0
            for t in range(d):
                acc += float(q[i, t]) * float(k[j, t])
            s[i, j] = acc / math.sqrt(d)
    return s


# three_corners_containment (corner_softmax, corner_linear, corner_path_product)
@PROP
@given(heads())
def test_three_corners_containment(h):
    q, k, m, th = h
    n = len(m)
    s = logits(q, k)
    causal = np.tril(np.ones((n, n), dtype=bool))
    w = operator(q, k, m, th, Switches.SOFTMAX)
    e = np.where(causal, np.exp(s - np.where(causal, s, -np.inf).max(axis=1, keepdims=True)), 0)
    assert np.max(np.abs(w.real - e / e.sum(axis=1, keepdims=True))) <= 1e-14 * n
    assert np.all(w.imag == 0)
    w = operator(q, k, m, th, Switches.UNNORMALIZED_KERNEL)
    assert np.array_equal(w.real, np.where(causal, np.exp(np.where(causal, s, 0)), 0))
    assert np.all(w.imag == 0)
    w = operator(q, k, m, th, Switches.PATH_PRODUCT)
    assert np.array_equal(w, path_product(gate(m, th)))


# corners_are_distinct
@PROP
@given(heads(min_n=2))
def test_corners_are_distinct(h):
    q, k, m, th = h
    assert operator(q, k, m, th, Switches(1.0, 0.0, 0.0))[1, 0] == 0.5
    assert operator(q, k, m, th, Switches(0.0, 0.0, 0.0))[1, 0] == 1.0


# softmax_row_sum_one, beta_one_row_is_one
@PROP
@given(heads(), st.sampled_from([0.0, 1.0, -0.5, 2.0]), st.sampled_from([0.0, 0.5, 1.0]))
def test_beta_one_rows_sum_to_one(h, qk, g):
    q, k, m, th = h
    n = len(m)
    # Each weight is G exp(logit - log_z): the subtraction rounds at eps * (|logit| + |log_z|),
    # with |log_z| <= L + log n (the diagonal is live, its path product 1), L = max |logit|.
    L = abs(qk) * np.max(np.abs(q) @ np.abs(k).T)
    tol = 4 * n * EPS * (1 + 2 * L + np.log(n))
    w = operator(q, k, m, np.zeros(n), Switches(1.0, qk, g))  # real gates
    assert np.max(np.abs(w.sum(axis=1) - 1.0)) <= tol
    w = operator(q, k, m, th, Switches(1.0, qk, g))  # with phases, the moduli
    assert np.max(np.abs(np.abs(w).sum(axis=1) - 1.0)) <= tol


# gate_zero_beta_zero_is_linear_attention, gate_zero_beta_zero_row_not_one
@PROP
@given(heads())
def test_gate_zero_beta_zero_is_the_bare_kernel(h):
    q, k, m, th = h
    n = len(m)
    causal = np.tril(np.ones((n, n), dtype=bool))
    s = logits(q, k)
    w = operator(q, k, m, th, Switches(0.0, 1.0, 0.0))
    assert np.array_equal(w.real, np.where(causal, np.exp(np.where(causal, s, 0)), 0))
    w = operator(q, k, m, th, Switches(0.0, 0.0, 0.0))
    assert [sum(row.tolist()) for row in w.real] == [float(i + 1) for i in range(n)]


# pathProd_abs, pathProd_eq_zero_iff, prefix_logit_mask_restated
@PROP
@given(heads())
def test_path_product_modulus_and_zeros(h):
    _, _, m, th = h
    n = len(m)
    g = path_product(gate(m, th))
    for i in range(n):
        for j in range(i + 1):
            path = m[j + 1 : i + 1]
            r = float(np.prod(path[::-1])) if len(path) else 1.0
            assert abs(abs(g[i, j]) - r) <= 4 * n * EPS
            assert abs(g[i, j]) <= 1.0 + 4 * n * EPS
            assert (r == 1.0) == bool(np.all(path == 1.0))
            closed = bool(np.any(path == 0.0))
            assert (g[i, j].real == 0.0 and g[i, j].imag == 0.0) == closed
        assert np.all(g[i, i + 1 :] == 0)


# no_prefix_scan_represents_a_zero_gate: the zero survives every switch setting exactly
@PROP
@given(heads(min_n=2), switch_values)
def test_a_closed_gate_is_an_exact_zero_at_every_switch(h, sw):
    q, k, m, th = h
    beta, qk, g = sw
    w = operator(q, k, m, th, Switches(beta, qk, 1.0))  # g = 1: m is the magnitude
    n = len(m)
    for i in range(n):
        for j in range(i):
            if np.any(m[j + 1 : i + 1] == 0.0):
                assert w[i, j].real == 0.0 and w[i, j].imag == 0.0
            else:
                assert w[i, j] != 0
    # and with the blend on: a gate closed by the clamp (u <= 0) at any g > 0
    u = np.where(m == 0.0, -1.0 / max(g, 0.5), m)
    w = operator(q, k, u, th, Switches(beta, qk, max(g, 0.5)))
    for i in range(n):
        for j in range(i):
            if np.any(m[j + 1 : i + 1] == 0.0):
                assert w[i, j] == 0


# bedM_gate_exact, negative_draw_is_on_the_band
@PROP
@given(st.floats(-1e6, 1e6), st.floats(-10, 10), st.floats(-5.0, 5.0))
def test_the_gate_band(u, theta, g):
    m, tp = blend(u, theta, g)
    assert 0.0 <= m <= 1.0  # the clamp after the lerp: never negative, even for g > 1
    assert tp == g * theta
    a = gate(m, tp)
    assert abs(abs(a) - m) <= 2 * EPS
    assert blend(u, theta, 0.0) == (1.0, 0.0 * theta)
    assert blend(min(max(u, 0.0), 1.0), theta, 1.0)[0] == min(max(u, 0.0), 1.0)
    for (mm, t), target in (((1.0, math.pi), -1.0), ((0.0, 0.0), 0.0), ((1.0, 0.0), 1.0)):
        b = gate(mm, t)
        assert b.real == target and abs(b.imag) <= 1.3e-16


# constant_phase_gate_is_rope, cumulative_phase_is_separable
@PROP
@given(st.integers(1, 16), st.floats(-math.pi, math.pi), st.integers(0, 2**32 - 1))
def test_unit_gates_are_rope_and_phases_separate(n, omega, seed):
    g = path_product(gate(np.ones(n), np.full(n, omega)))
    ii, jj = np.tril_indices(n)
    expected = np.exp(1j * omega * (ii - jj))
    assert np.max(np.abs(g[ii, jj] - expected)) <= 8 * n * EPS
    assert np.max(np.abs(g[1:, 1:] - g[:-1, :-1]), initial=0.0) <= 16 * n * EPS  # Toeplitz
    th = np.random.default_rng(seed).uniform(-math.pi, math.pi, size=n)
    g = path_product(gate(np.ones(n), th))
    big = np.concatenate([[0.0], np.cumsum(th[1:])])
    assert np.max(np.abs(g[ii, jj] - np.exp(1j * (big[ii] - big[jj])))) <= 16 * n * EPS


# PhaseH.scalar_gate_commutes
@PROP
@given(heads(min_n=3, max_n=12), st.data())
def test_scalar_gates_commute_within_a_window(h, data):
    _, _, m, th = h
    n = len(m)
    p = data.draw(st.integers(1, n - 2))
    r = data.draw(st.integers(p + 1, n - 1))
    perm = data.draw(st.permutations(list(range(p, r + 1))))
    a = gate(m, th)
    b = a.copy()
    b[p : r + 1] = a[perm]
    g, gp = path_product(a), path_product(b)
    for i in range(n):
        for j in range(i + 1):
            if j + 1 <= p and i >= r:
                assert abs(gp[i, j] - g[i, j]) <= 8 * (i - j) * EPS
            elif i < p or j + 1 > r:
                assert gp[i, j].real == g[i, j].real and gp[i, j].imag == g[i, j].imag


# CEQ.V15.chain_path_product, CEQ.V15Fork.chain_eq_sum (real a with no hypothesis on a,
# and the complex gates)
@PROP
@given(st.integers(1, 12), st.integers(0, 2**32 - 1), st.booleans())
def test_the_chain_is_the_path_sum(n, seed, real):
    rng = np.random.default_rng(seed)
    if real:
        a = rng.uniform(-3.0, 3.0, size=n).astype(np.complex128)
        a[rng.random(n) < 0.2] = 0.0
    else:
        a = gate(rng.choice([0.0, 1.0, 0.5, 0.9], size=n), rng.uniform(-4, 4, size=n))
    b = rng.normal(size=n)
    y = chain_label(a, b)
    b0 = b.copy()
    b0[0] = 0.0
    g = path_product(a)
    total = g @ b0
    scale = np.abs(g) @ np.abs(b0) + 1.0
    assert np.all(np.abs(y - total) <= 1e-13 * scale)
    if real:
        assert np.all(y.imag == 0.0)


# CEQ.Nilpotent.occupancy_is_exact_inverse
@PROP
@given(st.integers(1, 8), st.integers(0, 2**32 - 1), st.booleans())
def test_occupancy_is_the_exact_inverse(n, seed, shift_only):
    rng = np.random.default_rng(seed)
    if shift_only:
        a = gate(rng.choice([0.0, 1.0, 0.7], size=n), rng.uniform(-3, 3, size=n))
        A = np.zeros((n, n), dtype=np.complex128)
        A[np.arange(1, n), np.arange(n - 1)] = a[1:]
    else:
        A = np.tril(rng.uniform(-1, 1, size=(n, n)), -1).astype(np.complex128)
    power = np.eye(n, dtype=np.complex128)
    occ = np.zeros((n, n), dtype=np.complex128)
    for _ in range(n):
        occ += power
        power = power @ A
    assert np.all(power == 0)  # nilpotent: A^n is exactly zero
    eye = np.eye(n)
    tol = 1e-13 * max(1.0, float(np.abs(occ).max())) * n
    assert np.max(np.abs(occ @ (eye - A) - eye)) <= tol
    assert np.max(np.abs((eye - A) @ occ - eye)) <= tol
    if shift_only:
        assert np.max(np.abs(occ - path_product(a))) <= 8 * n * EPS


# float64-only: causality, bitwise
@PROP
@given(heads(min_n=2), switch_values, st.data())
def test_the_future_never_moves_the_past(h, sw, data):
    q, k, m, th = h
    n = len(m)
    t = data.draw(st.integers(0, n - 2))
    w = operator(q, k, m, th, Switches(*sw))
    q2, k2, m2, th2 = q.copy(), k.copy(), m.copy(), th.copy()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    q2[t + 1 :] = rng.normal(size=q2[t + 1 :].shape)
    k2[t + 1 :] = rng.normal(size=k2[t + 1 :].shape)
    m2[t + 1 :] = rng.uniform(size=n - t - 1)
    th2[t + 1 :] = rng.uniform(-3, 3, size=n - t - 1)
    w2 = operator(q2, k2, m2, th2, Switches(*sw))
    as_bits = lambda x: np.ascontiguousarray(x).view(np.uint64)  # noqa: E731
    assert np.array_equal(as_bits(w.real[: t + 1]), as_bits(w2.real[: t + 1]))
    assert np.array_equal(as_bits(w.imag[: t + 1]), as_bits(w2.imag[: t + 1]))
    assert np.all(w[np.triu_indices(n, 1)] == 0)
