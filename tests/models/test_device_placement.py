"""Every model keeps its tensors on its input's device: forward, backward and a decoding step.

Nothing here has a GPU, so the models run on PyTorch's ``meta`` device instead: a meta tensor has a
shape, a dtype and a device but no data, and an operation that mixes it with a CPU tensor fails
("Tensor on device cpu is not on the expected device meta"). A model that builds a constant,
a mask or a state with ``torch.zeros(...)`` and no ``device=`` therefore fails here exactly as it
would on CUDA. ``linear_scan`` has no C kernel on meta and Triton is CUDA-only, so the log-depth
torch scan serves it, as on any device other than the CPU and CUDA.

Two ways through each model:
* eager, the id-range check (which reads values) turned off: the path a CUDA run takes;
* with ``torch.compiler.is_compiling()`` reporting True: the branches a traced graph takes, which
  must not read values (``.item()`` or ``.tolist()`` fail on meta), including the models whose eager
  path reads them on purpose (GPT2 and LLAMA through transformers' masks, the metric-first fallbacks and the
  resolvent's block plan).
"""

from __future__ import annotations

import pytest
import torch

from drmlab.models import inputs
from drmlab.models.registry import build_model, list_models

# Eager paths that read values on purpose (a host sync on CUDA, not a device error): checked only
# through their traced branches.
READS_VALUES_WHEN_EAGER = {
    "GPT2": "transformers builds its attention mask from the values",
    "LLAMA": "transformers reads the position ids to detect packed sequences (no cache, no mask)",
    "J_METRIC_SUBSPACE": "falls back to a pseudo-inverse when a factorisation fails",
    "J_METRIC_ORTHONORMAL_DIRECTION": "falls back to the Euclidean frame when a Cholesky fails",
    "RESOLVENT": "skips key blocks before every row's segment start",
}

# Parameters that get no gradient by design: A-G carry the reference's dead risk field (disabled, it
# returns zeros); J_NO_NATURALIZATION keeps the metric's parameters but never uses them; the variable-rank
# entries' controller is frozen at full rank (docs/variable-rank.md section 3).
NO_GRADIENT_BY_DESIGN = (
    {name: ("risk.",) for name in "ABCDEFG"}
    | {"J_NO_NATURALIZATION": ("metric.",)}
    | {name: ("rank_controller.",) for name in ("ASM_VR_R", "ASM_VR_RS", "ASM_VR_S", "ASM_CM_VR")}
)


class _AutocastMetaAsCpu(torch.autocast):
    """torch.autocast refuses device_type "meta"; the models only ever turn autocast off there."""

    def __init__(self, device_type, *args, **kwargs):
        super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)


@pytest.fixture
def meta_runtime(monkeypatch):
    monkeypatch.setattr(torch, "autocast", _AutocastMetaAsCpu)


def test_meta_catches_a_tensor_created_without_a_device():
    with pytest.raises(RuntimeError, match="device"):
        torch.ones(3, device="meta") + torch.ones(3)


def _check_model(name: str) -> None:
    model = build_model(name, preset="tiny", vocab_size=256, seed=0).to("meta")
    tokens = torch.zeros(2, 33, dtype=torch.long, device="meta")
    logits = model(tokens).logits
    assert logits.device.type == "meta" and tuple(logits.shape) == (2, 33, 256)
    logits.float().sum().backward()
    skip = NO_GRADIENT_BY_DESIGN.get(name, ())
    for pname, p in model.named_parameters():
        if pname.startswith(skip):
            continue
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert p.grad.device.type == "meta", f"{name}: {pname}'s gradient is on {p.grad.device}"
    with torch.no_grad():
        state = model.init_state(2)
        step_logits, state = model.step(tokens[:, 0], state)
    assert step_logits.device.type == "meta" and tuple(step_logits.shape) == (2, 256)
    for leaf in _tensors(state):
        assert leaf.device.type == "meta", f"{name}: a decoding-state tensor is on {leaf.device}"


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif hasattr(obj, "__dict__"):
        for v in vars(obj).values():
            yield from _tensors(v)


@pytest.mark.parametrize("name", [n for n in list_models() if n not in READS_VALUES_WHEN_EAGER])
def test_eager_forward_backward_and_step_stay_on_the_input_device(name, meta_runtime, monkeypatch):
    monkeypatch.setattr(inputs, "_check_ids", lambda *args: None)
    _check_model(name)


@pytest.mark.parametrize("name", list_models())
def test_traced_branches_stay_on_the_input_device_and_read_no_values(name, meta_runtime, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _check_model(name)
