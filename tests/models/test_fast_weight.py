"""The fast-weight memory of the DRM (``drmlab/models/drm/fast_weight.py``, ``docs/drm.md`` section
V) and the registry entry ASM_CM: counts, initialisation, the module against a float64 loop over
the section's equations, exact stepping and prefill with the memory active, causality, the
straight-through write gate, float32 state under autocast, and refused settings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drmlab.models import build_model, count_parameters
from drmlab.models.drm import build_config
from drmlab.models.drm.fast_weight import FastWeightMemory, straight_through_threshold

F64 = torch.float64


def active(model, seed=0):
    """Give the memory a live read-out (W_o = 0 at init makes it a no-op) and a write bias that
    writes about half the time."""
    g = torch.Generator().manual_seed(seed)
    memory = model.fast_weight_memory
    with torch.no_grad():
        weight = memory.read_out.weight
        weight.copy_(torch.randn(weight.shape, generator=g, dtype=weight.dtype))
        memory.gates.bias[1] = 0.2
    return model


def test_count_names_and_initialisation():
    with torch.device("meta"):
        model = build_model("ASM_CM", preset="125m")
    names = [n for n, _ in model.named_parameters() if n.startswith("fast_weight_memory.")]
    assert sum(p.numel() for n, p in model.named_parameters() if n in names) == 804_996
    assert count_parameters(model) == 84_011_396
    for durable, write_bias in ((True, 0.0), (False, -2.0)):
        memory = build_model("ASM_CM", preset="micro", fast_weight_durable=durable).fast_weight_memory
        assert (memory.read_out.weight == 0).all()
        assert memory.gates.bias[2] == 4.0 and memory.gates.bias[1] == write_bias
        assert memory.gates.out_features == (4 if durable else 3)


def test_at_initialisation_asm_cm_is_j_no_direction_bitwise():
    """W_o = 0 and separate seed streams: the untrained memory changes no logit."""
    tokens = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(0))
    a = build_model("ASM_CM", preset="micro", seed=4)(tokens).logits
    b = build_model("J_NO_DIRECTION", preset="micro", seed=4)(tokens).logits
    assert torch.equal(a, b)


def loop_reference(memory: FastWeightMemory, z, e):
    """Section V's equations one position at a time, from zero memory (float64)."""
    batch, length, _ = z.shape
    d = memory.d_key
    fast, slow = torch.zeros(batch, d, d, dtype=F64), torch.zeros(batch, d, d, dtype=F64)
    previous = torch.zeros(batch, e.shape[-1], dtype=F64)
    outputs = []

    def hard(gate):
        return (gate >= memory.threshold).to(F64) if memory.threshold > 0 else gate

    for t in range(length):
        h = torch.cat([z[:, t], e[:, t], previous], dim=-1)
        q = F.normalize(memory.key(e[:, t]), dim=-1, eps=1e-12)
        k = F.normalize(memory.key(previous), dim=-1, eps=1e-12)
        gates = torch.sigmoid(memory.gates(h))
        read = torch.einsum("bkv,bk->bv", fast, q)
        if memory.durable:
            read = read + memory.slow_read_scale * torch.einsum("bkv,bk->bv", slow, q)
        outputs.append(z[:, t] + memory.read_scale * gates[:, :1] * memory.read_out(read))
        v = torch.tanh(memory.value(torch.cat([z[:, t], e[:, t]], dim=-1)))
        write, retain = hard(gates[:, 1]), gates[:, 2]
        delta = k[:, :, None] * (v - torch.einsum("bkv,bk->bv", fast, k))[:, None, :]
        fast = retain[:, None, None] * fast + write[:, None, None] * delta
        if memory.durable:
            strength = memory.consolidation * write * hard(gates[:, 3])
            slow = (
                slow + strength[:, None, None] * k[:, :, None] * (v - torch.einsum("bkv,bk->bv", slow, k))[:, None, :]
            )
        previous = e[:, t]
    return torch.stack(outputs, dim=1), fast, slow


@pytest.mark.parametrize("settings", [{}, {"fast_weight_durable": False}, {"fast_weight_write_threshold": 0.0}])
def test_memory_equals_a_loop_over_the_equations(settings):
    model = active(build_model("ASM_CM", preset="micro", seed=1, **settings)).double()
    memory = model.fast_weight_memory
    g = torch.Generator().manual_seed(2)
    z, e = torch.randn(2, 13, 16, generator=g, dtype=F64), torch.randn(2, 13, 16, generator=g, dtype=F64)
    e[:, 6] = e[:, 2]  # a repeated token: its key meets an earlier write
    with torch.no_grad():
        first, state = memory(z[:, :5], z[:, :5], e[:, :5], memory.init_state(2, z))
        second, state = memory(z[:, 5:], z[:, 5:], e[:, 5:], state)  # the memory crosses the call
        want, fast, slow = loop_reference(memory, z, e)
    assert (torch.cat([first, second], dim=1) - want).abs().max() <= 1e-12
    assert (state.fast - fast).abs().max() <= 1e-12
    assert (first - z[:, :5]).abs().max() > 1e-3  # the read is live
    if memory.durable:
        assert (state.slow - slow).abs().max() <= 1e-12 and slow.abs().max() > 0
    else:
        assert state.slow is None


