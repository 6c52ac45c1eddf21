"""The 17 checks of ``docs/resolvent.md`` section 5, one test per row of its table, against the
float64 reference ``drmlab.resolvent``.

As in the source, the references here are written in this file and share no code with the module
(plain Python loops over floats; numpy only for elementwise ``cos``/``sin``/``exp`` so that both
sides use the same elementary functions). Tolerances and planted negatives are those of that table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from drmlab.resolvent import (
    NonFinite,
    Switches,
    blend,
    chain_label,
    gate,
    operator,
    path_product,
    readout,
)

CORNERS = (Switches.SOFTMAX, Switches.UNNORMALIZED_KERNEL, Switches.PATH_PRODUCT)


# --------------------------------------------------------------------------- test-side references


def py_logit(q, k, i, j):
    acc = 0.0
    for t in range(len(q[i])):
        acc += float(q[i][t]) * float(k[j][t])
    return acc / math.sqrt(len(q[i]))


def py_causal_softmax(q, k):
    n = len(q)
    out = np.zeros((n, n))
    for i in range(n):
        s = [py_logit(q, k, i, j) for j in range(i + 1)]
        mx = max(s)
        e = [math.exp(x - mx) for x in s]
        tot = sum(e)
        for j in range(i + 1):
            out[i, j] = e[j] / tot
    return out


def cmul(x, y):
    """Complex product on real lanes, the formula of ``docs/resolvent.md`` section 4."""
    return (x[0] * y[0] - x[1] * y[1], x[0] * y[1] + x[1] * y[0])


def py_gates(m, th):
    """Gate lanes (m cos th, m sin th); numpy's cos/sin, as elementary functions."""
    m = np.asarray(m, dtype=float)
    th = np.asarray(th, dtype=float)
    return list(zip((m * np.cos(th)).tolist(), (m * np.sin(th)).tolist()))


def py_path(a, i, j):
    """prod_{k=j+1..i} a_k accumulated from k = i down to j + 1 (triple loop)."""
    acc = (1.0, 0.0)
    for kk in range(i, j, -1):
        acc = cmul(acc, a[kk])
    return acc


def rand_inputs(rng, n, d, closed=(), unit=()):
    q = rng.normal(size=(n, d))
    k = rng.normal(size=(n, d))
    u = rng.uniform(0.2, 1.0, size=n)
    th = rng.uniform(-math.pi, math.pi, size=n)
    for c in closed:
        u[c] = 0.0
    for c in unit:
        u[c] = 1.0
    return q, k, u, th


def bits(x):
    """The float64 bit patterns (so that -0.0 and 0.0 differ)."""
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


# --------------------------------------------------------------------------- the 17 checks


