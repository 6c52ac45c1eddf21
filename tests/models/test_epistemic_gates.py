"""The epistemic gates of the fast-weight memory (``drmlab/models/drm/epistemic.py``, ``docs/drm.md``
section V.4) and the registry entry ASM_CM_E: counts (upstream's 85,208,200 at 125m), initialisation,
the gated memory against a float64 loop over the section's equations, the neutral setting (every
confidence exactly 1) reproducing ASM_CM bit for bit, exact stepping and prefill with the gates live,
the confidence statistics, gradients, precision, dropout and refused settings."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drmlab.models import build_model, count_parameters
from drmlab.models.drm import build_config, closed_form_parameter_count
from drmlab.models.drm.epistemic import FACTORS

F64 = torch.float64


def live(model, seed=0, neutral=False):
    """Give the memory a live read-out (W_o = 0 at init makes it a no-op), a write bias that writes
    about half the time, and confidences that vary with the input (their last layers are zero at
    init).  ``neutral``: every confidence exactly 1 instead (sigmoid(50) rounds to 1 in float32 and
    float64; the last weights stay zero)."""
    g = torch.Generator().manual_seed(seed)
    memory = model.fast_weight_memory
    with torch.no_grad():
        weight = memory.read_out.weight
        weight.copy_(torch.randn(weight.shape, generator=g, dtype=weight.dtype))
        memory.gates.bias[1] = 0.2
        if memory.confidence is not None:
            for factor in memory.confidence.factors.values():
                if neutral:
                    factor.out.bias.fill_(50.0)
                else:
                    out = factor.out.weight
                    out.copy_(torch.randn(out.shape, generator=g, dtype=out.dtype))
                    factor.out.bias.fill_(0.5)
    return model


def confidence_reference(factor, h):
    """One factor q(h) written out: hidden ReLU layers, a linear unit, a sigmoid (float64)."""
    x = h
    for layer in factor.hidden:
        x = torch.relu(x @ layer.weight.T + layer.bias)
    return torch.sigmoid(x @ factor.out.weight.T + factor.out.bias)[..., 0]


def loop_reference(memory, z, e):
    """Section V.1 with V.4's gates, one position at a time, from zero memory (float64): the outputs,
    the final fast and slow matrices and the confidences (c^r, c^w) [B, L]."""
    batch, length, _ = z.shape
    d = memory.d_key
    fast, slow = torch.zeros(batch, d, d, dtype=F64), torch.zeros(batch, d, d, dtype=F64)
    previous = torch.zeros(batch, e.shape[-1], dtype=F64)
    outputs, read_confidences, write_confidences = [], [], []
    factors = memory.confidence.factors

    def hard(gate):
        return (gate >= memory.threshold).to(F64) if memory.threshold > 0 else gate

    for t in range(length):
        h = torch.cat([z[:, t], e[:, t], previous], dim=-1)
        q = F.normalize(e[:, t] @ memory.key.weight.T, dim=-1, eps=1e-12)
        k = F.normalize(previous @ memory.key.weight.T, dim=-1, eps=1e-12)
        gates = torch.sigmoid(h @ memory.gates.weight.T + memory.gates.bias)
        c_read = (confidence_reference(factors["read_loc"], h) * confidence_reference(factors["read_cons"], h)).clamp(
            0, 1
        )
        c_write = (
            confidence_reference(factors["write_loc"], h) * confidence_reference(factors["write_cons"], h)
        ).clamp(0, 1)
        read = torch.einsum("bkv,bk->bv", fast, q)
        if memory.durable:
            read = read + memory.slow_read_scale * torch.einsum("bkv,bk->bv", slow, q)
        read_gate = gates[:, 0] * c_read
        outputs.append(z[:, t] + memory.read_scale * read_gate[:, None] * (read @ memory.read_out.weight.T))
        v = torch.tanh(torch.cat([z[:, t], e[:, t]], dim=-1) @ memory.value.weight.T + memory.value.bias)
        write, retain = hard(gates[:, 1]) * c_write, gates[:, 2]
        fast = (
            retain[:, None, None] * fast
            + write[:, None, None] * k[:, :, None] * (v - torch.einsum("bkv,bk->bv", fast, k))[:, None, :]
        )
        if memory.durable:
            strength = memory.consolidation * write * hard(gates[:, 3])
            slow = (
                slow + strength[:, None, None] * k[:, :, None] * (v - torch.einsum("bkv,bk->bv", slow, k))[:, None, :]
            )
        previous = e[:, t]
        read_confidences.append(c_read)
        write_confidences.append(c_write)
    return (
        torch.stack(outputs, dim=1),
        fast,
        slow,
        (torch.stack(read_confidences, dim=1), torch.stack(write_confidences, dim=1)),
    )


# ------------------------------------------------------------------ counts and initialisation
def test_count_at_125m_is_upstreams():
    """Upstream's ASM-CM-E at 125m: 85,208,200 = ASM_CM's 84,011,396 + four MLPs of
    (4608 + 1) 64 + 65 x 64 + 65 = 299,201 each (h_t has d_state + 2 d_token = 4,608 inputs)."""
    with torch.device("meta"):
        model = build_model("ASM_CM_E", preset="125m")
    gates = [p for n, p in model.named_parameters() if n.startswith("fast_weight_memory.confidence.")]
    assert sum(p.numel() for p in gates) == 4 * ((4608 + 1) * 64 + 65 * 64 + 65) == 1_196_804
    assert count_parameters(model) == closed_form_parameter_count(model.config) == 85_208_200
    assert count_parameters(model) - 1_196_804 == 84_011_396  # ASM_CM


@pytest.mark.parametrize("preset, total", [("micro", 51_824), ("tiny", 952_456), ("small", 8_130_264)])
def test_counts_at_our_presets(preset, total):
    """The counts docs/drm.md section V.4 prints; the gates keep upstream's 64 hidden units at every preset."""
    model = build_model("ASM_CM_E", preset=preset) if preset == "micro" else None
    if model is None:
        with torch.device("meta"):
            model = build_model("ASM_CM_E", preset=preset)
    assert count_parameters(model) == closed_form_parameter_count(model.config) == total
    for layers, hidden in ((1, 16), (3, 32)):  # the closed form follows the depth and width
        with torch.device("meta"):
            other = build_model(
                "ASM_CM_E", preset=preset, fast_weight_confidence_layers=layers, fast_weight_confidence_hidden=hidden
            )
        assert count_parameters(other) == closed_form_parameter_count(other.config)


