"""The fused decode step (``DRMModel.step_fused``, ``drmlab.models.drm.fused_step``, ``docs/drm.md`` section
A.4.5 "The fused step") against the reference step: every registered DRM model, both float widths, from
``init_state`` and from a mid-block prefill, across block edges; float64 logits and states equal to 1e-12,
float32 to round-off. Where it does not apply (the model's structure, or one token: a block's first,
autograd, autocast, another dtype, a wide batch, no C kernel) it is the fast step, bit for bit."""

import pytest
import torch

from drmlab.generation import prefill
from drmlab.models import build_model, list_models
from drmlab.models.drm import fused_step
from drmlab.models.drm.model import DRMModel
from drmlab.ops import ckernels, decode_step

DRM_MODELS = [name for name in list_models() if isinstance(build_model(name, preset="micro"), DRMModel)]
# every entry the kernel does not take, by the part it lacks
NOT_FUSED = {"G": "refinement", "ASM_CM": "fast_weight", "ASM_CM_E": "fast_weight", "ASM_CM_VR": "variable rank"}
NOT_FUSED.update({name: "variable rank" for name in ("ASM_VR_R", "ASM_VR_RS", "ASM_VR_S")})
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}  # relative to the largest |value| (and at least 1)

kernel_missing = decode_step.unavailable(torch.float64) is not None and not ckernels.required_by_env()


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int64 if x.dtype == torch.float64 else torch.int32)


def _close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    return (a - b).abs().max().item() <= TOLERANCE[dtype] * max(1.0, b.abs().max().item())


class _Count:
    """How many tokens the kernel took, and how many were inside a block (a wrapper of ``fused_step.step``)."""

    def __init__(self, monkeypatch):
        self.fused, self.inside = 0, 0
        original = fused_step.step

        def counted(model, tokens_t, state, strength):
            out = original(model, tokens_t, state, strength)
            self.inside += state.position > 0
            self.fused += out is not None
            return out

        monkeypatch.setattr(fused_step, "step", counted)


def _compare(model, batch: int, length: int = 20, prompt: int = 0, mix: bool = False) -> None:
    """Step ``length`` tokens by ``step_fused`` (alternating with ``step`` where ``mix``) and by
    ``step_reference`` from one state; logits and states close at every position."""
    dtype = model.embedding.weight.dtype
    tokens = torch.randint(0, 256, (batch, prompt + length), generator=torch.Generator().manual_seed(batch + prompt))
    with torch.no_grad():
        state = prefill(model, tokens[:, :prompt])[1] if prompt else model.init_state(batch)
        fused = reference = state
        for t in range(prompt, prompt + length):
            step = model.step if mix and t % 3 == 0 else model.step_fused
            a, fused = step(tokens[:, t], fused)
            b, reference = model.step_reference(tokens[:, t], reference)
            assert _close(a, b, dtype), f"position {t}: logits differ by {(a - b).abs().max().item():.3g}"
            assert _close(fused.z_start, reference.z_start, dtype)
            assert fused.position == reference.position


@pytest.mark.skipif(kernel_missing, reason="the decode_step C kernel cannot be built here (no C compiler)")
@pytest.mark.parametrize("name", DRM_MODELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_step_is_the_reference_step_to_round_off(name, dtype, monkeypatch):
    model = build_model(name, preset="micro", seed=3).to(dtype).eval()
    reason = model.fused_step_unsupported()
    assert (reason is None) == (name not in NOT_FUSED), reason
    if reason is not None:
        assert NOT_FUSED[name] in reason
        return
    count = _Count(monkeypatch)
    for batch in (1, 3):
        _compare(model, batch)  # micro blocks are 8 long: 20 tokens cross two block edges
    _compare(model, 2, prompt=5)  # from a mid-block prefill state
    _compare(model, 2, prompt=5, mix=True)  # either step continues from the other's state
    assert count.fused == count.inside > 0  # every token but each block's first


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_fused_step_is_the_fast_step_where_it_does_not_apply(name):
    model = build_model(name, preset="micro", seed=2).eval()
    with torch.no_grad():
        _fast_step_bit_for_bit(model, length=12, prompt=0, seed=0)


SETTINGS = [
    dict(metric_rank=0),
    dict(mixer_dilation_growth=2, mixer_layers=3),
    dict(mixer_kernel=1),
    dict(directional_metric_composition="metric_subspace"),
    dict(directional_metric_composition="metric_orthonormal"),
    dict(bounded_state=False),
]


@pytest.mark.skipif(kernel_missing, reason="the decode_step C kernel cannot be built here (no C compiler)")
@pytest.mark.parametrize("overrides", SETTINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fused_step_for_each_setting(overrides, monkeypatch):
    model = build_model("J", preset="micro", seed=1, **overrides).double().eval()
    assert model.fused_step_unsupported() is None
    count = _Count(monkeypatch)
    _compare(model, 2, prompt=11)
    _compare(model.float(), 3)
    assert count.fused == count.inside > 0


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(block_solver="fixed_point", solver_iters=3), "solver"),
        (dict(step_mode="candidate"), "step_mode"),
        (dict(toroidal_dims=4), "toroidal"),
        (
            dict(sequence_mode="recurrent", mixer="none", token_state_residual=False, selective_memory=False),
            "sequence_mode",
        ),
    ],
)
def test_fused_step_names_why_it_does_not_apply(overrides, words):
    model = build_model("J", preset="micro", seed=1, **overrides).eval()
    assert words in model.fused_step_unsupported()
    with torch.no_grad():
        _fast_step_bit_for_bit(model, length=10, prompt=0, seed=1)


