"""Generation equals the training forward: for every registered model, stepping a sequence
token by token through ``step`` reproduces ``model(tokens)`` at every position, across
block boundaries and past the training length (the generation issue, item 2); and the forward is
causal: changing the tokens after position t leaves the logits through t as they were.

The tests iterate ``list_models()``, so a model added later is covered automatically.
"""

import pytest
import torch

from drmlab.models import build_model, list_models


def _stepped_logits(model, tokens):
    state = model.init_state(tokens.shape[0])
    outputs = []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1)


def _length(model):
    limit = getattr(model.config, "max_seq_len", None) or getattr(model.config, "n_positions", 32)
    # past the training length where the model has no positional table; attention with a
    # learned position table cannot go beyond it
    return 2 * limit + 3 if not getattr(model, "has_position_limit", False) else limit


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_step_equals_parallel_forward(name, dtype, tol):
    model = build_model(name, preset="micro", seed=3).to(dtype).eval()
    tokens = torch.randint(0, 256, (2, _length(model)), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel = model(tokens).logits
        stepped = _stepped_logits(model, tokens)
    assert (parallel - stepped).abs().max() <= tol * max(1.0, parallel.abs().max().item())


@pytest.mark.parametrize("name", list_models())
def test_the_forward_is_causal(name):
    """float64, at preset micro: for a few cut points t, new tokens after t move no logit through t (to 1e-12:
    a block-parallel forward may sum the same terms in another order) and do move a later one."""
    model = build_model(name, preset="micro", seed=2).double().eval()
    length = min(20, _length(model))
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 256, (2, length), generator=gen)
    with torch.no_grad():
        base = model(tokens).logits
        for t in (0, length // 2, length - 2):
            changed = tokens.clone()
            changed[:, t + 1 :] = torch.randint(0, 256, changed[:, t + 1 :].shape, generator=gen)
            out = model(changed).logits
            assert (out[:, : t + 1] - base[:, : t + 1]).abs().max() <= 1e-12 * max(1.0, base.abs().max().item())
            assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 0  # the future does matter


@pytest.mark.parametrize("name", ["J", "B", "G", "SSM_CONTROL"])
def test_step_does_not_modify_the_state_passed_in(name):
    model = build_model(name, preset="micro", seed=0).eval()
    state = model.init_state(1)
    tokens = torch.tensor([3])
    with torch.no_grad():
        _, s1 = model.step(tokens, state)
        a, _ = model.step(torch.tensor([4]), s1)
        b, _ = model.step(torch.tensor([4]), s1)
    assert torch.equal(a, b)


def test_recurrent_path_steps_too():
    model = build_model("B", preset="micro", sequence_mode="recurrent", mixer="none").double().eval()
    tokens = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        assert (model(tokens).logits - _stepped_logits(model, tokens)).abs().max() <= 1e-10
