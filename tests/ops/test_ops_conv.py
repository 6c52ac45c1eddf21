"""causal_depthwise_conv1d and its step form (drmlab.ops.conv)."""

import pytest
import torch

from drmlab.ops import causal_depthwise_conv1d, causal_depthwise_conv1d_step
from drmlab.ops.conv import causal_depthwise_conv1d_reference as conv_reference
from drmlab.ops.fusion import plain_reference


def loop_conv64(x, weight, bias, dilation):
    """Explicit float64 loop: y[t] = bias + sum_j w[c, 0, j] * x[t - (K-1-j) * dilation]."""
    x = x.double()
    w = weight.double()
    B, T, C = x.shape
    K = w.shape[-1]
    y = torch.zeros(B, T, C, dtype=torch.float64)
    for t in range(T):
        for j in range(K):
            s = t - (K - 1 - j) * dilation
            if s >= 0:
                y[:, t] += w[:, 0, j] * x[:, s]
    if bias is not None:
        y += bias.double()
    return y


def make(B=2, T=23, C=5, K=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=dtype)
    w = torch.randn(C, 1, K, generator=g, dtype=dtype)
    b = torch.randn(C, generator=g, dtype=dtype)
    return x, w, b


@pytest.mark.parametrize("dilation", [1, 2, 4])
@pytest.mark.parametrize("K", [1, 3, 4])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_loop(dilation, K, with_bias):
    x, w, b = make(K=K)
    b = b if with_bias else None
    y = causal_depthwise_conv1d(x, w, b, dilation)
    assert y.shape == x.shape
    assert (y - loop_conv64(x, w, b, dilation)).abs().max().item() <= 1e-12


@pytest.mark.parametrize("dilation", [1, 2, 4])
def test_matches_torch_conv1d_with_left_padding(dilation):
    x, w, b = make(C=6, K=3, dtype=torch.float32)
    conv = torch.nn.Conv1d(6, 6, 3, groups=6, dilation=dilation, padding=0)
    with torch.no_grad():
        conv.weight.copy_(w)
        conv.bias.copy_(b)
        ref = conv(torch.nn.functional.pad(x.transpose(1, 2), (dilation * 2, 0))).transpose(1, 2)
    assert torch.allclose(causal_depthwise_conv1d(x, w, b, dilation), ref, atol=1e-5)


@pytest.mark.parametrize("dilation", [1, 2, 4])
def test_causality_exact(dilation):
    x, w, b = make(T=30)
    y = causal_depthwise_conv1d(x, w, b, dilation)
    for t in (0, 7, 29):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :]) * 1e6
        y2 = causal_depthwise_conv1d(x2, w, b, dilation)
        assert torch.equal(y[:, : t + 1], y2[:, : t + 1])
    # gradient of output t reaches inputs <= t only
    xr = x.clone().requires_grad_()
    causal_depthwise_conv1d(xr, w, b, dilation)[:, 10].sum().backward()
    assert torch.count_nonzero(xr.grad[:, 11:]) == 0


@pytest.mark.parametrize("dilation", [1, 2, 4])
@pytest.mark.parametrize("K", [1, 4])
def test_step_equals_parallel(dilation, K):
    x, w, b = make(T=19, K=K)
    y = causal_depthwise_conv1d(x, w, b, dilation)
    ctx = torch.zeros(x.shape[0], dilation * (K - 1), x.shape[2], dtype=x.dtype)
    outs = []
    for t in range(x.shape[1]):
        yt, ctx = causal_depthwise_conv1d_step(x[:, t], ctx, w, b, dilation)
        assert ctx.shape == (x.shape[0], dilation * (K - 1), x.shape[2])
        outs.append(yt)
    assert (torch.stack(outs, 1) - y).abs().max().item() <= 1e-12
    # None context means zeros
    y0, _ = causal_depthwise_conv1d_step(x[:, 0], None, w, b, dilation)
    assert torch.allclose(y0, y[:, 0], atol=1e-12)


def test_gradients():
    x, w, b = make(T=8, C=3, K=3)
    args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())
    assert torch.autograd.gradcheck(lambda x, w, b: causal_depthwise_conv1d(x, w, b, 2), args)