def test_initialisation_and_seed_streams():
    model = build_model("ASM_CM_E", preset="micro", seed=4)
    factors = model.fast_weight_memory.confidence.factors
    assert tuple(factors) == FACTORS
    for factor in factors.values():
        assert len(factor.hidden) == 2 and factor.hidden[0].in_features == 16 + 2 * 16
        assert (factor.out.weight == 0).all()
        assert factor.out.bias.item() == pytest.approx(math.log(math.sqrt(0.9) / (1 - math.sqrt(0.9))))
    out = model(torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(0)))
    for key in ("fast_weight_read_confidence", "fast_weight_write_confidence"):
        assert out.aux[key].shape == (2, 19)
        assert (out.aux[key] - 0.9).abs().max() <= 1e-6
    # every parameter but the gates' is ASM_CM's, drawn the same (the gates are built last)
    base = dict(build_model("ASM_CM", preset="micro", seed=4).named_parameters())
    own = dict(model.named_parameters())
    assert set(own) - set(base) == {n for n in own if n.startswith("fast_weight_memory.confidence.")}
    for name, p in base.items():
        assert torch.equal(p, own[name]), name


def test_at_initialisation_asm_cm_e_is_j_no_direction_bitwise():
    """W_o = 0: whatever the confidences, the untrained memory changes no logit."""
    tokens = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(0))
    a = build_model("ASM_CM_E", preset="micro", seed=4)(tokens).logits
    b = build_model("J_NO_DIRECTION", preset="micro", seed=4)(tokens).logits
    assert torch.equal(a, b)


