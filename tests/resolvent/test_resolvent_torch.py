"""The batched torch resolvent operator (drmlab.resolvent.attention) and the gate parameterisations
(drmlab.resolvent.gates), ``docs/resolvent.md`` sections 6 and 7: float64 agreement with the numpy
reference to 1e-12, every fast path against the dense path, gradcheck in float64 for each path,
float32 and bfloat16, O(S) memory of the blockwise path, and gates that keep gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from drmlab.resolvent import Switches, operator, readout
from drmlab.resolvent.attention import resolvent_attention, resolvent_weights, select_path
from drmlab.resolvent.gates import (
    DEFAULT_PARAMETERISATION,
    PARAMETERISATIONS,
    GateHead,
    clamp_magnitude,
    hard_concrete_magnitude,
    sigmoid_magnitude,
)

F64 = torch.float64

SWITCHES = [
    (1.0, 1.0, 0.0),  # softmax corner
    (0.0, 1.0, 0.0),  # unnormalized kernel corner
    (0.0, 0.0, 1.0),  # path-product corner
    (1.0, 1.0, 1.0),
    (0.0, 1.0, 1.0),
    (0.5, 0.7, 0.8),
    (1.0, -1.3, 1.6),
    (0.3, 0.0, 0.6),
]


def make_inputs(B=2, H=3, S=23, d=5, e=4, hg=1, dtype=F64, seed=0, closed=(4, 15), phase=True, unit=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, d, generator=gen, dtype=F64)
    k = torch.randn(B, H, S, d, generator=gen, dtype=F64)
    v = torch.randn(B, H, S, e, generator=gen, dtype=F64)
    u = torch.rand(B, hg, S, generator=gen, dtype=F64) * 0.7 + 0.3
    if S > 9 and unit:  # (gradcheck avoids u = 1, a kink of the clamp)
        u[..., 7] = 1.0  # unit gate
        u[..., 9] = 1.5  # above the band: unit after the clamp at g = 1
    for c in closed:
        if c < S:
            u[..., c] = -0.5  # closed at g >= 1/3
    th = (torch.rand(B, hg, S, generator=gen, dtype=F64) * 2 - 1) * math.pi if phase else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(u), cast(th)


def reference_readout(q, k, v, u, th, sw):
    B, H, S, _ = q.shape
    re = np.zeros(v.shape)
    im = np.zeros(v.shape)
    w_all = np.zeros((B, H, S, S), dtype=np.complex128)
    for b in range(B):
        for h in range(H):
            hu = h if u.shape[1] > 1 else 0
            phase = np.zeros(S) if th is None else th[b, hu].double().numpy()
            w = operator(
                q[b, h].double().numpy(), k[b, h].double().numpy(), u[b, hu].double().numpy(), phase, Switches(*sw)
            )
            o = readout(w, v[b, h].double().numpy())
            w_all[b, h] = w
            re[b, h], im[b, h] = o.real, o.imag
    return w_all, torch.from_numpy(re), torch.from_numpy(im)


def paths_for(sw):
    beta, qk, g = sw
    paths = ["dense", "flash"]
    if g == 0.0 and beta == 1.0:
        paths.append("sdpa")
    if qk == 0.0:
        paths.append("scan")
    return paths


# --------------------------------------------------------------------------- float64 exactness


@pytest.mark.parametrize("sw", SWITCHES)
@pytest.mark.parametrize("hg", [1, 3])
def test_float64_paths_agree_with_the_reference(sw, hg):
    q, k, v, u, th = make_inputs(hg=hg, seed=hash((sw, hg)) % 1000)
    w_ref, re_ref, im_ref = reference_readout(q, k, v, u, th, sw)
    w_re, w_im = resolvent_weights(q, k, u, th, *sw)
    assert np.max(np.abs(w_re.numpy() - w_ref.real)) <= 1e-12
    assert np.max(np.abs(w_im.numpy() - w_ref.imag)) <= 1e-12
    for path in paths_for(sw):
        re, im = resolvent_attention(q, k, v, u, th, *sw, path=path, return_imag=True, block_q=8, block_k=8, block_bh=4)
        assert re.dtype == F64
        assert (re - re_ref).abs().max() <= 1e-12, path
        assert (im - im_ref).abs().max() <= 1e-12, path
        auto = resolvent_attention(q, k, v, u, th, *sw)
        assert (auto - re_ref).abs().max() <= 1e-12


def test_phase_free_gates_and_per_head_switches():
    q, k, v, u, _ = make_inputs(hg=3, seed=5)
    beta = torch.tensor([1.0, 0.0, 0.5], dtype=F64)
    qk = torch.tensor([[1.0, 0.5, 2.0], [0.3, 1.0, -1.0]], dtype=F64)
    g = torch.tensor([1.0, 0.7, 1.0], dtype=F64)
    dense = resolvent_attention(q, k, v, u, None, beta, qk, g, path="dense")
    flash = resolvent_attention(q, k, v, u, None, beta, qk, g, path="flash", block_q=4, block_k=16, block_bh=1)
    assert (dense - flash).abs().max() <= 1e-12
    for b in range(2):
        for h in range(3):
            sw = Switches(float(beta[h]), float(qk[b, h]), float(g[h]))
            w = operator(q[b, h].numpy(), k[b, h].numpy(), u[b, h].numpy(), np.zeros(23), sw)
            o = readout(w, v[b, h].numpy())
            assert np.max(np.abs(o.real - dense[b, h].numpy())) <= 1e-12
            assert np.max(np.abs(o.imag)) == 0.0


def test_flash_tiles_do_not_change_the_result():
    # many closed gates (segments), strong decay, S not a multiple of any block
    q, k, v, u, th = make_inputs(B=1, H=5, S=61, closed=(1, 2, 13, 14, 40, 60), seed=3)
    u[..., 20:30] = 1e-3
    sw = (0.6, 1.2, 1.0)
    ref = resolvent_attention(q, k, v, u, th, *sw, path="dense", return_imag=True)
    for bq, bk, bh in [(1, 1, 1), (7, 5, 2), (16, 64, 8), (64, 16, 3), (128, 1024, 8)]:
        out = resolvent_attention(
            q, k, v, u, th, *sw, path="flash", return_imag=True, block_q=bq, block_k=bk, block_bh=bh
        )
        for a, b in zip(out, ref):
            assert (a - b).abs().max() <= 1e-12, (bq, bk, bh)


def test_every_gate_closed_leaves_the_diagonal():
    q, k, v, _, th = make_inputs(B=1, H=2, S=9)
    u = torch.zeros(1, 1, 9, dtype=F64)
    for path in ("dense", "flash"):
        out = resolvent_attention(q, k, v, u, th, 1.0, 1.0, 1.0, path=path)
        assert torch.equal(out, v) or (out - v).abs().max() <= 1e-15
    out = resolvent_attention(q, k, v, u, th, 0.0, 0.0, 1.0, path="scan")
    assert torch.equal(out, v)


# --------------------------------------------------------------------------- path selection


def test_auto_path_selection_respects_learnable_switches():
    th = torch.zeros(1, 1, 4)
    assert select_path(th, 1.0, 1.0, 0.0) == "sdpa"
    assert select_path(th, 1.0, 0.5, 0.0) == "sdpa"
    assert select_path(th, 0.0, 0.0, 1.0) == "scan"
    assert select_path(th, 0.5, 0.0, 0.3) == "scan"
    assert select_path(th, 1.0, 1.0, 1.0) == "flash"
    assert select_path(th, 0.0, 1.0, 0.0) == "flash"
    # a switch that requires grad is never treated as fixed at a corner
    g = torch.zeros((), requires_grad=True)
    assert select_path(th, 1.0, 1.0, g) == "flash"
    qk = torch.zeros((), requires_grad=True)
    assert select_path(th, 0.0, qk, 1.0) == "flash"
    # and its gradient survives: d out / d g at g = 0 is not zero
    q, k, v, u, phase = make_inputs(B=1, H=1, S=8)
    g = torch.zeros((), dtype=F64, requires_grad=True)
    resolvent_attention(q, k, v, u, phase, 1.0, 1.0, g).sum().backward()
    assert g.grad is not None and g.grad.abs() > 0
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u, phase, 1.0, 1.0, 1.0, path="sdpa")
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u, phase, 1.0, 1.0, 1.0, path="scan")


def test_softmax_corner_is_scaled_dot_product_attention():
    q, k, v, u, th = make_inputs(dtype=torch.float32)
    out = resolvent_attention(q, k, v, u, th, 1.0, 1.0, 0.0)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    dense = resolvent_attention(q, k, v, u, th, 1.0, 1.0, 0.0, path="dense")
    assert (out - dense).abs().max() <= 1e-5


# --------------------------------------------------------------------------- float32 and bf16


@pytest.mark.parametrize("sw", SWITCHES)
def test_float32_fast_paths_match_dense(sw):
    q, k, v, u, th = make_inputs(B=2, H=2, S=70, d=8, e=6, dtype=torch.float32, seed=11)
    ref = resolvent_attention(
        q.double(), k.double(), v.double(), u.double(), th.double(), *sw, path="dense", return_imag=True
    )
    scale = max(1.0, float(ref[0].abs().max()), float(ref[1].abs().max()))
    for path in paths_for(sw):
        re, im = resolvent_attention(q, k, v, u, th, *sw, path=path, return_imag=True, block_q=16, block_k=32)
        assert re.dtype == torch.float32
        assert (re.double() - ref[0]).abs().max() <= 2e-5 * scale, path
        assert (im.double() - ref[1]).abs().max() <= 2e-5 * scale, path


@pytest.mark.parametrize("sw", [(1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (0.0, 0.0, 1.0), (0.5, 0.7, 0.8)])
def test_bfloat16_works(sw):
    q, k, v, u, th = make_inputs(B=1, H=2, S=40, d=8, e=4, dtype=torch.bfloat16, seed=12)
    ref = resolvent_attention(q.double(), k.double(), v.double(), u.double(), th.double(), *sw, path="dense")
    for path in paths_for(sw) + ["auto"]:
        out = resolvent_attention(q, k, v, u, th, *sw, path=path)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert (out.double() - ref).abs().max() <= 0.05 * max(1.0, float(ref.abs().max())), path


# --------------------------------------------------------------------------- gradients


def _leaves(*ts):
    return tuple(t.detach().clone().requires_grad_() for t in ts)


@pytest.mark.parametrize("path", ["dense", "flash"])
def test_gradcheck_general_paths(path):
    q, k, v, u, th = make_inputs(B=1, H=2, S=9, d=3, e=2, closed=(4,), seed=21)
    sw = _leaves(torch.tensor(0.7, dtype=F64), torch.tensor(0.9, dtype=F64), torch.tensor([1.0, 0.8], dtype=F64))
    args = _leaves(q, k, v, u, th) + sw

    def fn(q, k, v, u, th, beta, qk, g):
        return resolvent_attention(
            q, k, v, u, th, beta, qk, g, path=path, return_imag=True, block_q=4, block_k=3, block_bh=1
        )

    assert torch.autograd.gradcheck(fn, args)


def test_gradcheck_flash_phase_free_and_beta_one():
    q, k, v, u, _ = make_inputs(B=1, H=2, S=10, d=3, e=2, hg=2, closed=(6,), seed=22, unit=False)
    qk, g = _leaves(torch.tensor(1.1, dtype=F64), torch.tensor(0.9, dtype=F64))
    args = _leaves(q, k, v, u) + (qk, g)

    def fn(q, k, v, u, qk, g):
        return resolvent_attention(q, k, v, u, None, 1.0, qk, g, path="flash", block_q=3, block_k=4)

    assert torch.autograd.gradcheck(fn, args)


def test_gradcheck_sdpa_path():
    q, k, v, u, th = make_inputs(B=1, H=2, S=8, d=3, e=2, seed=23)
    qk = torch.tensor(0.8, dtype=F64, requires_grad=True)
    args = _leaves(q, k, v) + (qk,)

    def fn(q, k, v, qk):
        return resolvent_attention(q, k, v, u, th, 1.0, qk, 0.0, path="sdpa")

    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("phase", [True, False])
def test_gradcheck_scan_path(phase):
    q, k, v, u, th = make_inputs(B=1, H=2, S=9, d=3, e=2, closed=(5,), seed=24, phase=phase)
    beta, g = _leaves(torch.tensor(0.6, dtype=F64), torch.tensor(1.0, dtype=F64))
    leaves = _leaves(v, u) + ((th.detach().clone().requires_grad_(),) if phase else ())

    def fn(v, u, *rest):
        if phase:
            t, b, gg = rest
        else:
            t, (b, gg) = None, rest
        return resolvent_attention(q, k, v, u, t, b, 0.0, gg, path="scan", return_imag=True)

    assert torch.autograd.gradcheck(fn, leaves + (beta, g))


def test_fast_path_gradients_match_dense():
    q, k, v, u, th = make_inputs(B=2, H=2, S=30, seed=25)
    grads = {}
    for path in ("dense", "flash"):
        args = _leaves(q, k, v, u, th)
        sw = _leaves(torch.tensor(0.4, dtype=F64), torch.tensor(1.2, dtype=F64), torch.tensor(0.9, dtype=F64))
        re, im = resolvent_attention(*args, *sw, path=path, return_imag=True, block_q=8, block_k=8)
        (re.sum() + 0.3 * im.square().sum()).backward()
        grads[path] = [t.grad for t in args + sw]
    for a, b in zip(grads["dense"], grads["flash"]):
        assert (a - b).abs().max() <= 1e-10


# --------------------------------------------------------------------------- O(S) memory


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_flash_never_materialises_s_by_s():
    B, H, S, d = 1, 2, 512, 8
    q, k, v, u, th = make_inputs(B=B, H=H, S=S, d=d, e=d, dtype=torch.float32, seed=31)
    args = _leaves(q, k, v, u, th)
    sizes = {}
    for path, kw in (("flash", dict(block_q=16, block_k=32, block_bh=1)), ("dense", {})):
        mode = _LargestTensor()
        with mode:
            out = resolvent_attention(*args, 0.5, 1.0, 1.0, path=path, **kw)
            out.sum().backward()
        sizes[path] = mode.largest
    assert sizes["dense"] >= B * H * S * S
    # the largest tensor of the blockwise path is O(S): inputs/outputs with widened values
    assert sizes["flash"] <= B * H * S * (2 * d + 2)
    assert sizes["flash"] < S * S // 8


# --------------------------------------------------------------------------- shapes and empty


def test_empty_sequence_and_shape_errors():
    q = torch.zeros(2, 3, 0, 4)
    v = torch.zeros(2, 3, 0, 5)
    u = torch.zeros(2, 1, 0)
    for path in ("auto", "dense", "flash"):
        out = resolvent_attention(q, q, v, u, u, 1.0, 1.0, 1.0, path=path)
        assert out.shape == (2, 3, 0, 5)
    q, k, v, u, th = make_inputs(B=1, H=2, S=6)
    with pytest.raises(ValueError):
        resolvent_attention(q, k[..., :3], v, u, th, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v[:, :, :5], u, th, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u[..., :5], th, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u.expand(1, 3, 6), th, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q[..., :0], k[..., :0], v, u, th, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u, th, torch.ones(5), 1.0, 1.0)
    with pytest.raises(ValueError):
        resolvent_attention(q, k, v, u, th, 1.0, 1.0, 1.0, path="nope")


# --------------------------------------------------------------------------- gates


def test_gate_parameterisations():
    x = torch.linspace(-6, 6, 101, dtype=F64)
    assert torch.equal(clamp_magnitude(x), x.clamp(0, 1))
    hc = hard_concrete_magnitude(x)
    assert torch.equal(hc, (1.2 * torch.sigmoid(x) - 0.1).clamp(0, 1))
    assert hc.min() == 0.0 and hc.max() == 1.0
    sg = sigmoid_magnitude(x)
    assert (sg > 0).all() and (sg < 1).all()
    assert DEFAULT_PARAMETERISATION == "sigmoid"
    assert set(PARAMETERISATIONS) == {"clamp", "hard_concrete", "sigmoid"}
    with pytest.raises(ValueError):
        GateHead(8, parameterisation="relu")


def _gate_grads(parameterisation, magnitude_bias=None, seed=0):
    torch.manual_seed(seed)
    B, H, S, dm, dh = 2, 2, 48, 16, 8
    x = torch.randn(B, S, dm)
    head = GateHead(dm, n_heads=1, parameterisation=parameterisation, magnitude_bias=magnitude_bias)
    beta, qk, g = (torch.nn.Parameter(torch.ones(())) for _ in range(3))
    q, k, v = (torch.randn(B, H, S, dh) for _ in range(3))
    u, theta = head(x)
    u.retain_grad()
    out = resolvent_attention(q, k, v, u, theta, beta, qk, g)
    (out * torch.randn_like(out)).sum().backward()
    return head, (beta, qk, g), u


def test_default_gates_get_gradient_at_initialisation():
    head, switches, u = _gate_grads(DEFAULT_PARAMETERISATION)
    for name, p in head.named_parameters():
        assert p.grad is not None, name
        assert (p.grad != 0).all(), name
    for s in switches:
        assert s.grad is not None and s.grad != 0
    assert (u.grad[..., 1:] != 0).all()  # a_0 is never read, so u_0 carries no gradient


def test_the_clamp_is_the_freeze():
    # the reference clamp at bias 0 (docs/resolvent.md section 7): a large share of gates sits at
    # exactly 0 or 1 with no gradient
    _, _, u = _gate_grads("clamp", magnitude_bias=0.0)
    frozen = (u.grad[..., 1:] == 0).double().mean()
    assert frozen > 0.3
    # the hard-concrete and sigmoid magnitudes keep (almost) every gate live
    for name in ("hard_concrete", "sigmoid"):
        _, _, u = _gate_grads(name, magnitude_bias=0.0)
        assert (u.grad[..., 1:] == 0).double().mean() < 0.05, name


# --------------------------------------------------------------------------- flex
# The ``flex`` path (drmlab.resolvent.flex): on a CPU only its forward runs (torch has no CPU
# backward for flex_attention); the CUDA test below is the GPU check and was not run when written.

flex_attention_mod = pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.mark.parametrize("sw", SWITCHES)
def test_flex_forward_matches_reference_in_float64(sw):
    # closed gates at 4 and 15 (closed for g >= 1/3), a unit gate and one above the band
    q, k, v, u, _ = make_inputs(seed=41)
    _, re_ref, _ = reference_readout(q, k, v, u, None, sw)
    for bs in (4, 128):  # several sparsity blocks, and one
        out = resolvent_attention(q, k, v, u, None, *sw, path="flex", block_q=bs)
        assert out.dtype == F64
        assert (out - re_ref).abs().max() <= 1e-12, bs
    dense = resolvent_attention(q, k, v, u, None, *sw, path="dense")
    assert (out - dense).abs().max() <= 1e-12


@pytest.mark.parametrize("sw", SWITCHES)
def test_flex_forward_float32_matches_dense(sw):
    q, k, v, u, _ = make_inputs(B=2, H=2, S=70, d=8, e=6, dtype=torch.float32, seed=11)
    ref = resolvent_attention(q.double(), k.double(), v.double(), u.double(), None, *sw, path="dense")
    scale = max(1.0, float(ref.abs().max()))
    out = resolvent_attention(q, k, v, u, None, *sw, path="flex", block_q=16)
    assert out.dtype == torch.float32
    assert (out.double() - ref).abs().max() <= 2e-5 * scale


def test_flex_keeps_precision_along_a_long_decay():
    # L reaches about -700: a float32 L would lose the bias to cancellation; the hi/lo split keeps it
    q, k, v, u, _ = make_inputs(B=1, H=2, S=300, d=4, e=3, dtype=torch.float32, seed=43, closed=(), unit=False)
    u = torch.full_like(u, 0.1)
    ref = resolvent_attention(q.double(), k.double(), v.double(), u.double(), None, 0.0, 1.0, 1.0, path="dense")
    out = resolvent_attention(q, k, v, u, None, 0.0, 1.0, 1.0, path="flex", block_q=64)
    # measured: 1.8e-7 with the split, 2.9e-6 with L rounded to float32
    assert (out.double() - ref).abs().max() <= 1e-6 * max(1.0, float(ref.abs().max()))


def test_flex_block_mask_lists_exactly_the_live_blocks():
    from drmlab.resolvent.flex import segment_block_mask

    S, bs = 37, 8
    start = torch.zeros(2, 3, S, dtype=torch.long)
    start[0, 0, 9:] = 9
    start[0, 1, 20:] = 20
    start[1, 2, 30:] = 33
    start[1, 2, 33:] = 33
    start[1, 0, 5:] = 5
    start[1, 0, 17:] = 17

    def live(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= start[b, h, q_idx])

    want = flex_attention_mod.create_block_mask(live, 2, 3, S, S, device="cpu", BLOCK_SIZE=bs)
    got = segment_block_mask(start, bs)
    assert torch.equal(got.to_dense(), want.to_dense())


def test_flex_path_refuses_what_it_cannot_do_on_cpu():
    q, k, v, u, th = make_inputs(B=1, H=2, S=12, seed=44)
    with pytest.raises(ValueError, match="phase-free"):
        resolvent_attention(q, k, v, u, th, 1.0, 1.0, 1.0, path="flex")
    ql = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="no backward on the CPU"):
        resolvent_attention(ql, k, v, u, None, 1.0, 1.0, 1.0, path="flex")
    with torch.no_grad():  # the forward alone is fine
        resolvent_attention(ql, k, v, u, None, 1.0, 1.0, 1.0, path="flex")
    # auto never takes flex on a CPU
    assert select_path(None, 1.0, 1.0, 1.0) == "flash"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (flex backward is GPU-only)")
def test_flex_on_cuda_forward_backward_and_auto():
    q, k, v, u, _ = make_inputs(B=2, H=2, S=300, d=16, e=16, dtype=torch.float32, seed=45)
    sw = (0.5, 0.7, 0.8)
    cuda = [t.cuda() for t in _leaves(q, k, v, u)]
    cpu64 = _leaves(q.double(), k.double(), v.double(), u.double())
    ref = resolvent_attention(*cpu64, None, *sw, path="dense")
    scale = max(1.0, float(ref.abs().max()))
    cuda = [t.detach().requires_grad_() for t in cuda]
    out = resolvent_attention(*cuda, None, *sw, path="auto")
    assert (out.double().cpu() - ref.detach()).abs().max() <= 2e-5 * scale
    w = torch.randn(ref.shape, dtype=F64)
    (ref * w).sum().backward()
    (out * w.float().cuda()).sum().backward()
    for a, b in zip(cuda, cpu64):
        gscale = max(1.0, float(b.grad.abs().max()))
        assert (a.grad.double().cpu() - b.grad).abs().max() <= 1e-4 * gscale
