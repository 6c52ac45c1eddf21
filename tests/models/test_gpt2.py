"""The GPT-2 baseline: parameter counts, seeding, the interface, and the next-token target."""

from __future__ import annotations

import pytest
import torch

from drmlab.models import build_model
from drmlab.models.gpt2 import PRESET_DIMS, GPT2Settings, closed_form_parameter_count
from drmlab.training import lm_loss


def _params(model):
    return sum(p.numel() for p in model.parameters())


def test_125m_parameter_count():
    with torch.device("meta"):
        model = build_model("GPT2", "125m", vocab_size=256)
    assert _params(model) == 126_080_640
    assert model.config.n_layer == 13 and model.config.n_head == 14 and model.config.n_embd == 896
    assert model.config.tie_word_embeddings and model.config.n_positions == 512
    assert closed_form_parameter_count(model.config) == 126_080_640


@pytest.mark.parametrize("preset", ["micro", "tiny", "small"])
def test_presets_match_j_within_3_percent(preset):
    with torch.device("meta"):
        j = _params(build_model("J", preset, vocab_size=256))
        g = build_model("GPT2", preset, vocab_size=256)
    assert abs(_params(g) / j - 1) <= 0.03, (preset, _params(g), j)
    assert closed_form_parameter_count(GPT2Settings(**PRESET_DIMS[preset])) == _params(g)


def test_seeded_init_and_interface():
    a = build_model("GPT2", "micro", seed=3)
    b = build_model("GPT2", "micro", seed=3)
    c = build_model("GPT2", "micro", seed=4)
    state = torch.get_rng_state()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.hf.transformer.wte.weight, c.hf.transformer.wte.weight)
    assert torch.equal(state, torch.get_rng_state())  # building leaves the global RNG alone
    assert a.model_name == "GPT2" and a.preset == "micro" and a.config.vocab_size == 256
    assert a.hf.lm_head.weight is a.hf.transformer.wte.weight  # tied
    tokens = torch.randint(0, 256, (2, 20))
    out = a(tokens, step=5)
    assert out.logits.shape == (2, 20, 256) and out.aux == {}
    a.train()
    assert torch.equal(a(tokens).logits, a(tokens, step=None).logits)  # no dropout: train == eval
    # causal: changing token 10 leaves logits[:, :10] alone
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    torch.testing.assert_close(a(changed).logits[:, :10], a(tokens).logits[:, :10])


def test_bad_overrides_and_lengths():
    with pytest.raises(ValueError, match="did you mean 'n_layer'"):
        build_model("GPT2", "micro", n_layers=3)
    model = build_model("GPT2", "micro", n_layer=1, n_positions=8)
    assert model.config.n_layer == 1
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        build_model("GPT2", "micro", n_head=5)


@pytest.mark.parametrize("name", ["GPT2", "LLAMA"])  # the two wrappers of models/layers/hf_causal_lm.py
def test_never_passes_labels_and_pins_the_next_token_target(monkeypatch, name):
    """HF given labels shifts them itself; pre-shifted labels would train on x_{t+2}."""
    model = build_model(name, "micro", seed=0)
    window = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(0))
    x, y = window[:, :-1], window[:, 1:]
    seen = []
    original = type(model.hf).forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("labels"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model.hf), "forward", spy)
    loss, ce = lm_loss(model, window, step=1)
    assert seen and all(label is None for label in seen)
    monkeypatch.undo()

    logits = model(x).logits
    by_hand = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
    torch.testing.assert_close(ce, by_hand)
    # HF's own loss with *unshifted* labels covers the first T-1 of our targets, identically.
    hf_right = model.hf(input_ids=x, labels=x).loss
    ours_first = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), y[:, :-1].reshape(-1))
    torch.testing.assert_close(hf_right, ours_first)
    # The reference's bug: labels already shifted are shifted again -> targets x_{t+2}.
    hf_double = model.hf(input_ids=x, labels=y).loss
    x_t2 = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), window[:, 2:].reshape(-1))
    torch.testing.assert_close(hf_double, x_t2)
    assert not torch.isclose(hf_double, ours_first)