# ------------------------------------------------------------------ the equations
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"fast_weight_durable": False},
        {"fast_weight_write_threshold": 0.0},
        {"fast_weight_confidence_layers": 1, "fast_weight_confidence_hidden": 8},
        {"fast_weight_confidence_layers": 3},
    ],
)
def test_gated_memory_equals_a_loop_over_the_equations(settings):
    model = live(build_model("ASM_CM_E", preset="micro", seed=1, **settings)).double()
    memory = model.fast_weight_memory
    g = torch.Generator().manual_seed(2)
    z, e = torch.randn(2, 13, 16, generator=g, dtype=F64), torch.randn(2, 13, 16, generator=g, dtype=F64)
    e[:, 6] = e[:, 2]  # a repeated token: its key meets an earlier write
    with torch.no_grad():
        first, state, c_first = memory(z[:, :5], z[:, :5], e[:, :5], memory.init_state(2, z), return_confidence=True)
        second, state, c_second = memory(z[:, 5:], z[:, 5:], e[:, 5:], state, return_confidence=True)
        want, fast, slow, (c_read, c_write) = loop_reference(memory, z, e)
    assert (torch.cat([first, second], dim=1) - want).abs().max() <= 1e-12
    assert (state.fast - fast).abs().max() <= 1e-12
    assert (torch.cat([c_first[0], c_second[0]], dim=1) - c_read).abs().max() <= 1e-14
    assert (torch.cat([c_first[1], c_second[1]], dim=1) - c_write).abs().max() <= 1e-14
    assert c_read.std() > 1e-3 and c_write.std() > 1e-3  # the confidences vary: the test can see them
    assert (first - z[:, :5]).abs().max() > 1e-3  # the read is live
    if memory.durable:
        assert (state.slow - slow).abs().max() <= 1e-12 and slow.abs().max() > 0
    else:
        assert state.slow is None
    # the gates matter: the same memory with every confidence 1 gives other outputs
    with torch.no_grad():
        for factor in memory.confidence.factors.values():
            factor.out.weight.zero_()
            factor.out.bias.fill_(50.0)
        ungated, _ = memory(z, z, e, memory.init_state(2, z))
    assert (ungated - want).abs().max() > 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_neutral_gates_reproduce_asm_cm_bitwise(dtype):
    """Every confidence exactly 1: ASM_CM_E with ASM_CM's weights gives ASM_CM's logits, stepped
    logits, memory state and gradients bit for bit."""
    gated = live(build_model("ASM_CM_E", preset="micro", seed=3), neutral=True).to(dtype)
    plain = build_model("ASM_CM", preset="micro", seed=3).to(dtype)
    missing, unexpected = plain.load_state_dict(gated.state_dict(), strict=False)
    assert not missing and all(k.startswith("fast_weight_memory.confidence.") for k in unexpected)
    tokens = torch.randint(0, 256, (2, 29), generator=torch.Generator().manual_seed(1))
    tokens[:, 20:24] = tokens[:, 3:7]
    out_gated, out_plain = gated(tokens, return_state=True), plain(tokens, return_state=True)
    assert torch.equal(out_gated.logits, out_plain.logits)
    assert (out_gated.aux["fast_weight_read_confidence"] == 1).all()
    assert (out_gated.aux["fast_weight_write_confidence"] == 1).all()
    for name in ("fast", "slow", "previous_token"):
        assert torch.equal(getattr(out_gated.state.stages[-1], name), getattr(out_plain.state.stages[-1], name))
    assert (
        out_plain.logits - build_model("J_NO_DIRECTION", preset="micro", seed=3).to(dtype)(tokens).logits
    ).abs().max() > 1e-3
    out_gated.logits.square().mean().backward()
    out_plain.logits.square().mean().backward()
    grads = dict(plain.named_parameters())
    for name, p in gated.named_parameters():
        if name in grads:
            assert torch.equal(p.grad, grads[name].grad), name
    with torch.no_grad():
        state_g, state_p = gated.init_state(2), plain.init_state(2)
        for t in range(12):
            logits_g, state_g = gated.step(tokens[:, t], state_g)
            logits_p, state_p = plain.step(tokens[:, t], state_p)
            assert torch.equal(logits_g, logits_p), t


# ------------------------------------------------------------------ decoding
def _stepped(model, tokens):
    state, logits = model.init_state(tokens.shape[0]), []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], state)
        logits.append(out)
    return torch.stack(logits, dim=1), state


def _state_bytes(state):
    memory = state.stages[-1]
    tensors = [state.z_start, memory.fast, memory.slow, memory.previous_token]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_stepping_and_prefill_equal_the_parallel_forward_with_the_gates_live():
    """float64, 1e-10, across blocks (micro blocks are 8): stepping reproduces the parallel logits, the
    parallel pass's state equals the stepped one mid-block, on an edge and past three blocks, and the
    gates add nothing to the decoding state (ASM_CM's size)."""
    model = live(build_model("ASM_CM_E", preset="micro", seed=3)).double().eval()
    tokens = torch.randint(0, 256, (2, 29), generator=torch.Generator().manual_seed(1))
    tokens[:, 20:24] = tokens[:, 3:7]  # repeats across blocks
    with torch.no_grad():
        parallel = model(tokens)
        stepped, state = _stepped(model, tokens)
        assert (parallel.logits - stepped).abs().max() <= 1e-10
        plain = build_model("ASM_CM", preset="micro", seed=3).double()
        plain.load_state_dict(model.state_dict(), strict=False)
        assert (parallel.logits - plain(tokens).logits).abs().max() > 1e-4  # the gates are live
        for length in (5, 16, 29):
            prefilled = model(tokens[:, :length], return_state=True).state
            _, reached = _stepped(model, tokens[:, :length])
            for name in ("fast", "slow", "previous_token"):
                want = getattr(reached.stages[-1], name)
                assert (getattr(prefilled.stages[-1], name) - want).abs().max() <= 1e-10, (length, name)
            assert _state_bytes(prefilled) == _state_bytes(state) == _state_bytes(plain.init_state(2))


