"""The SSM mixers of LOOPED: the study's selective SSM (``ssm_variant="s6"``) and Mamba's mixer
(``"mamba"``, shared with MAMBA) -- exact against a sequential reference (no log-space clamp),
causal, stepping equals the parallel forward and its returned state, and bad inputs fail clearly."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drmlab.models.layers import MambaMixer, mamba_mixer_parameter_count
from drmlab.models.looped.selective_ssm import SelectiveSSM, selective_ssm_parameter_count


def _randomized(variant, conv, d=4, n=3, seed=0):
    """A float64 mixer with parameters large enough for varied, fast decays (Mamba's at expand 1,
    as LOOPED builds it)."""
    torch.manual_seed(seed)
    if variant == "s6":
        m = SelectiveSSM(d, n, conv_kernel=conv).double()
    else:
        m = MambaMixer(d, n, d_conv=conv, expand=1).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return m


def _causal_conv(x, weight, bias):
    """The depthwise causal conv written out: tap j reads x_{t-(K-1-j)}; weight [C, 1, K]."""
    B, T, C = x.shape
    K = weight.shape[-1]
    out = torch.zeros_like(x)
    for t in range(T):
        acc = bias.expand(B, C).clone()
        for j in range(K):
            src = t - (K - 1 - j)
            if src >= 0:
                acc = acc + weight[:, 0, j] * x[:, src]
        out[:, t] = acc
    return out


def _reference(m, h: torch.Tensor) -> torch.Tensor:
    """The mixer's equations written out as a plain per-token Python loop (float64)."""
    if isinstance(m, MambaMixer):
        return _mamba_reference(m, h)
    B, T, d = h.shape
    n, K = m.d_state, m.conv_kernel
    c = F.silu(_causal_conv(h, m.conv_weight, m.conv_bias)) if K else h
    s = h.new_zeros(B, n)
    ys = []
    for t in range(T):
        ct = c[:, t]
        delta = F.softplus(ct @ m.w_delta.weight[0] + m.w_delta.bias[0])[:, None]  # [B, 1]
        s = torch.exp(-delta * F.softplus(m.a)) * s + delta * (ct @ m.w_b.weight.T)
        y = s @ m.w_c.weight.T + m.d_skip * ct
        gate = h[:, t] @ m.w_gate.weight.T
        ys.append((y * gate * torch.sigmoid(gate)) @ m.out_proj.weight.T)
    return torch.stack(ys, dim=1)


def _mamba_reference(m: MambaMixer, h: torch.Tensor) -> torch.Tensor:
    """Mamba's mixer (Gu & Dao 2023, section 3.4) as a per-token loop (float64)."""
    B, T, _ = h.shape
    e, n, r = m.d_inner, m.d_state, m.dt_rank
    xz = h @ m.in_proj.weight.T
    x, z = xz[..., :e], xz[..., e:]
    c = F.silu(_causal_conv(x, m.conv1d.weight, m.conv1d.bias)) if m.conv1d is not None else x
    A = -torch.exp(m.A_log)  # [e, n]
    s = h.new_zeros(B, e, n)
    ys = []
    for t in range(T):
        ct = c[:, t]
        proj = ct @ m.x_proj.weight.T
        dt_low, b_t, c_t = proj[:, :r], proj[:, r : r + n], proj[:, r + n :]
        delta = F.softplus(dt_low @ m.dt_proj.weight.T + m.dt_proj.bias)  # [B, e]
        s = torch.exp(delta[:, :, None] * A) * s + (delta * ct)[:, :, None] * b_t[:, None, :]
        y = (s * c_t[:, None, :]).sum(-1) + m.D * ct
        ys.append((y * F.silu(z[:, t])) @ m.out_proj.weight.T)
    return torch.stack(ys, dim=1)