def test_float32_and_bad_shapes():
    x, w, b = make(dtype=torch.float32)
    y = causal_depthwise_conv1d(x, w, b)
    assert y.dtype == torch.float32
    with pytest.raises(ValueError):
        causal_depthwise_conv1d(x, w[:3], b)
    with pytest.raises(ValueError):
        causal_depthwise_conv1d(x[0], w, b)
    with pytest.raises(ValueError):
        causal_depthwise_conv1d_step(x[:, 0], torch.zeros(2, 5, 5), w, b)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so +0.0 and -0.0 differ)."""
    return t.detach().contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def grads_of(conv, x, w, b, dilation, upstream):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    y = conv(leaves[0], leaves[1], leaves[2] if b is not None else None, dilation)
    y.backward(upstream)
    return y, [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("T", "K", "dilation"), [(23, 4, 1), (23, 3, 2), (9, 4, 4), (5, 8, 1), (6, 1, 1), (1, 4, 2)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("flat_weight", [False, True])
def test_fast_backward_equals_reference_bit_for_bit(dtype, T, K, dilation, with_bias, flat_weight):
    """The Function's forward and every gradient equal autograd through the reference, to the bit
    (signed zeros included: the upstream gradient has exact zeros and the taps both signs)."""
    x, w, b = make(T=T, K=K, dtype=dtype, seed=T + K)
    w = w[:, 0] if flat_weight else w  # [C, K] is accepted too (the selective SSM's layout)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    upstream[:, ::3] = 0.0
    upstream[0, 1::4] = -0.0
    b = b if with_bias else None
    with plain_reference():  # the torch Function; the fused C path is held to a tolerance below
        y_fast, g_fast = grads_of(causal_depthwise_conv1d, x, w, b, dilation, upstream)
    y_ref, g_ref = grads_of(conv_reference, x, w, b, dilation, upstream)
    assert torch.equal(bits(y_fast), bits(y_ref))
    for fast, ref in zip(g_fast, g_ref):
        assert fast.shape == ref.shape
        assert torch.equal(bits(fast), bits(ref))


FUSED_TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("T", "K", "dilation"), [(23, 4, 1), (23, 3, 2), (9, 4, 4), (5, 8, 1), (6, 1, 1), (1, 4, 2)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_kernels_equal_the_reference_to_round_off(dtype, T, K, dilation, with_bias):
    """The C kernels (forward, input, taps and bias gradients) within 1e-5 (float32) / 1e-12 (float64)
    relative of autograd through the reference, at kernels longer than the sequence and dilations past it."""
    x, w, b = make(T=T, K=K, dtype=dtype, seed=T + K)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    b = b if with_bias else None
    y_fused, g_fused = grads_of(causal_depthwise_conv1d, x, w, b, dilation, upstream)
    assert y_fused.grad_fn.name() == "_FusedCausalDepthwiseConvBackward"
    y_ref, g_ref = grads_of(conv_reference, x, w, b, dilation, upstream)
    for fused, ref in zip((y_fused, *g_fused), (y_ref, *g_ref)):
        assert fused.shape == ref.shape
        assert float((fused - ref).abs().max()) <= FUSED_TOL[dtype] * float(ref.abs().max())


def test_fused_kernels_gradcheck_and_double_backward():
    x, w, b = make(T=7, C=3, K=3)
    args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())
    assert causal_depthwise_conv1d(*args, 2).grad_fn.name() == "_FusedCausalDepthwiseConvBackward"
    assert torch.autograd.gradcheck(lambda x, w, b: causal_depthwise_conv1d(x, w, b, 2), args)
    assert torch.autograd.gradgradcheck(lambda x, w, b: causal_depthwise_conv1d(x, w, b, 2), args)


@plain_reference()
def test_fast_backward_gradcheck_and_graph():
    x, w, b = make(T=7, C=3, K=3)
    args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())
    assert torch.autograd.gradcheck(lambda x, w, b: causal_depthwise_conv1d(x, w, b, 2), args)
    assert torch.autograd.gradgradcheck(lambda x, w, b: causal_depthwise_conv1d(x, w, b, 2), args)
    assert causal_depthwise_conv1d(*args, 2).grad_fn.name() == "_CausalDepthwiseConvBackward"
    with torch.no_grad():  # without gradients: the reference's ops, the same values
        assert torch.equal(causal_depthwise_conv1d(*args, 2), conv_reference(*args, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel, dilation", [(2, 1), (4, 1), (8, 1), (3, 2), (4, 3)])
@pytest.mark.parametrize("batch, channels", [(1, 128), (2, 12), (3, 5)])
def test_step_by_partial_sums_is_the_step_bit_for_bit(dtype, kernel, dilation, batch, channels):
    """The partial-sum step gives the context step's outputs to the bit (signed zeros included),
    from a zero context and from a random one, and its state is the replay of the context's."""
    from drmlab.ops.conv import causal_depthwise_conv1d_partials, causal_depthwise_conv1d_step_partials, conv_step_taps

    g = torch.Generator().manual_seed(kernel * 10 + dilation)
    weight = torch.randn(channels, 1, kernel, generator=g, dtype=dtype)
    bias = torch.randn(channels, generator=g, dtype=dtype)
    taps = conv_step_taps(weight, dtype)
    length = dilation * (kernel - 1)
    for context in (
        torch.zeros(batch, length, channels, dtype=dtype),
        torch.randn(batch, length, channels, generator=g, dtype=dtype),
    ):
        partials = causal_depthwise_conv1d_partials(context, taps, dilation)
        for t in range(3 * length + 2):
            x = torch.randn(batch, channels, generator=g, dtype=dtype)
            x[:, : channels // 3] = 0.0 if t % 2 else -0.0  # zero products of both signs
            want, context = causal_depthwise_conv1d_step(x, context, weight, bias, dilation=dilation)
            got, partials = causal_depthwise_conv1d_step_partials(x, partials, taps, bias, dilation)
            assert torch.equal(bits(got), bits(want)), t
            assert torch.equal(bits(partials), bits(causal_depthwise_conv1d_partials(context, taps, dilation)))