def test_the_softmax_corner_is_causal_softmax_and_matches_the_crate_reference():
    import torch

    rng = np.random.default_rng(1)
    n, d = 16, 8
    q, k, u, th = rand_inputs(rng, n, d, closed=(3,))
    w = operator(q, k, u, th, Switches.SOFTMAX)
    ref = py_causal_softmax(q, k)
    assert np.max(np.abs(w.real - ref)) <= 1e-14
    assert np.all(w.imag == 0.0)  # exactly 0 at g = 0
    # The framework reference: torch's scaled_dot_product_attention (float64, causal). With the
    # identity as values its output is the weight matrix itself.
    tq = torch.from_numpy(q)[None, None]
    tk = torch.from_numpy(k)[None, None]
    eye = torch.eye(n, dtype=torch.float64)[None, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention(tq, tk, eye, is_causal=True)
    assert np.max(np.abs(w.real - sdpa[0, 0].numpy())) <= 1e-14
    v = rng.normal(size=(n, 5))
    o = readout(w, v)
    o_sdpa = torch.nn.functional.scaled_dot_product_attention(tq, tk, torch.from_numpy(v)[None, None], is_causal=True)
    assert np.max(np.abs(o.real - o_sdpa[0, 0].numpy())) <= 1e-13
    assert np.all(o.imag == 0.0)


def test_the_unnormalized_kernel_corner_is_the_bare_exponential_bitwise():
    rng = np.random.default_rng(2)
    n, d = 12, 6
    q, k, u, th = rand_inputs(rng, n, d, closed=(4,))
    w = operator(q, k, u, th, Switches.UNNORMALIZED_KERNEL)
    for i in range(n):
        for j in range(n):
            if j <= i:
                expected = np.exp(py_logit(q, k, i, j))
                assert bits(np.float64(w.real[i, j])) == bits(np.float64(expected)), (i, j)
            else:
                assert w.real[i, j] == 0.0
    assert np.all(w.imag == 0.0)


def test_the_path_product_corner_is_the_gate_product_bitwise():
    rng = np.random.default_rng(3)
    n, d = 14, 4
    q, k, _, th = rand_inputs(rng, n, d)
    # closed (0 and below), unit (1 and above) and interior gates; at g = 1, m = clamp(u, 0, 1)
    u = np.array([0.5, 1.0, 0.0, 0.7, 1.0, 1.0, -0.3, 0.9, 1.7, 0.25, 1.0, 0.0, 0.6, 0.8])
    w = operator(q, k, u, th, Switches.PATH_PRODUCT)
    m = np.clip(u, 0.0, 1.0)
    a = py_gates(m, th)
    g_ref = np.zeros((n, n), dtype=np.complex128)
    for i in range(n):
        for j in range(i + 1):
            re, im = py_path(a, i, j)
            g_ref[i, j] = complex(re, im)
            assert w.real[i, j] == re and w.imag[i, j] == im, (i, j)
            assert bits(np.float64(w.real[i, j])) == bits(np.float64(re))
            assert bits(np.float64(w.imag[i, j])) == bits(np.float64(im))
    assert np.all(w[np.triu_indices(n, 1)] == 0)
    # path_product on the same gates is the same matrix, bit for bit
    ga = np.array([complex(x, y) for x, y in a])
    g = path_product(ga)
    assert np.array_equal(bits(g.real), bits(g_ref.real))
    assert np.array_equal(bits(g.imag), bits(g_ref.imag))
    # prefix_logit_mask_restated: entries with a closed gate on the path are exactly 0
    assert w[5, 1] == 0 and w[13, 0] == 0 and w[12, 10] == 0 and w[10, 5] == 0
    assert w[5, 2] != 0 and w[10, 6] != 0 and w[12, 11] != 0


def test_the_three_corners_are_distinct_operators():
    rng = np.random.default_rng(4)
    q, k, u, th = rand_inputs(rng, 5, 3)
    # corners_are_distinct: g = 0, qk = 0, entry (1, 0) reads 1/2 at beta = 1 and 1 at beta = 0
    assert operator(q, k, u, th, Switches(1.0, 0.0, 0.0))[1, 0] == 0.5
    assert operator(q, k, u, th, Switches(0.0, 0.0, 0.0))[1, 0] == 1.0
    # random inputs separate every pair of corners by more than 0.5
    q, k, u, th = rand_inputs(rng, 10, 4)
    ws = [operator(q, k, u, th, s) for s in CORNERS]
    for x in range(3):
        for y in range(x + 1, 3):
            assert np.max(np.abs(ws[x] - ws[y])) > 0.5, (CORNERS[x], CORNERS[y])


def test_beta_alone_decides_row_stochasticity():
    rng = np.random.default_rng(5)
    n, d = 16, 8
    q, k, u, th = rand_inputs(rng, n, d, closed=(6,), unit=(2,))
    zero = np.zeros(n)
    for sw, phase in (
        (Switches(1.0, 1.0, 0.0), th),  # gates off
        (Switches(1.0, 1.0, 1.0), zero),  # real gates on
        (Switches(1.0, 0.7, 1.0), zero),
        (Switches(1.0, 0.0, 1.0), zero),
    ):
        w = operator(q, k, u, phase, sw)
        assert np.max(np.abs(w.sum(axis=1) - 1.0)) <= 1e-14, sw
    # with phases on, the moduli of a beta = 1 row sum to one
    w = operator(q, k, u, th, Switches(1.0, 1.0, 1.0))
    assert np.max(np.abs(np.abs(w).sum(axis=1) - 1.0)) <= 1e-14
    # g = 0, beta = 0, qk = 0: the bare kernel, row i sums to exactly i + 1 (planted negative:
    # not stochastic, so g = 0 alone does not make the head a softmax)
    w = operator(q, k, u, th, Switches(0.0, 0.0, 0.0))
    for i in range(n):
        assert sum(w[i].real.tolist()) == i + 1
    assert np.all(w.imag == 0)
    # beta = 0 with gates on is not stochastic either
    w = operator(q, k, u, zero, Switches(0.0, 1.0, 1.0))
    assert np.max(np.abs(w.sum(axis=1) - 1.0)) > 0.1


def test_the_path_product_modulus_is_the_product_of_magnitudes():
    rng = np.random.default_rng(6)
    n = 24
    m = rng.uniform(0.0, 1.0, size=n)
    m[[3, 9]] = 1.0
    m[15] = 0.0
    th = rng.uniform(-math.pi, math.pi, size=n)
    g = path_product(gate(m, th))
    for i in range(n):
        for j in range(i + 1):
            r = 1.0
            for kk in range(i, j, -1):
                r *= float(m[kk])
            assert abs(abs(g[i, j]) - r) <= 1e-14
            assert abs(g[i, j]) <= 1.0 + 1e-14
            on_path = m[j + 1 : i + 1]
            # |G_ij| = 1 iff every magnitude on the path is 1 (the modulus R is exact here)
            assert (r == 1.0) == bool(np.all(on_path == 1.0))
            if np.all(on_path == 1.0):
                assert abs(abs(g[i, j]) - 1.0) <= 1e-14


def test_a_closed_gate_annihilates_every_path_through_it_exactly():
    rng = np.random.default_rng(7)
    n, d = 12, 4
    q, k, u, th = rand_inputs(rng, n, d)
    c = 5
    u[c] = -4.0  # closed for every g in (0, 1]: clamp(1 + g (u - 1), 0, 1) = 0 once g >= 0.2
    settings = list(CORNERS[2:]) + [
        Switches(1.0, 1.0, 1.0),
        Switches(0.0, 1.0, 1.0),
        Switches(0.5, 0.3, 1.0),
        Switches(1.0, -2.0, 0.75),
        Switches(0.0, 0.0, 1.2),
        Switches(0.25, 1.0, 0.5),
    ]
    for sw in settings:
        w = operator(q, k, u, th, sw)
        for i in range(c, n):
            for j in range(c):
                assert w.real[i, j] == 0.0 and w.imag[i, j] == 0.0, (sw, i, j)
        # and nothing else on the causal triangle is 0 (the zero is exactly the paths through c)
        for i in range(n):
            for j in range(i + 1):
                if not (i >= c > j):
                    assert w[i, j] != 0, (sw, i, j)
    # no_prefix_scan_represents_a_zero_gate (planted negatives): with a finite prefix C the form
    # exp(C_i - C_j) is never 0 on a path through the closed gate, and with C = cumsum(log m)
    # (log 0 = -inf) a path after the closed gate reads NaN instead of its nonzero value
    m = np.clip(u, 0.0, 1.0)
    with np.errstate(all="ignore"):
        finite_c = np.cumsum(np.log(np.maximum(m, 1e-300)))
        through = np.exp(finite_c[c + 2] - finite_c[c - 2])
        cum = np.cumsum(np.log(m))
        after = np.exp(cum[c + 3] - cum[c + 1])
    assert through > 0.0
    assert np.isnan(after)


def test_the_bedm_values_are_ordinary_points_of_the_gate():
    minus = gate(1.0, math.pi)
    assert minus.real == -1.0 and abs(minus.imag) <= 1.3e-16
    zero = gate(0.0, 0.0)
    assert zero.real == 0.0 and zero.imag == 0.0
    one = gate(1.0, 0.0)
    assert one.real == 1.0 and one.imag == 0.0
    # negative_draw_is_on_the_band: each is reached by blend with magnitude in [0, 1]
    for u, theta, target in ((1.0, math.pi, -1.0), (0.0, 0.0, 0.0), (1.0, 0.0, 1.0)):
        m, tp = blend(u, theta, 1.0)
        assert 0.0 <= m <= 1.0
        a = gate(m, tp)
        assert a.real == target and abs(a.imag) <= 1.3e-16
    # and as a path-product entry of the operator
    q = np.zeros((2, 1))
    w = operator(q, q, [0.0, 1.0], [0.0, math.pi], Switches.PATH_PRODUCT)
    assert w.real[1, 0] == -1.0 and abs(w.imag[1, 0]) <= 1.3e-16


def test_a_constant_phase_is_the_rope_kernel_and_every_phase_schedule_separates():
    rng = np.random.default_rng(9)
    n, d = 32, 4
    q, k, _, _ = rand_inputs(rng, n, d)
    ones = np.ones(n)
    omega = 0.37
    w = operator(q, k, ones, np.full(n, omega), Switches.PATH_PRODUCT)
    for i in range(n):
        for j in range(i + 1):
            assert abs(w[i, j] - np.exp(1j * omega * (i - j))) <= 1e-13
            if i + 1 < n:
                assert abs(w[i + 1, j + 1] - w[i, j]) <= 1e-13  # Toeplitz
    th = rng.uniform(-math.pi, math.pi, size=n)
    w = operator(q, k, ones, th, Switches.PATH_PRODUCT)
    big_theta = np.concatenate([[0.0], np.cumsum(th[1:])])  # a_0 is never read
    for i in range(n):
        for j in range(i + 1):
            assert abs(w[i, j] - np.exp(1j * (big_theta[i] - big_theta[j]))) <= 1e-13


def test_scalar_gates_commute_within_a_window():
    rng = np.random.default_rng(10)
    n = 16
    m = rng.uniform(0.3, 1.0, size=n)
    th = rng.uniform(-math.pi, math.pi, size=n)
    a = gate(m, th)
    p, r = 5, 10  # permute the gates at positions p..r inclusive
    perm = a.copy()
    perm[p : r + 1] = a[p : r + 1][rng.permutation(r + 1 - p)]
    assert not np.array_equal(perm, a)
    g, gp = path_product(a), path_product(perm)
    checked_in = checked_out = 0
    for i in range(n):
        for j in range(i + 1):
            if j + 1 <= p and i >= r:  # the window holds the whole permutation
                assert abs(gp[i, j] - g[i, j]) <= 1e-15
                checked_in += 1
            elif i < p or j + 1 > r:  # the window misses it
                assert bits(np.float64(gp[i, j].real)) == bits(np.float64(g[i, j].real))
                assert bits(np.float64(gp[i, j].imag)) == bits(np.float64(g[i, j].imag))
                checked_out += 1
    assert checked_in > 10 and checked_out > 10


def test_the_path_product_corner_reads_out_the_chain_and_inverts_the_gate_shift():
    rng = np.random.default_rng(11)
    n, d = 20, 3
    q, k, u, th = rand_inputs(rng, n, d, closed=(7,), unit=(3, 12))
    b = rng.normal(size=n)
    b[0] = 0.0
    w = operator(q, k, u, th, Switches.PATH_PRODUCT)
    m, tp = blend(u, th, 1.0)
    a = gate(m, tp)
    y = chain_label(a, b)
    o = readout(w, b[:, None])[:, 0]
    assert np.max(np.abs(o - y)) <= 1e-12
    # independent loop for the chain (b_0 and a_0 are not read)
    yy, ref = 0j, [0j]
    for i in range(1, n):
        yy = a[i] * yy + b[i]
        ref.append(yy)
    assert np.max(np.abs(np.array(ref) - y)) <= 1e-12
    b2 = b.copy()
    b2[0] = 123.0
    a2 = a.copy()
    a2[0] = 9.0 - 4.0j
    assert np.array_equal(chain_label(a2, b2), y)
    # G (I - A) = I and (I - A) G = I, A the gate shift A[i, i-1] = a_i
    shift = np.zeros((n, n), dtype=np.complex128)
    shift[np.arange(1, n), np.arange(n - 1)] = a[1:]
    eye = np.eye(n)
    assert np.max(np.abs(w @ (eye - shift) - eye)) <= 1e-14
    assert np.max(np.abs((eye - shift) @ w - eye)) <= 1e-14
    # planted negative: beta = 1 normalises the rows and breaks the chain
    w1 = operator(q, k, u, th, Switches(1.0, 0.0, 1.0))
    assert np.max(np.abs(readout(w1, b[:, None])[:, 0] - y)) > 0.1


def test_perturbing_the_future_never_moves_the_past():
    rng = np.random.default_rng(12)
    n, d = 16, 5
    q, k, u, th = rand_inputs(rng, n, d, closed=(4,))
    for sw in CORNERS + (Switches(1.0, 1.0, 1.0), Switches(0.5, 2.0, 0.8)):
        w = operator(q, k, u, th, sw)
        assert np.all(w.real[np.triu_indices(n, 1)] == 0.0)
        assert np.all(w.imag[np.triu_indices(n, 1)] == 0.0)
        for t in (0, 5, 11):
            q2, k2, u2, th2 = q.copy(), k.copy(), u.copy(), th.copy()
            q2[t + 1 :] = rng.normal(size=q2[t + 1 :].shape) * 3
            k2[t + 1 :] = rng.normal(size=k2[t + 1 :].shape) * 3
            u2[t + 1 :] = rng.uniform(-1, 2, size=n - t - 1)
            th2[t + 1 :] = rng.uniform(-5, 5, size=n - t - 1)
            w2 = operator(q2, k2, u2, th2, sw)
            assert np.array_equal(bits(w2.real[: t + 1]), bits(w.real[: t + 1]))
            assert np.array_equal(bits(w2.imag[: t + 1]), bits(w.imag[: t + 1]))
            assert not np.array_equal(w2[t + 1 :], w[t + 1 :])


def test_an_off_switch_deletes_its_term_exactly():
    rng = np.random.default_rng(13)
    n, d = 12, 4
    q, k, u, th = rand_inputs(rng, n, d, closed=(3,))
    u[6] = -2.0
    u[8] = 5.0
    ones, zeros = np.ones(n), np.zeros(n)
    for beta, qk in ((1.0, 1.0), (0.0, 1.0), (0.5, -0.7)):
        sw = Switches(beta, qk, 0.0)
        assert np.array_equal(operator(q, k, u, th, sw), operator(q, k, ones, zeros, sw))
        assert np.array_equal(operator(q, k, u, th, sw), operator(q, k, rng.uniform(size=n), 7 * th, sw))
    q2, k2 = rng.normal(size=(n, d)) * 50, rng.normal(size=(n, d)) * 50
    zq = np.zeros((n, d))
    for beta, g in ((1.0, 1.0), (0.0, 1.0), (0.5, 0.6)):
        sw = Switches(beta, 0.0, g)
        w = operator(q, k, u, th, sw)
        assert np.array_equal(w, operator(q2, k2, u, th, sw))
        assert np.array_equal(w, operator(zq, zq, u, th, sw))


def test_logits_of_ten_thousand_stay_finite_at_beta_one():
    rng = np.random.default_rng(14)
    n, d = 16, 4
    q = rng.normal(size=(n, d)) * 150.0
    k = rng.normal(size=(n, d)) * 150.0
    s = np.array([[py_logit(q, k, i, j) for j in range(n)] for i in range(n)])
    causal = np.tril(np.ones((n, n), dtype=bool))
    assert s[causal].max() > 1e4 and s[causal].min() < -1e4
    _, _, u, th = rand_inputs(rng, n, d)
    w = operator(q, k, u, th, Switches.SOFTMAX)
    assert np.all(np.isfinite(w.real)) and np.all(np.isfinite(w.imag))
    assert np.all(np.abs(w) <= 1.0)
    assert np.max(np.abs(w.sum(axis=1) - 1.0)) <= 1e-9
    assert np.max(np.abs(w.real - py_causal_softmax(q, k))) <= 1e-9
    # gates on (real, with a closed gate) and phases on: still finite, |W| <= 1
    u[5] = 0.0
    for phase in (np.zeros(n), th):
        w = operator(q, k, u, phase, Switches(1.0, 1.0, 1.0))
        assert np.all(np.isfinite(w.real)) and np.all(np.isfinite(w.imag))
        assert np.all(np.abs(w) <= 1.0 + 1e-9)  # rounding of log R + s at |s| ~ 1e4
        assert np.max(np.abs(np.abs(w).sum(axis=1) - 1.0)) <= 1e-9
    # planted negative: the dense form e^s / sum e^s overflows here
    with np.errstate(all="ignore"):
        e = np.where(causal, np.exp(s), 0.0)
        dense = e / e.sum(axis=1, keepdims=True)
    assert not np.all(np.isfinite(dense))


def test_an_overflowing_logit_never_becomes_nan():
    n, d = 6, 1
    q = np.ones((n, d))
    k = np.ones((n, d))
    q[4, 0] = 200.0
    k[2, 0] = 100.0  # logit (4, 2) = 2e4
    rng = np.random.default_rng(15)
    u = rng.uniform(0.3, 1.0, size=n)
    th = rng.uniform(-3, 3, size=n)
    w = operator(q, k, u, th, Switches.UNNORMALIZED_KERNEL)
    assert w.real[4, 2] == math.inf and w.imag[4, 2] == 0.0
    assert not np.any(np.isnan(w.real)) and not np.any(np.isnan(w.imag))
    # with gates and phases on, both lanes read +-inf with the sign of G; no NaN
    sw = Switches(0.0, 1.0, 1.0)
    w = operator(q, k, u, th, sw)
    g = path_product(gate(*blend(u, th, 1.0)))
    assert w.real[4, 2] == math.copysign(math.inf, g.real[4, 2])
    assert w.imag[4, 2] == math.copysign(math.inf, g.imag[4, 2])
    assert not np.any(np.isnan(w.real)) and not np.any(np.isnan(w.imag))
    # a closed gate on the path keeps the overflowing entry exactly 0
    u[3] = 0.0
    w = operator(q, k, u, th, sw)
    assert w.real[4, 2] == 0.0 and w.imag[4, 2] == 0.0
    assert not np.any(np.isnan(w.real)) and not np.any(np.isnan(w.imag))
    # a zero lane of G (unit real gate) stays 0 rather than 0 * inf
    u2 = np.ones(n)
    w = operator(q, k, u2, np.zeros(n), sw)
    assert w.real[4, 2] == math.inf and w.imag[4, 2] == 0.0


def test_non_finite_input_is_refused():
    rng = np.random.default_rng(16)
    n, d = 5, 3
    q, k, u, th = rand_inputs(rng, n, d)
    sw = Switches(1.0, 1.0, 1.0)
    operator(q, k, u, th, sw)  # accepted
    for bad in (math.nan, math.inf, -math.inf):
        for name in ("q", "k", "u", "theta"):
            args = {"q": q.copy(), "k": k.copy(), "u": u.copy(), "theta": th.copy()}
            arr = args[name]
            arr.flat[arr.size // 2] = bad
            with pytest.raises(NonFinite):
                operator(args["q"], args["k"], args["u"], args["theta"], sw)
        for field in ("beta", "qk", "g"):
            bad_sw = Switches(**{**dict(beta=1.0, qk=1.0, g=1.0), field: bad})
            with pytest.raises(NonFinite):
                operator(q, k, u, th, bad_sw)
    # a blended phase g * theta that overflows
    th_big = th.copy()
    th_big[2] = 1e200
    with pytest.raises(NonFinite):
        operator(q, k, u, th_big, Switches(1.0, 1.0, 1e200))
    # a dot product that overflows, and a logit qk * s that overflows
    q_big = q.copy()
    k_big = k.copy()
    q_big[3] = 1e200
    k_big[1] = 1e200
    with pytest.raises(NonFinite):
        operator(q_big, k_big, u, th, sw)
    with pytest.raises(NonFinite):
        operator(q * 10.0, k * 10.0, u, th, Switches(1.0, 1e308, 1.0))
    # with qk = 0 the overflowing dot product is accepted: the logit is exactly 0
    w = operator(q_big, k_big, u, th, Switches(1.0, 0.0, 1.0))
    assert np.all(np.isfinite(w.real)) and np.all(np.isfinite(w.imag))
    assert np.array_equal(w, operator(q, k, u, th, Switches(1.0, 0.0, 1.0)))
    # where the original Rust operator panics: ValueError
    with pytest.raises(ValueError):
        operator(q, k[:, :2], u, th, sw)
    with pytest.raises(ValueError):
        operator(q, k, u[:3], th, sw)
    with pytest.raises(ValueError):
        operator(np.zeros((n, 0)), np.zeros((n, 0)), u, th, sw)
    with pytest.raises(ValueError):
        readout(np.zeros((3, 3), complex), np.zeros((4, 2)))
    with pytest.raises(ValueError):
        chain_label(np.zeros(3, complex), np.zeros(4))


def test_an_empty_sequence_is_empty_and_no_row_is_ever_all_masked():
    for d in (0, 4):
        for sw in CORNERS:
            w = operator(np.zeros((0, d)), np.zeros((0, d)), [], [], sw)
            assert w.shape == (0, 0) and w.dtype == np.complex128
    assert readout(np.zeros((0, 0), complex), np.zeros((0, 3))).shape == (0, 3)
    assert chain_label(np.zeros(0, complex), np.zeros(0)).shape == (0,)
    assert path_product(np.zeros(0, complex)).shape == (0, 0)
    # closing every gate leaves the identity, never an empty row
    rng = np.random.default_rng(17)
    n, d = 9, 3
    q, k, _, th = rand_inputs(rng, n, d)
    closed = np.zeros(n)
    eye = np.eye(n)
    for sw in (Switches.PATH_PRODUCT, Switches(1.0, 1.0, 1.0), Switches(1.0, -3.0, 1.0)):
        assert np.array_equal(operator(q, k, closed, th, sw), eye)
    w = operator(q, k, closed, th, Switches(0.0, 1.0, 1.0))
    diag = np.exp([py_logit(q, k, i, i) for i in range(n)])
    assert np.array_equal(w, np.diag(diag))