def test_confidence_statistics_match_the_loop():
    """aux's per-position confidences are the memory's (c^r, c^w) at the block path's states.  With
    W_o = 0 the read adds exactly nothing, so the model's output states are the memory's inputs."""
    model = live(build_model("ASM_CM_E", preset="micro", seed=5)).double()
    model.fast_weight_memory.read_out.weight.data.zero_()
    tokens = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(tokens)
        states, _ = model.states(tokens)
        _, _, _, (c_read, c_write) = loop_reference(model.fast_weight_memory, states, model.embedding(tokens))
    assert (out.aux["fast_weight_read_confidence"] - c_read).abs().max() <= 1e-12
    assert (out.aux["fast_weight_write_confidence"] - c_write).abs().max() <= 1e-12
    assert c_read.std() > 1e-3
    assert "fast_weight_read_confidence" not in build_model("ASM_CM", preset="micro")(tokens).aux


# ------------------------------------------------------------------ training, precision, dropout
def test_every_gate_parameter_gets_a_gradient():
    """Through the read gate and the straight-through write gate, every confidence layer learns."""
    model = live(build_model("ASM_CM_E", preset="micro", seed=5))
    model(torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(3))).logits.square().mean().backward()
    for name, p in model.fast_weight_memory.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_float32_confidences_under_bf16_autocast():
    model = live(build_model("ASM_CM_E", preset="micro", seed=6))
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, return_state=True)
    assert out.aux["fast_weight_read_confidence"].dtype == torch.float32
    assert out.state.stages[-1].fast.dtype == torch.float32
    assert torch.isfinite(out.logits).all()


def test_dropout_acts_in_training_only():
    tokens = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(5))
    dropped = live(build_model("ASM_CM_E", preset="micro", seed=7, fast_weight_confidence_dropout=0.5))
    plain = live(build_model("ASM_CM_E", preset="micro", seed=7))
    with torch.no_grad():
        assert torch.equal(dropped.eval()(tokens).logits, plain.eval()(tokens).logits)
        torch.manual_seed(0)
        trained = dropped.train()(tokens).logits
    assert (trained - plain(tokens).logits).abs().max() > 1e-6


# ------------------------------------------------------------------ refused settings
@pytest.mark.parametrize(
    "variant, overrides, match",
    [
        (
            "J_NO_DIRECTION",
            dict(fast_weight_epistemic_gates=True),
            "fast_weight_epistemic_gates .* needs fast_weight_memory",
        ),
        ("ASM_CM", dict(fast_weight_epistemic_gates=True, fast_weight_memory=False), "needs fast_weight_memory=True"),
        ("ASM_CM_E", dict(fast_weight_confidence_hidden=0), "fast_weight_confidence_hidden must be a positive integer"),
        ("ASM_CM_E", dict(fast_weight_confidence_hidden=True), "fast_weight_confidence_hidden must be a positive"),
        ("ASM_CM_E", dict(fast_weight_confidence_layers=0), "fast_weight_confidence_layers must be a positive integer"),
        ("ASM_CM_E", dict(fast_weight_confidence_dropout=1.0), r"fast_weight_confidence_dropout must be in \[0, 1\)"),
        ("ASM_CM_E", dict(fast_weight_confidence_dropout=-0.1), "fast_weight_confidence_dropout must be in"),
        ("ASM_CM_E", dict(fast_weight_confidence_initial=1.0), r"fast_weight_confidence_initial must be in \(0, 1\)"),
        ("ASM_CM_E", dict(fast_weight_confidence_initial=0.0), "fast_weight_confidence_initial must be in"),
        ("ASM_CM_E", dict(fast_weight_confidence_initial=float("nan")), "fast_weight_confidence_initial must be in"),
    ],
)
def test_bad_settings_are_refused_in_one_line(variant, overrides, match):
    with pytest.raises(ValueError, match=match) as info:
        build_config(variant, "micro", **overrides)
    assert "\n" not in str(info.value)


def test_gate_settings_are_inert_without_the_gates():
    """ASM_CM ignores the confidence settings (they describe modules it does not build)."""
    config = build_config("ASM_CM", "micro", fast_weight_confidence_hidden=0)
    assert closed_form_parameter_count(config) == closed_form_parameter_count(build_config("ASM_CM", "micro"))


def test_geometry_report_gives_the_mean_confidences():
    """The sampled evaluation's diagnostics (geometry_report) carry the mean c^r and c^w."""
    from drmlab.models.drm.diagnostics import geometry_report

    model = live(build_model("ASM_CM_E", preset="micro", seed=5)).eval()
    tokens = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(2))
    report = geometry_report(model, tokens)
    with torch.no_grad():
        aux = model(tokens).aux
    assert report["fast_weight_read_confidence_mean"] == pytest.approx(float(aux["fast_weight_read_confidence"].mean()))
    assert report["fast_weight_write_confidence_mean"] == pytest.approx(
        float(aux["fast_weight_write_confidence"].mean())
    )
    assert "fast_weight_read_confidence_mean" not in geometry_report(build_model("ASM_CM", preset="micro"), tokens)