def _stepped(model, tokens):
    state, logits = model.init_state(tokens.shape[0]), []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], state)
        logits.append(out)
    return torch.stack(logits, dim=1), state


def _memory(state):
    """The fast-weight memory's entry of a decoding state: the model's last stage."""
    return state.stages[-1]


def _state_bytes(state):
    memory = _memory(state)
    tensors = [state.z_start, memory.fast, memory.slow, memory.previous_token]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_stepping_and_prefill_equal_the_parallel_forward_with_the_memory_live():
    """float64, 1e-10: stepping reproduces the parallel logits across blocks (micro blocks are 8),
    the parallel pass's state equals the stepped one, and the memory's state has one size at
    every length."""
    model = active(build_model("ASM_CM", preset="micro", seed=3)).double().eval()
    assert model.stages[-1].name == "fast_weight_memory"
    tokens = torch.randint(0, 256, (2, 29), generator=torch.Generator().manual_seed(1))
    tokens[:, 20:24] = tokens[:, 3:7]  # repeats across blocks
    with torch.no_grad():
        parallel = model(tokens)
        stepped, state = _stepped(model, tokens)
        assert (parallel.logits - stepped).abs().max() <= 1e-10
        assert (
            parallel.logits - build_model("J_NO_DIRECTION", preset="micro", seed=3).double()(tokens).logits
        ).abs().max() > 1e-3
        for length in (5, 16, 29):  # mid-block, on a block edge, past three
            prefilled = model(tokens[:, :length], return_state=True).state
            _, reached = _stepped(model, tokens[:, :length])
            for name in ("fast", "slow", "previous_token"):
                want = getattr(_memory(reached), name)
                assert (getattr(_memory(prefilled), name) - want).abs().max() <= 1e-10, (length, name)
            assert _state_bytes(prefilled) == _state_bytes(state)


def test_causality_with_the_memory_live():
    model = active(build_model("ASM_CM", preset="micro", seed=2)).double()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 21), generator=g)
    base = model(tokens).logits
    for t in (0, 7, 8, 15):
        changed = tokens.clone()
        changed[:, t + 1 :] = torch.randint(0, 256, changed[:, t + 1 :].shape, generator=g)
        out = model(changed).logits
        assert (out[:, : t + 1] - base[:, : t + 1]).abs().max() <= 1e-12
        assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 0


def test_straight_through_write_gate():
    gate = torch.tensor([0.1, 0.5, 0.7, 0.4999], dtype=F64, requires_grad=True)
    hard = straight_through_threshold(gate, 0.5)
    assert hard.tolist() == [0.0, 1.0, 1.0, 0.0]
    hard.sum().backward()
    assert gate.grad.tolist() == [1.0] * 4
    assert straight_through_threshold(gate, 0.0) is gate
    # through the model: every memory parameter gets a gradient (the hard gates' biases included)
    model = active(build_model("ASM_CM", preset="micro", seed=5))
    model(torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(3))).logits.square().mean().backward()
    for name, p in model.fast_weight_memory.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_float32_state_and_compute_under_bf16_autocast():
    model = active(build_model("ASM_CM", preset="micro", seed=6))
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, return_state=True)
        _, stepped = model.step(tokens[:, 0], model.init_state(2))
    for state in (_memory(out.state), _memory(stepped)):
        assert state.fast.dtype == state.slow.dtype == state.previous_token.dtype == torch.float32
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(fast_weight_dim=0), "fast_weight_dim must be a positive integer"),
        (dict(fast_weight_write_threshold=1.0), "fast_weight_write_threshold must be in"),
        (dict(fast_weight_consolidation=-0.1), "fast_weight_consolidation must be"),
        (dict(fast_weight_read_scale=float("nan")), "fast_weight_read_scale must be"),
        (
            dict(sequence_mode="recurrent", mixer="none", token_state_residual=False, selective_memory=False),
            "needs sequence_mode='block_cumsum'",
        ),
    ],
)
def test_bad_settings_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_config("ASM_CM", "micro", **overrides)
