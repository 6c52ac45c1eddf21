"""The model registry and what every family shares: one list of families (a broken one is an
error), one preset list, one parameter count, checkpoints with earlier parameter names, and
error messages that name settings rather than command-line flags."""

import importlib
import sys

import pytest
import torch

from drmlab.models import build_model, count_parameters, list_models
from drmlab.models.families import FAMILIES
from drmlab.models.registry import register_families
from drmlab.presets import PRESETS


def test_a_family_that_does_not_import_is_an_error():
    with pytest.raises(ModuleNotFoundError, match="drmlab.models.no_such_family"):
        register_families(("no_such_family",))


def test_a_family_whose_module_cannot_be_imported_is_an_error(monkeypatch):
    """The case the registry used to swallow: a ModuleNotFoundError naming the family module itself."""
    monkeypatch.setitem(sys.modules, "drmlab.models.looped", None)  # makes its import fail
    with pytest.raises(ModuleNotFoundError) as error:
        register_families()
    assert error.value.name == "drmlab.models.looped"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_registers_its_names_and_covers_every_preset(family):
    module = importlib.import_module(f"drmlab.models.{family}")
    assert set(module.MODEL_NAMES) <= set(list_models())
    assert tuple(module.PRESET_DIMS) == PRESETS  # the one preset list, in its order


@pytest.mark.parametrize(
    "name, family", [("J", "drm"), ("GPT2", "gpt2"), ("LLAMA", "llama"), ("LOOPED", "looped"), ("MAMBA", "mamba")]
)
def test_count_parameters_agrees_with_the_closed_form(name, family):
    module = importlib.import_module(f"drmlab.models.{family}")
    for preset in ("micro", "125m"):
        with torch.device("meta"):
            model = build_model(name, preset)
        assert count_parameters(model) == module.closed_form_parameter_count(model.config)
    tied = build_model("GPT2", "micro")
    assert (
        count_parameters(tied)
        == sum(p.numel() for p in tied.parameters())
        < sum(p.numel() for p in tied.state_dict().values())
    )  # the tied head counted once


# earlier names -> today's (the block shared by LOOPED and RESOLVENT*; drmlab.models.legacy_names)
RESOLVENT_OLD_NAMES = {
    "mixer.qkv_weight": "attn.qkv.weight",
    "mixer.qkv_bias": "attn.qkv.bias",
    "mixer.out_proj.": "attn.proj.",
    "mixer.": "attn.",
    "mlp.fc.": "fc1.",
    "mlp.proj.": "fc2.",
}


def _old_names(state_dict, renames):
    out = {}
    for key, value in state_dict.items():
        for new, old in renames.items():
            if new in key:
                key = key.replace(new, old)
                break
        out[key] = value
    return out


@pytest.mark.parametrize(
    "name, overrides, renames",
    [
        ("RESOLVENT", {}, RESOLVENT_OLD_NAMES),
        ("RESOLVENT_ROPE", {}, RESOLVENT_OLD_NAMES),
        ("LOOPED", {"arm": "HC"}, {"mixer.out_proj.": "mixer.w_out."}),
    ],
)
def test_checkpoints_with_earlier_parameter_names_load(name, overrides, renames):
    trained = build_model(name, "micro", seed=1, **overrides).eval()
    old = _old_names(trained.state_dict(), renames)
    if name.startswith("RESOLVENT"):
        assert "blocks.0.attn.qkv.weight" in old and "blocks.0.fc2.bias" in old
    else:
        assert any(".w_out." in key for key in old) and not any(".w_out." in key for key in trained.state_dict())
    fresh = build_model(name, "micro", seed=2, **overrides).eval()
    fresh.load_state_dict(old, strict=True)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, trained(tokens).logits)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: build_model("LOOPED", "micro")(torch.zeros(1, 33, dtype=torch.long)),
        lambda: build_model("GPT2", "micro")(torch.zeros(1, 33, dtype=torch.long)),
    ],
)
def test_length_errors_name_the_setting_not_a_flag(bad):
    with pytest.raises(ValueError) as error:
        bad()
    message = str(error.value)
    assert ("max_seq_len" in message or "n_positions" in message) and "--" not in message


def test_families_share_one_attention_block_and_one_mamba_mixer():
    from drmlab.models.layers import CausalSelfAttention, MambaMixer, PreLNBlock

    for name, overrides in [("LOOPED", {}), ("RESOLVENT_SOFTMAX", {}), ("RESOLVENT_ROPE", {}), ("RESOLVENT", {})]:
        model = build_model(name, "micro", **overrides)
        assert all(type(block) is PreLNBlock and isinstance(block.mixer, CausalSelfAttention) for block in model.blocks)
    assert build_model("RESOLVENT_ROPE", "micro").blocks[0].mixer.rotary_base is not None
    mamba = build_model("MAMBA", "micro")
    looped = build_model("LOOPED", "micro", arm="HC", ssm_variant="mamba")
    assert all(type(layer.mixer) is MambaMixer for layer in mamba.layers)
    kinds = [type(block.mixer) for block in looped.blocks]
    assert kinds.count(MambaMixer) == 5 and kinds.count(CausalSelfAttention) == 1


@pytest.mark.parametrize("name", list_models())
def test_a_frozen_model_computes_the_same_bits_as_a_trainable_one(name):
    """Whether the weights require grad must not change the output (torch's matmul picks its kernel
    by it for inputs it cannot fold without a copy: a frozen teacher, an exported model and a
    trainable one would otherwise differ in the last bits); the parallel forward and the step."""
    torch.manual_seed(0)
    model = build_model(name, "micro", seed=1).eval()
    tokens = torch.randint(0, 256, (3, 30), generator=torch.Generator().manual_seed(0))

    def outputs():
        with torch.no_grad():
            logits = model(tokens).logits
            state = model.init_state(3)
            steps = []
            for t in range(4):
                step_logits, state = model.step(tokens[:, t], state)
                steps.append(step_logits)
        return logits, torch.stack(steps, 1)

    trainable = outputs()
    for p in model.parameters():
        p.requires_grad_(False)
    frozen = outputs()
    assert torch.equal(trainable[0], frozen[0]) and torch.equal(trainable[1], frozen[1])
