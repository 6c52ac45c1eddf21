"""DRM family: construction, parameter counts, causality, equivalences, bad input."""

import pytest
import torch

from drmlab.models import build_model, count_parameters, list_models
from drmlab.models.drm import VARIANTS, build_config, closed_form_parameter_count

REFERENCE_125M = {
    "A": 127_266_438,
    "D": 129_625_734,
    "J": 126_080_896,
    "J_NO_METRIC": 72_652_160,
    "J_NO_DIRECTION": 83_206_400,
    "SSM_CONTROL": 126_076_000,
    # the rest of the reference table (docs/drm.md section A.5.3)
    "B": 127_266_438,
    "C": 127_266_438,
    "E": 129_625_734,
    "F": 132_525_446,
    "G": 125_829_830,
    "H": 127_009_664,
    "I": 127_009_664,
    "J_DILATED": 127_191_968,
    "J_NO_NATURALIZATION": 126_080_896,
    # the upstream project's later variants (../shared/notes/upstream-asm.md section 1)
    "J_DIRECT_CONTROL": 29_777_664,
    "J_DIRECT_CONTROL_MATCHED": 83_206_700,
    "J_METRIC_SUBSPACE": 126_080_896,
    "J_METRIC_ORTHONORMAL_DIRECTION": 126_080_896,
    "ASM_CM": 84_011_396,  # J_NO_DIRECTION + the durable fast-weight memory (804,996; docs/drm.md section V)
    "ASM_CM_E": 85_208_200,  # ASM_CM + the epistemic gates (1,196,804; docs/drm.md section V.4)
}


n_params = count_parameters


def test_registry_lists_every_variant():
    names = list_models()
    for v in VARIANTS:
        assert v in names


@pytest.mark.parametrize("variant", sorted(REFERENCE_125M))
def test_parameter_count_125m_matches_reference(variant):
    with torch.device("meta"):
        model = build_model(variant, preset="125m", vocab_size=256)
    count = n_params(model)
    assert abs(count - REFERENCE_125M[variant]) <= 0.005 * REFERENCE_125M[variant]
    assert count == REFERENCE_125M[variant]  # the closed forms are exact
    assert count == closed_form_parameter_count(model.config)


@pytest.mark.parametrize("preset", ["micro", "tiny", "small", "125m"])
def test_ssm_control_matched_within_one_percent(preset):
    j = closed_form_parameter_count(build_config("J", preset))
    control = closed_form_parameter_count(build_config("SSM_CONTROL", preset))
    assert control <= j and (j - control) / j < 0.01


@pytest.mark.parametrize("preset", ["micro", "tiny", "small", "125m"])
def test_direct_control_matched_is_nearest_to_no_direction(preset):
    """ASM-S's rule: the memory width whose count is nearest J_NO_DIRECTION's (at 125m 7,212, +300)."""
    target = closed_form_parameter_count(build_config("J_NO_DIRECTION", preset))
    config = build_config("J_DIRECT_CONTROL_MATCHED", preset)
    gaps = {
        w: abs(closed_form_parameter_count(build_config("J_DIRECT_CONTROL_MATCHED", preset, memory_hidden=w)) - target)
        for w in (config.memory_hidden - 1, config.memory_hidden, config.memory_hidden + 1)
    }
    assert gaps[config.memory_hidden] == min(gaps.values())
    assert (
        gaps[config.memory_hidden] < gaps[config.memory_hidden - 1]
        and gaps[config.memory_hidden] <= gaps[config.memory_hidden + 1]
    )
    if preset == "125m":
        assert config.memory_hidden == 7212
    # the floor rule (SSM_CONTROL's) stays below its target
    assert closed_form_parameter_count(build_config("SSM_CONTROL", preset)) <= closed_form_parameter_count(
        build_config("J", preset)
    )


def test_matched_width_follows_overrides():
    """A caller's dimension override moves both sides of the match (the reference is rebuilt with it)."""
    target = closed_form_parameter_count(build_config("J_NO_DIRECTION", "micro", d_state=24))
    config = build_config("J_DIRECT_CONTROL_MATCHED", "micro", d_state=24)
    per_unit = config.d_read + config.d_token + 1 + 3 * config.d_state
    assert abs(closed_form_parameter_count(config) - target) <= per_unit / 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_shapes_and_finite(variant):
    model = build_model(variant, preset="micro", seed=1)
    tokens = torch.randint(0, 256, (2, 19))
    out = model(tokens)
    assert out.logits.shape == (2, 19, 256)
    assert torch.isfinite(out.logits).all()
    assert n_params(model) == closed_form_parameter_count(model.config)
    if "loss_aux" in out.aux:
        assert torch.isfinite(out.aux["loss_aux"])


def _causality_check(model, dtype, tol, length=21):
    model = model.to(dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, length), generator=gen)
    base = model(tokens).logits
    for t in (0, 5, 7, 8, 9, length - 2):  # micro block size is 8: cover both sides of edges
        changed = tokens.clone()
        changed[:, t + 1 :] = torch.randint(0, 256, changed[:, t + 1 :].shape, generator=gen)
        out = model(changed).logits
        assert (out[:, : t + 1] - base[:, : t + 1]).abs().max() <= tol, f"logits through {t} moved"
        if t + 1 < length:
            assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 0  # the future does matter


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefix_causality_float32(variant):
    _causality_check(build_model(variant, preset="micro", seed=2), torch.float32, 1e-6)


