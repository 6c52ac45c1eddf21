"""The resolvent-attention language model and its controls (``docs/resolvent.md`` section 8)."""

import pytest
import torch

from drmlab.models import build_model
from drmlab.models.drm import build_config, closed_form_parameter_count

NAMES = ["RESOLVENT", "RESOLVENT_SOFTMAX", "RESOLVENT_ROPE"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("preset", ["micro", "tiny", "small", "125m"])
def test_parameters_matched_to_j(name, preset):
    with torch.device("meta"):
        model = build_model(name, preset=preset)
    count = sum(p.numel() for p in model.parameters())
    j = closed_form_parameter_count(build_config("J", preset))
    assert abs(count - j) / j < 0.03


@pytest.mark.parametrize("name", NAMES)
def test_prefix_causality(name):
    model = build_model(name, preset="micro", seed=1).double()
    tokens = torch.randint(0, 256, (2, 20))
    changed = tokens.clone()
    changed[:, 11:] = (changed[:, 11:] + 5) % 256
    with torch.no_grad():
        a, b = model(tokens).logits, model(changed).logits
    assert (a[:, :11] - b[:, :11]).abs().max() <= 1e-12
    assert (a[:, 11:] - b[:, 11:]).abs().max() > 0


def test_every_gate_parameter_and_switch_gets_gradient_at_init():
    model = build_model("RESOLVENT", preset="micro", seed=0, gate_phase=True)
    tokens = torch.randint(0, 256, (2, 24))
    logits = model(tokens).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), tokens[:, 1:].reshape(-1)).backward()
    for block in model.blocks:
        attn = block.mixer
        for name, p in [
            ("magnitude.weight", attn.gates.magnitude.weight),
            ("magnitude.bias", attn.gates.magnitude.bias),
            ("phase.weight", attn.gates.phase.weight),
            ("beta", attn.beta),
            ("qk", attn.qk),
            ("g", attn.g),
        ]:
            assert p.grad is not None and (p.grad != 0).all(), name


def test_clamp_gates_freeze_where_sigmoid_gates_do_not():
    """The reference's clamp parameterisation leaves gates at exactly 0 or 1 without gradient."""
    clamp = build_model("RESOLVENT", preset="micro", seed=0, gate_parameterisation="clamp")
    for block in clamp.blocks:  # the reference's bias-0 initialisation
        torch.nn.init.zeros_(block.mixer.gates.magnitude.bias)
        torch.nn.init.normal_(block.mixer.gates.magnitude.weight, std=1.0)
    x = clamp.embedding(torch.randint(0, 256, (2, 24)))
    u, _ = clamp.blocks[0].mixer.gates(clamp.blocks[0].ln1(x))
    frozen = ((u == 0) | (u == 1)).double().mean()
    assert frozen > 0.2


def test_bad_overrides():
    with pytest.raises(ValueError, match="did you mean 'n_head'"):
        build_model("RESOLVENT", preset="micro", n_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        build_model("RESOLVENT", preset="micro", n_head=3)
