"""``model(tokens, logits_at=mask)`` (``drmlab/models/inputs.py``): the head applied at the marked
positions only gives the full forward's logits at those positions, in row-major order, for every
registered model, in float64 (to 1e-12: the head's matrix product over fewer rows may round
differently) and with the gradient of a loss scored there equal to the full forward's; a bad mask
is refused with the one input error."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from drmlab.models import ModelInputError, build_model, list_models

MODELS = list_models()


@functools.cache
def micro64(name: str):
    return build_model(name, "micro", seed=0).double().eval()


def _inputs(model, batch: int = 2):
    length = min(19, getattr(model.config, "max_seq_len", None) or getattr(model.config, "n_positions", 19))
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.config.vocab_size, (batch, length), generator=g)
    mask = torch.rand(batch, length, generator=g) < 0.3
    mask[0, -1] = mask[1, 0] = True  # both ends of the sequence, never empty
    return tokens, mask


@pytest.mark.parametrize("name", MODELS)
def test_logits_at_equals_the_full_logits_there(name):
    model = micro64(name)
    tokens, mask = _inputs(model)
    full = model(tokens).logits
    part = model(tokens, logits_at=mask).logits
    assert part.shape == (int(mask.sum()), model.config.vocab_size)
    torch.testing.assert_close(part, full[mask], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_a_loss_at_the_marked_positions_has_the_full_gradient(name):
    model = build_model(name, "micro", seed=0).double().train()
    tokens, mask = _inputs(model)
    targets = torch.randint(0, model.config.vocab_size, tokens.shape, generator=torch.Generator().manual_seed(5))
    grads = []
    for at in (None, mask):
        model.zero_grad()
        out = model(tokens, step=3, logits_at=at).logits
        logits = out[mask] if at is None else out
        F.cross_entropy(logits, targets[mask]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=0, atol=1e-11, msg=key)


@pytest.mark.parametrize("name", MODELS)
def test_a_bad_mask_is_refused_naming_the_model(name):
    model = micro64(name)
    tokens, mask = _inputs(model)
    for bad, pattern in (
        (mask.long(), "boolean"),
        (mask[:, :-1], r"has shape \(2, \d+\), the tokens have shape"),
        ([[True]], "boolean"),
    ):
        with pytest.raises(ModelInputError, match=pattern) as info:
            model(tokens, logits_at=bad)
        assert str(info.value).startswith(f"{name}: ")
