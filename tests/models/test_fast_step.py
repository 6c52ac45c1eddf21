"""The fast decode step (``drmlab.models.drm.stages.stepping``, ``docs/drm.md`` section A.4.5) equals the
reference step bit for bit: every registered DRM model, both float widths, several batch sizes, from
``init_state`` and from a mid-block prefill, across block edges, and the settings whose fast step
differs (solver, step modes, toroidal state, metric-first compositions, dilations, rank-0 metric), and
the variable rank below d_state (masked: the fast step with the projection; sliced: the reference)."""

import pytest
import torch

from drmlab.generation import prefill
from drmlab.models import build_model, list_models
from drmlab.models.drm.components import bound_state
from drmlab.models.drm.model import DRMModel
from drmlab.models.drm.stages import stepping
from drmlab.ops.fusion import plain_reference
from drmlab.ops.state_bound import state_bound

DRM_MODELS = [name for name in list_models() if isinstance(build_model(name, preset="micro"), DRMModel)]
SETTINGS = [
    dict(block_solver="fixed_point", solver_iters=3),
    dict(block_solver="anderson", solver_iters=3, anderson_history=2),
    dict(step_mode="candidate"),
    dict(toroidal_dims=4),
    dict(directional_metric_composition="metric_subspace"),
    dict(directional_metric_composition="metric_orthonormal"),
    dict(metric_rank=0),
    dict(mixer_dilation_growth=2, mixer_layers=3),
    dict(mixer_kernel=1),
]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int64 if x.dtype == torch.float64 else torch.int32)


def _assert_fast_equals_reference(model, batch: int, length: int = 20, prompt: int = 0) -> None:
    """Step ``length`` tokens by ``step`` and by ``step_reference`` from one state; every logit equal."""
    tokens = torch.randint(0, 256, (batch, prompt + length), generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        state = prefill(model, tokens[:, :prompt])[1] if prompt else model.init_state(batch)
        fast = reference = state
        for t in range(prompt, prompt + length):
            a, fast = model.step(tokens[:, t], fast)
            b, reference = model.step_reference(tokens[:, t], reference)
            assert torch.equal(_bits(a), _bits(b)), f"position {t}: {(a - b).abs().max().item():.3g}"


@pytest.mark.parametrize("name", DRM_MODELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_step_is_the_reference_step_bit_for_bit(name, dtype):
    model = build_model(name, preset="micro", seed=3).to(dtype).eval()
    for batch in (1, 3):
        _assert_fast_equals_reference(model, batch)
    _assert_fast_equals_reference(model, 2, prompt=5)  # micro blocks are 8 long: a mid-block prefill state


@pytest.mark.parametrize("overrides", SETTINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fast_step_is_the_reference_step_for_each_setting(overrides):
    name = "A" if overrides.get("step_mode") == "geodesic" else "J"
    model = build_model(name, preset="micro", seed=1, **overrides).eval()
    _assert_fast_equals_reference(model, 2)
    _assert_fast_equals_reference(model.double(), 2, prompt=11)


def _live_ranks(model, seed=0):
    """A live rank controller (random scores): the rank differs between examples and blocks."""
    head = model.rank_controller.score_head
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(3.0 * torch.randn(head.weight.shape, generator=g, dtype=head.weight.dtype))
        head.bias.copy_(torch.randn(head.bias.shape, generator=g, dtype=head.bias.dtype))
        for name, p in model.named_parameters():  # W_o = 0 would hide the fast-weight memory
            if not name.startswith("rank_controller."):
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("name", ["ASM_VR_R", "ASM_VR_RS", "ASM_VR_S", "ASM_CM_VR", "ASM_CM_VR+epistemic"])
@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("compute", ["masked", "sliced"])
def test_fast_step_applies_the_rank_projection_as_the_reference(name, policy, compute):
    """Variable rank below d_state (the registry entries run at full rank): the fast step projects every
    increment where the reference does, bit for bit; the masked form runs the fast step (its constants
    are made), the sliced form steps by the reference."""
    base, _, extra = name.partition("+")
    settings = dict(rank_policy="fixed", rank_fixed=5) if policy == "fixed" else dict(rank_policy="adaptive")
    if extra:
        settings["fast_weight_epistemic_gates"] = True
    model = build_model(base, preset="micro", seed=2, rank_compute=compute, **settings)
    model = (_live_ranks(model) if policy == "adaptive" else _live_ranks(model, seed=1)).eval()
    _assert_fast_equals_reference(model, 3)
    _assert_fast_equals_reference(model.double(), 2, prompt=11)
    with torch.no_grad():
        _, state = model.step(torch.zeros(2, dtype=torch.long), model.init_state(2))
    constants = [getattr(s, "constants", None) for s in state.stages if isinstance(s, tuple)]
    assert any(c is not None for c in constants) == (compute == "masked" or int(state.rank.max()) == 16)


def test_fast_step_steps_by_the_reference_where_casts_matter():
    """Under autocast (or in a reduced precision) the reference's casts do something: the model takes its path."""
    model = build_model("J", preset="micro", seed=0).eval()
    assert stepping.fast_step_supported(model.embedding.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not stepping.fast_step_supported(model.embedding.weight)
        _assert_fast_equals_reference(model, 2, length=10)
    assert not stepping.fast_step_supported(model.embedding.weight.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [0.5, 3.0])
def test_step_bound_is_bound_state(dtype, radius):
    class Config:
        bounded_state, state_clip_norm, toroidal_dims = True, radius, 0

    z = torch.randn(4, 1, 33, dtype=dtype, generator=torch.Generator().manual_seed(0)) * torch.tensor(
        [0.01, 0.3, 2.0, 50.0], dtype=dtype
    ).view(4, 1, 1)
    z[0] = 0.0
    with plain_reference():  # the plain step bound: bound_state's kernels, bit for bit
        assert torch.equal(_bits(stepping.bound(z, Config())), _bits(bound_state(z, radius)))
    # where the fused bound applies, the step takes it as Transition.bound does
    assert torch.equal(_bits(stepping.bound(z, Config())), _bits(state_bound(z, radius)))
    Config.bounded_state = False
    assert stepping.bound(z, Config()) is z


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scalar_operand_is_the_python_number(dtype):
    x = torch.randn(3, 17, dtype=dtype, generator=torch.Generator().manual_seed(0))
    for value in (0.1, 1 / 3, 0.9, 7.0):
        s = stepping.scalar(value, x)
        assert s is stepping.scalar(value, x) and s.dtype == dtype
        assert torch.equal(_bits(x * s), _bits(value * x))
        assert torch.equal(_bits(x + s), _bits(x + value))
        assert torch.equal(_bits(x.div(s)), _bits(x / value))