def _fast_step_bit_for_bit(model, batch=2, length=10, prompt=5, seed=4):
    """``step_fused`` and ``step`` from one state (a prefill of ``prompt`` tokens, or ``init_state``): the
    same logits bit for bit at every position."""
    tokens = torch.randint(0, 256, (batch, prompt + length), generator=torch.Generator().manual_seed(seed))
    state = prefill(model, tokens[:, :prompt])[1] if prompt else model.init_state(batch)
    a = b = state
    for t in range(prompt, prompt + length):
        x, a = model.step_fused(tokens[:, t], a)
        y, b = model.step(tokens[:, t], b)
        assert torch.equal(_bits(x), _bits(y))


def test_fused_step_leaves_the_tokens_it_cannot_take_to_the_fast_step(monkeypatch):
    """Autograd, autocast, bfloat16 (named), a batch wider than MAX_BATCH, no C kernel: the fast step, bit for bit."""
    model = build_model("J", preset="micro", seed=0).eval()
    with torch.no_grad():
        state = prefill(model, torch.zeros(1, 3, dtype=torch.long))[1]
    with torch.no_grad():
        assert fused_step.token_unsupported(model, state) is None
    assert "gradients" in fused_step.token_unsupported(model, state)
    _fast_step_bit_for_bit(model)  # gradients enabled, the weights require them
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert "autocast" in fused_step.token_unsupported(model, state)
            _fast_step_bit_for_bit(model)
        assert "dtype" in fused_step.token_unsupported(model.to(torch.bfloat16), state)  # (bf16 does not step)
        model.float()
        _fast_step_bit_for_bit(model, batch=fused_step.MAX_BATCH + 1)
        monkeypatch.setenv(ckernels.DISABLE_ENV, "1")
        assert decode_step.unavailable(torch.float32) is not None
        _fast_step_bit_for_bit(model)


@pytest.mark.skipif(kernel_missing, reason="the decode_step C kernel cannot be built here (no C compiler)")
def test_fused_step_sees_a_changed_weight():
    """The kernel reads transposed copies of the weights: an in-place update (a training step) or a
    replaced weight makes new ones."""
    model = build_model("J", preset="micro", seed=0).double().eval()
    with torch.no_grad():
        _compare(model, 2, prompt=3)
        model.mixer.pointwise[1].weight.mul_(1.5)  # in place: a new version
        model.emitter.fc2.weight.add_(0.1)
        _compare(model, 2, prompt=3)
        model.memory.forget.weight.data = model.memory.forget.weight.data * 0.5  # new storage
        _compare(model, 2, prompt=3)


@pytest.mark.skipif(kernel_missing, reason="the decode_step C kernel cannot be built here (no C compiler)")
def test_a_state_of_another_shape_is_refused_before_the_kernel_reads_it():
    """The C code trusts its buffers' sizes: a state from a model of other widths is one ValueError."""
    import dataclasses

    model = build_model("J", preset="micro", seed=0).eval()
    other = build_model("J", preset="micro", seed=0, d_state=model.config.d_state + 4).eval()
    with torch.no_grad():
        mine = prefill(model, torch.zeros(1, 3, dtype=torch.long))[1]
        foreign = prefill(other, torch.zeros(1, 3, dtype=torch.long))[1]
        for index in range(len(mine.stages)):  # one stage's state from the other model at a time
            if mine.stages[index] is None:
                continue
            stages = list(mine.stages)
            stages[index] = foreign.stages[index]
            with pytest.raises(ValueError, match="step_fused: the state's .* has shape"):
                model.step_fused(torch.zeros(1, dtype=torch.long), dataclasses.replace(mine, stages=tuple(stages)))
        model.step_fused(torch.zeros(1, dtype=torch.long), mine)  # its own state steps


@pytest.mark.skipif(kernel_missing, reason="the decode_step C kernel cannot be built here (no C compiler)")
@pytest.mark.parametrize("width", ["hidden_size", "n_directions"])
def test_block_constants_of_another_model_are_refused_before_the_kernel_reads_them(width):
    """Same state width, other flow or direction widths: the state buffers pass their check and
    the block's cached constants are what would be read past their ends; one ValueError names them."""
    import dataclasses

    model = build_model("J", preset="micro", seed=0).eval()
    other = build_model("J", preset="micro", seed=0, **{width: getattr(model.config, width) * 2}).eval()
    with torch.no_grad():
        mine = prefill(model, torch.zeros(1, 3, dtype=torch.long))[1]
        foreign = prefill(other, torch.zeros(1, 3, dtype=torch.long))[1]
        index = next(i for i, s in enumerate(mine.stages) if type(s) is fused_step.PrefixState)
        stages = list(mine.stages)
        stages[index] = foreign.stages[index]
        with pytest.raises(ValueError, match="step_fused: the block constants"):
            model.step_fused(torch.zeros(1, dtype=torch.long), dataclasses.replace(mine, stages=tuple(stages)))
