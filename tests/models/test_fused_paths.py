"""The fused paths of the DRM block path (docs/drm.md A.4.6; ``drmlab.ops.fusion``) against the plain reference: on
every registered DRM model, logits and every parameter's gradient within 1e-5 relative in float32 and
1e-12 in float64, with a short final block, and in the stressed settings (the clip active on every state,
variable rank, the selective memory at a sliced width)."""

import pytest
import torch
import torch.nn.functional as F

from drmlab.models import build_model, list_models
from drmlab.models.drm.model import DRMModel
from drmlab.ops.fusion import fused_enabled, plain_reference

DRM_MODELS = [name for name in list_models() if isinstance(build_model(name, preset="micro"), DRMModel)]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _logits_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    out = model(tokens[:, :-1], step=3)
    loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


def _compare(model, dtype, length: int):
    model = model.to(dtype)
    block = model.config.block_size
    assert length % block, "the sequence must end in a short block"
    tokens = torch.randint(0, 256, (3, length + 1), generator=torch.Generator().manual_seed(0))
    assert fused_enabled()
    fused_logits, fused_grads = _logits_and_grads(model, tokens)
    with plain_reference():
        plain_logits, plain_grads = _logits_and_grads(model, tokens)
    assert fused_grads.keys() == plain_grads.keys()
    assert _rel(fused_logits, plain_logits) < TOL[dtype]
    worst = max((_rel(fused_grads[n], plain_grads[n]), n) for n in plain_grads if plain_grads[n].abs().max() > 0)
    assert worst[0] < TOL[dtype], worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", DRM_MODELS)
def test_every_drm_model_fused_equals_plain(name, dtype):
    model = build_model(name, preset="micro", seed=0)
    _compare(model, dtype, length=model.config.block_size * 2 + 5)


STRESSED = {
    "clip active": ("J", dict(state_clip_norm=0.05)),
    "clip active, memory": ("SSM_CONTROL", dict(state_clip_norm=0.05)),
    "variable rank, sliced": ("J_NO_DIRECTION", dict(rank_policy="fixed", rank_compute="sliced", rank_fixed=5)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(STRESSED))
def test_stressed_settings_fused_equal_plain(case, dtype):
    name, overrides = STRESSED[case]
    model = build_model(name, preset="micro", seed=0, **overrides)
    _compare(model, dtype, length=model.config.block_size + 3)


def test_the_clip_is_active_in_the_stressed_case():
    """The clip stress is real: the states sit on the radius, where the clip acts."""
    model = build_model("J", preset="micro", seed=0, state_clip_norm=0.05)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states, _ = model.states(tokens)
    assert float(states.norm(dim=-1).min()) > 0.9 * 0.05 * torch.tanh(torch.tensor(1.0))


def test_a_planted_difference_is_seen():
    """The comparison can fail: the same model at another forget bias is far outside the tolerance."""
    model = build_model("SSM_CONTROL", preset="micro", seed=0)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    a, _ = _logits_and_grads(model, tokens)
    model.memory.forget_bias += 0.01
    b, _ = _logits_and_grads(model, tokens)
    assert _rel(a, b) > TOL[torch.float32]