@pytest.mark.parametrize("variant, conv", [("s6", 0), ("s6", 4), ("mamba", 4)])
def test_float64_equals_sequential_reference_at_T4096(variant, conv):
    m = _randomized(variant, conv)
    h = torch.randn(2, 4096, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, ref = m(h), _reference(m, h)
    assert out.shape == ref.shape == h.shape
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max() <= 1e-12 * max(1.0, ref.abs().max().item())


def _clamped_log_space_scan(log_decay, u, clamp=-30.0):
    """The reference study's parallel scan (docs/looped.md section 2.2): e^{Λ~_t} cumsum(u e^{-Λ~}),
    Λ~ = max(cumsum ℓ, -30)."""
    lam = torch.clamp(torch.cumsum(log_decay, dim=1), min=clamp)
    return torch.exp(lam) * torch.cumsum(u * torch.exp(-lam), dim=1)


def test_exact_where_the_study_clamped_scan_becomes_an_integrator():
    """At init-like decays the cumulative decay passes -30 nats within ~60 tokens; past that the
    clamped log-space scan stops forgetting while ours follows the true recurrence."""
    torch.manual_seed(0)
    m = SelectiveSSM(8, 4, conv_kernel=0).double()
    h = torch.randn(1, 512, 8, dtype=torch.float64)
    with torch.no_grad():
        f, u = m._gates(h)
        log_decay = torch.log(f)
        assert torch.cumsum(log_decay, dim=1)[0, -1].max() < -30  # the clamp would be active
        from drmlab.ops import linear_scan

        exact = linear_scan(f, u)
        ref = torch.zeros_like(u[:, 0])
        for t in range(u.shape[1]):
            ref = f[:, t] * ref + u[:, t]
        clamped = _clamped_log_space_scan(log_decay, u)
    assert (exact[:, -1] - ref).abs().max() <= 1e-12 * max(1.0, ref.abs().max().item())
    assert (clamped[:, -1] - ref).abs().max() > 0.1 * ref.abs().max()  # the planted bug is visible


@pytest.mark.parametrize("variant, conv", [("s6", 0), ("s6", 4), ("mamba", 3), ("mamba", 0)])
def test_step_equals_forward_and_is_causal(variant, conv):
    m = _randomized(variant, conv, d=5, n=2, seed=2)
    h = torch.randn(3, 23, 5, dtype=torch.float64)
    with torch.no_grad():
        full, parallel_state = m(h, return_state=True)
        state = m.init_state(3)
        stepped = []
        for t in range(h.shape[1]):
            before = [x.clone() if x is not None else None for x in state]
            out, new = m.step(h[:, t], state)
            assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(before, state))
            stepped.append(out)
            state = new
        assert (torch.stack(stepped, 1) - full).abs().max() <= 1e-12
        for a, b in zip(parallel_state, state):  # the parallel pass ends in the stepped state
            assert (a is None and b is None) or (a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12))
        h2 = h.clone()
        h2[:, 11:] = torch.randn_like(h2[:, 11:])
        assert torch.equal(m(h2)[:, :11], full[:, :11])


def test_gradients_are_exact_and_reach_the_decay_path():
    m = SelectiveSSM(3, 2, conv_kernel=2).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    h = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x), (h,))
    # long sequence: the decay parameters still get gradient far past the -30-nat point
    h = torch.randn(1, 400, 3, dtype=torch.float64)
    m(h)[:, -1].sum().backward()
    assert m.a.grad.abs().sum() > 0 and m.w_delta.weight.grad.abs().sum() > 0


def test_study_init_and_parameter_count():
    d, n = 24, 16
    for conv in (0, 4):
        m = SelectiveSSM(d, n, conv_kernel=conv)
        assert sum(p.numel() for p in m.parameters()) == selective_ssm_parameter_count(d, n, conv)
        assert torch.equal(m.a, torch.zeros(n)) and torch.equal(m.d_skip, torch.zeros(d))
    # the SSM block of the study (docs/looped.md section 1.6): 10d² + 2dn + 11d + n + 1, plus 5d with the
    # kernel-4 conv
    block_rest = 4 * d + 8 * d * d + 5 * d  # two LayerNorms and the 4x MLP
    assert selective_ssm_parameter_count(d, n, 0) + block_rest == 10 * d * d + 2 * d * n + 11 * d + n + 1
    assert selective_ssm_parameter_count(d, n, 4) - selective_ssm_parameter_count(d, n, 0) == 5 * d
    for conv in (0, 4):  # Mamba's mixer as LOOPED builds it, and its own init
        m = MambaMixer(d, n, d_conv=conv, expand=1)
        assert sum(p.numel() for p in m.parameters()) == mamba_mixer_parameter_count(d, n, conv, expand=1)
    rates = torch.exp(m.A_log)
    assert torch.allclose(rates[0], torch.arange(1, n + 1, dtype=rates.dtype), atol=1e-5)
    dt = F.softplus(m.dt_proj.bias)
    assert dt.min() >= 1e-3 - 1e-6 and dt.max() <= 0.1 + 1e-6


def test_gates_and_scan_stay_float32_under_bfloat16_autocast():
    m = SelectiveSSM(8, 4)
    h = torch.randn(2, 10, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f, u = m._gates(h.bfloat16())
        out = m(h)
    assert f.dtype == u.dtype == torch.float32
    assert torch.isfinite(out.float()).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match="d_model"):
        SelectiveSSM(0)
    with pytest.raises(ValueError, match="d_state"):
        SelectiveSSM(4, -1)
    with pytest.raises(ValueError, match="conv_kernel"):
        SelectiveSSM(4, 2, conv_kernel=-1)
    m = SelectiveSSM(4, 2)
    with pytest.raises(ValueError, match="batch, time"):
        m(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="batch"):
        m.step(torch.randn(2, 3, 4), m.init_state(2))
    with torch.no_grad():
        assert math.isfinite(float(m(torch.randn(1, 1, 4)).sum()))