@pytest.mark.parametrize(
    "variant",
    [
        "J",
        "J_DILATED",
        "SSM_CONTROL",
        "G",
        "J_NO_DIRECTION",
        "A",
        "J_METRIC_SUBSPACE",
        "J_METRIC_ORTHONORMAL_DIRECTION",
    ],
)
def test_prefix_causality_float64(variant):
    _causality_check(build_model(variant, preset="micro", seed=2), torch.float64, 1e-12)


def test_prefix_causality_recurrent_path():
    model = build_model("B", preset="micro", seed=3, sequence_mode="recurrent", mixer="none")
    _causality_check(model, torch.float64, 1e-12, length=12)


def test_no_naturalization_equals_no_metric_bitwise():
    tokens = torch.randint(0, 256, (2, 30))
    a = build_model("J_NO_NATURALIZATION", preset="micro", seed=5)
    b = build_model("J_NO_METRIC", preset="micro", seed=5)
    assert torch.equal(a(tokens).logits, b(tokens).logits)


def test_same_seed_same_parameters_and_component_streams():
    a = build_model("J", preset="micro", seed=7)
    b = build_model("J", preset="micro", seed=7)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    # removing the metric leaves every other component's initial weights unchanged
    c = dict(build_model("J_NO_METRIC", preset="micro", seed=7).named_parameters())
    for name, p in a.named_parameters():
        if not name.startswith("metric."):
            assert torch.equal(p, c[name]), name
    different = build_model("J", preset="micro", seed=8)
    assert not torch.equal(a.embedding.weight, different.embedding.weight)


def test_block_size_one_equals_recurrent_rollout():
    common = dict(mixer="none", bounded_state=False, seed=0)
    block = build_model("B", preset="micro", block_size=1, **common).double()
    recurrent = build_model("B", preset="micro", sequence_mode="recurrent", **common).double()
    recurrent.load_state_dict(block.state_dict())
    tokens = torch.randint(0, 256, (2, 17))
    s_block, _ = block.states(tokens)
    s_rec, _ = recurrent.states(tokens)
    assert (s_block - s_rec).abs().max() <= 1e-10
    assert (block(tokens).logits - recurrent(tokens).logits).abs().max() <= 1e-10


def test_aux_losses_only_where_the_variant_has_them():
    tokens = torch.randint(0, 256, (2, 20))
    a = build_model("A", preset="micro")(tokens).aux
    assert {"loss/action", "loss/dim_entropy", "loss/condition", "loss/metric_u_target"} <= set(a)
    assert torch.isfinite(a["loss_aux"]) and a["loss_aux"] != 0
    c = build_model("C", preset="micro")(tokens).aux
    assert set(k for k in c if k.startswith("loss/")) == {"loss/active_fraction"}
    for name in ("B", "J", "SSM_CONTROL", "J_NO_DIRECTION"):
        assert "loss_aux" not in build_model(name, preset="micro")(tokens).aux


def test_aux_loss_gradients_reach_the_metric():
    model = build_model("A", preset="micro")
    model(torch.randint(0, 256, (2, 20))).aux["loss_aux"].backward()
    assert model.metric.diag_head.weight.grad.abs().sum() > 0


def test_naturalization_warmup():
    model = build_model("J", preset="micro")
    assert model.naturalization_strength(None) == 0.5
    assert model.naturalization_strength(1) == pytest.approx(0.001)
    assert model.naturalization_strength(250) == pytest.approx(0.25)
    assert model.naturalization_strength(10_000) == 0.5
    assert build_model("J_NO_NATURALIZATION", preset="micro").naturalization_strength(None) == 0.0


def test_toroidal_mode_is_live():
    plain = build_model("J", preset="micro", seed=0)
    torus = build_model("J", preset="micro", seed=0, toroidal_dims=4)
    assert closed_form_parameter_count(torus.config) == n_params(torus) > n_params(plain)
    tokens = torch.randint(0, 256, (1, 12))
    out = torus(tokens).logits
    assert torch.isfinite(out).all()
    # angles are read as (cos, sin): shifting a toroidal coordinate by 2 pi changes nothing
    z = torch.randn(3, 16)
    shifted = z.clone()
    shifted[:, :4] += 2 * torch.pi
    assert torch.allclose(torus.read(z), torus.read(shifted), atol=1e-5)
    assert not torch.allclose(plain.read(z), plain.read(shifted))


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: build_model("J", preset="micro")(torch.tensor([[1, 256]])), "outside the vocabulary"),
        (lambda: build_model("J", preset="micro")(torch.tensor([[1, -1]])), "outside the vocabulary"),
        (lambda: build_model("J", preset="micro")(torch.tensor([1, 2, 3])), "rank 2"),
        (lambda: build_model("K", preset="micro"), "unknown model 'K'"),
        (lambda: build_model("J", preset="huge"), "unknown preset 'huge'"),
        (lambda: build_model("J", preset="micro", d_state=0), "d_state must be a positive integer"),
        (lambda: build_model("J", preset="micro", hidden_size=-4), "hidden_size must be a positive integer"),
        (lambda: build_model("J", preset="micro", d_stat=8), "did you mean 'd_state'"),
        (lambda: build_model("J", preset="micro", sequence_mode="recurrent"), "recurrent"),
    ],
)
def test_bad_input_raises_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
