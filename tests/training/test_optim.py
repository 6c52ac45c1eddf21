"""The trainer's AdamW: torch's fused implementation where it applies, the per-parameter loop otherwise,
the same update to round-off (drmlab.training.optim)."""

from __future__ import annotations

import copy

import pytest
import torch

from drmlab.ops.fusion import plain_reference
from drmlab.training.config import TrainConfig
from drmlab.training.optim import adamw, build_optimizer

# one step from the same state and gradients: the fused kernel's parameters differ from the loop's by at
# most this many units of round-off (the dtype's eps times the largest parameter)
STEP_ULPS = 4


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_and_loop_adamw_make_the_same_step_to_round_off(dtype):
    loop_model = _model(dtype)
    fused_model = copy.deepcopy(loop_model)
    settings = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    loop = torch.optim.AdamW(loop_model.parameters(), **settings)
    fused = adamw([{"params": list(fused_model.parameters())}], **settings)
    assert fused.param_groups[0]["fused"] and not loop.param_groups[0]["fused"]
    x = torch.randn(64, 16, dtype=dtype)
    worst = 0.0
    for _ in range(6):
        for model, optimizer in ((loop_model, loop), (fused_model, fused)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
        before = [p.detach().clone() for p in loop_model.parameters()]
        loop.step()
        fused.step()
        for p_loop, p_fused, p0 in zip(loop_model.parameters(), fused_model.parameters(), before):
            assert not torch.equal(p_loop, p0)  # a step was taken
            ulp = torch.finfo(dtype).eps * p_loop.detach().abs().max()
            worst = max(worst, ((p_fused.detach() - p_loop.detach()).abs().max() / ulp).item())
        # the next step starts both from the same state, so each step is compared on its own
        fused_model.load_state_dict(loop_model.state_dict())
        state = copy.deepcopy(loop.state_dict())  # a copy: load_state_dict keeps the tensors it is given
        fused.load_state_dict({**state, "param_groups": fused.state_dict()["param_groups"]})
    assert 0.0 <= worst <= STEP_ULPS


def test_build_optimizer_is_fused_unless_the_plain_reference_is_asked_for(monkeypatch):
    cfg = TrainConfig()
    model = _model(torch.float32)
    assert build_optimizer(model, cfg).param_groups[0]["fused"] is True
    with plain_reference():
        assert not build_optimizer(model, cfg).param_groups[0]["fused"]
    monkeypatch.setenv("DRMLAB_NO_FUSED", "1")
    assert not build_optimizer(model, cfg).param_groups[0]["fused"]


def test_a_parameter_the_fused_kernel_cannot_take_gives_the_loop():
    meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    assert not adamw([{"params": [meta]}], lr=1e-3).param_groups[0]["fused"]


def test_a_checkpoint_of_either_implementation_resumes_with_the_one_it_was_written_with():
    model = _model(torch.float32)
    with plain_reference():
        written = build_optimizer(model, TrainConfig())
    resumed = build_optimizer(model, TrainConfig())
    resumed.load_state_dict(written.state_dict())
    assert not resumed.param_groups[0]["fused"]
    resumed_plain = torch.optim.AdamW(model.parameters())
    resumed_plain.load_state_dict(build_optimizer(model, TrainConfig()).state_dict())
    assert resumed_plain.param_groups[0]["fused"] is True
