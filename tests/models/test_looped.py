"""The LOOPED family: named arms, schedules, ε rules, init, parameter counts, causality, decoding."""

from __future__ import annotations

import math
import time

import pytest
import torch

from drmlab.models import build_model, list_models
from drmlab.models.looped import (
    ARMS,
    LoopedConfig,
    block_kinds,
    build_config,
    closed_form_parameter_count,
    resolve_eps,
    schedule_order,
)
from drmlab.presets import PRESETS

# The study's arms (docs/looped.md section 3): L, N, schedule, ε, mixer, learnable λ, SSM conv,
# stored attention blocks (hybrids).
STUDY_ARMS = {
    "A": (12, 1, "vanilla", 1.0, "attn", False, None, None),
    "B": (6, 2, "layer", 1.0, "attn", False, None, None),
    "C": (6, 2, "layer", 1 / 2, "attn", False, None, None),
    "D": (6, 2, "model", 1 / 2, "attn", False, None, None),
    "E1": (3, 4, "layer", 1.0, "attn", False, None, None),
    "E2": (3, 4, "layer", 1 / 2, "attn", False, None, None),
    "E3": (3, 4, "layer", 1 / 4, "attn", False, None, None),
    "I6": (2, 6, "layer", 1 / 6, "attn", False, None, None),
    "I6u": (2, 6, "layer", 1.0, "attn", False, None, None),
    "I12": (1, 12, "layer", 1 / 12, "attn", False, None, None),
    "I12u": (1, 12, "layer", 1.0, "attn", False, None, None),
    "H": (6, 2, "layer", 1 / 2, "attn", True, None, None),
    "H4": (3, 4, "layer", 1 / 4, "attn", True, None, None),
    "MA": (12, 1, "vanilla", 1.0, "ssm", False, 0, None),
    "MB": (6, 2, "layer", 1.0, "ssm", False, 0, None),
    "MC": (6, 2, "layer", 1 / 2, "ssm", False, 0, None),
    "MB4": (3, 4, "layer", 1.0, "ssm", False, 0, None),
    "MC4": (3, 4, "layer", 1 / 4, "ssm", False, 0, None),
    "HA": (12, 1, "vanilla", 1.0, "hybrid", False, 4, [0, 6]),
    "HC": (6, 2, "layer", 1 / 2, "hybrid", False, 4, [0]),
    "HD": (6, 2, "model", 1 / 2, "hybrid", False, 4, [0]),
    "HE": (7, 2, "ssmloop", 1 / 2, "hybrid", False, 4, [0, 4]),
}

# Logged parameter counts (vocab 50304, no position table): d = 384 / 6 heads and d = 768 / 12 heads.
LOGGED = {
    "A": 40_611_072,
    "B": 29_964_288,
    "C": 29_964_288,
    "D": 29_964_288,
    "E1": 24_640_896,
    "E2": 24_640_896,
    "E3": 24_640_896,
    "I6": 22_866_432,
    "I6u": 22_866_432,
    "I12": 21_091_968,
    "I12u": 21_091_968,
    "H": 29_964_294,
    "H4": 24_640_899,
    "MA": 37_210_572,
    "MB": 28_264_038,
    "MC": 28_264_038,
    "MB4": 23_790_771,
    "MC4": 23_790_771,
}
LOGGED_768 = {
    "A768": 123_689_472,
    "C768": 81_162_240,
    "MA768": 109_856_460,
    "MC768": 74_245_734,
    "HA768": 112_161_962,
    "HC768": 75_398_485,
    "HD768": 75_398_485,
    "HE768": 82_486_357,
}
J_PARAMS = {"micro": 24_184, "tiny": 1_008_208, "small": 10_203_504, "125m": 126_080_896}


def _params(model):
    return sum(p.numel() for p in model.parameters())


def test_registered():
    assert "LOOPED" in list_models()


@pytest.mark.parametrize("arm", sorted(STUDY_ARMS))
def test_named_arms_resolve_to_the_study_settings(arm):
    L, N, schedule, eps, mixer, learnable, conv, attn = STUDY_ARMS[arm]
    for preset in PRESETS:
        c = build_config(preset, arm=arm)
        assert (c.n_stored, c.n_loop, c.schedule, c.mixer, c.has_learnable_scale) == (L, N, schedule, mixer, learnable)
        assert c.eps_value == pytest.approx(eps, rel=1e-15)
        if conv is not None:
            assert c.ssm_conv == conv
        kinds = block_kinds(c)
        if attn is not None:
            assert [i for i, k in enumerate(kinds) if k == "attn"] == attn
        else:
            assert set(kinds) == {"ssm" if mixer == "ssm" else "attn"}
    # the d=768 names: same settings, the SSM with its conv
    if arm + "768" in ARMS:
        c768 = build_config("tiny", arm=arm + "768")
        assert (c768.n_stored, c768.n_loop, c768.schedule, c768.eps_value) == (L, N, schedule, eps)
        assert c768.mixer == mixer and (mixer == "attn" or c768.ssm_conv == 4)


def test_every_arm_at_a_preset_has_equal_applications_per_token():
    for preset in PRESETS:
        apps = {arm: build_config(preset, arm=arm).applications for arm in ARMS}
        assert set(apps.values()) == {12}, (preset, apps)


def test_schedule_orders():
    c = LoopedConfig(n_stored=3, n_loop=2, schedule="layer")
    assert schedule_order(c) == [0, 0, 1, 1, 2, 2]
    c.schedule = "model"
    assert schedule_order(c) == [0, 1, 2, 0, 1, 2]
    he = build_config("micro", arm="HE")
    order, kinds = schedule_order(he), block_kinds(he)
    assert order == [0, 1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6]
    assert [k for k, i in enumerate(order) if kinds[i] == "attn"] == [0, 7]
    hd = build_config("micro", arm="HD")
    assert [k for k, i in enumerate(schedule_order(hd)) if block_kinds(hd)[i] == "attn"] == [0, 6]
    hc = build_config("micro", arm="HC")
    assert [k for k, i in enumerate(schedule_order(hc)) if block_kinds(hc)[i] == "attn"] == [0, 1]


def test_eps_rules():
    base = dict(n_stored=6, n_loop=2)
    assert resolve_eps(LoopedConfig(**base, eps="1/N")) == 0.5
    assert resolve_eps(LoopedConfig(n_stored=3, n_loop=4, eps="1/sqrt(N)")) == 0.5
    lam = resolve_eps(LoopedConfig(**base, eps="lambda/(N*sqrt(L))", eps_lambda=2.0))
    assert lam == pytest.approx(2.0 / (2 * math.sqrt(6)), rel=1e-15)
    assert resolve_eps(LoopedConfig(**base, eps="λ/(N sqrt(L))")) == pytest.approx(1 / (2 * math.sqrt(6)))
    assert resolve_eps(LoopedConfig(**base, eps=0.3)) == 0.3
    assert resolve_eps(LoopedConfig(**base, eps="1/4")) == 0.25
    # an arm stores the rule, so overriding N keeps the arm's scaling
    assert build_config("micro", arm="C", n_stored=3, n_loop=4).eps_value == 0.25
    assert build_config("micro", arm="B", n_stored=3, n_loop=4).eps_value == 1.0
    for bad in (0, -1.0, "1/M", True, float("nan"), "0"):
        with pytest.raises(ValueError, match="eps"):
            build_config("micro", eps=bad)


def test_learnable_eps_scales_both_branches():
    m = build_model("LOOPED", "micro", arm="H", seed=1).double()
    assert m.config.has_learnable_scale and len([b.lam for b in m.blocks]) == 6
    assert _params(m) == _params(build_model("LOOPED", "micro", arm="C")) + 6
    assert build_config("micro", eps="learnable").has_learnable_scale
    block, x = m.blocks[0], torch.randn(2, 5, m.config.d_model, dtype=torch.float64)
    with torch.no_grad():
        block.lam.fill_(0.7)
        s = 0.5 * 0.7
        h = x + s * block.mixer(block.ln1(x))
        expected = h + s * block.mlp(block.ln2(h))
        assert torch.allclose(block(x, 0.5), expected, atol=1e-14)
    tokens = torch.randint(0, 256, (2, 8))
    m(tokens).logits.sum().backward()
    assert all(b.lam.grad is not None and b.lam.grad.abs() > 0 for b in m.blocks)


@pytest.mark.parametrize("arm", sorted(LOGGED))
def test_parameter_formula_reproduces_the_logged_counts(arm):
    c = build_config("small", vocab_size=50304, arm=arm)
    assert (c.d_model, c.n_head, c.d_state) == (384, 6, 16)
    assert closed_form_parameter_count(c, include_positions=False) == LOGGED[arm]


def test_parameter_formula_reproduces_the_logged_768_counts():
    for arm, count in LOGGED_768.items():
        c = build_config("small", vocab_size=50304, arm=arm, d_model=768, n_head=12)
        assert closed_form_parameter_count(c, include_positions=False) == count, arm


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_match_j_and_the_formula(preset):
    with torch.device("meta"):
        model = build_model("LOOPED", preset)
    n = _params(model)
    assert n == closed_form_parameter_count(model.config)
    assert abs(n / J_PARAMS[preset] - 1) <= 0.10, (preset, n)
    assert model.config.max_seq_len == {"micro": 32, "tiny": 256, "small": 512, "125m": 512}[preset]


@pytest.mark.parametrize(
    "arm, overrides",
    [
        ("A", {}),
        ("MC", {}),
        ("HE", {}),
        ("H4", {}),
        ("HC", {"ssm_variant": "mamba"}),
        ("MC4", {"ssm_variant": "mamba"}),
    ],
)
def test_built_counts_equal_the_formula(arm, overrides):
    m = build_model("LOOPED", "micro", arm=arm, **overrides)
    assert _params(m) == closed_form_parameter_count(m.config)


def test_output_projection_init_std():
    for arm, depth in (("C", 12), ("MC", 12), ("HE", 14)):
        m = build_model("LOOPED", "tiny", arm=arm, seed=0)
        std = 0.02 / math.sqrt(2 * depth)
        assert m.write_back_std == pytest.approx(std)
        w = torch.cat([w.flatten() for b in m.blocks for w in b.write_back_weights()])
        assert w.std().item() == pytest.approx(std, rel=0.02), arm
        assert abs(w.mean().item()) < 3 * std / math.sqrt(w.numel())
        w1 = torch.cat([b.mlp.fc.weight.flatten() for b in m.blocks])
        assert w1.std().item() == pytest.approx(0.02, rel=0.02)
    m = build_model("LOOPED", "tiny", arm="HE", proj_init_depth="applications")
    assert m.write_back_std == pytest.approx(0.02 / math.sqrt(24))
    m = build_model("LOOPED", "tiny", arm="C")
    d = m.config.d_model
    qkv = m.blocks[0].mixer.qkv_weight
    assert qkv.abs().max() <= math.sqrt(6 / (4 * d))
    assert qkv.std().item() == pytest.approx(math.sqrt(2 / (4 * d)), rel=0.03)
    assert torch.equal(m.blocks[0].mixer.qkv_bias, torch.zeros(3 * d))
    assert m.pos_emb.std().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_prefix_causality_at_micro(arm):
    m = build_model("LOOPED", "micro", arm=arm, seed=2).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 20), generator=g)
    changed = tokens.clone()
    changed[:, 9:] = torch.randint(0, 256, (2, 11), generator=g)
    with torch.no_grad():
        a, b = m(tokens).logits, m(changed).logits
    assert a.shape == (2, 20, 256)
    assert (a[:, :9] - b[:, :9]).abs().max() <= 1e-6
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-6


def _stepped(model, tokens):
    state = model.init_state(tokens.shape[0])
    out = []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        out.append(logits)
    return torch.stack(out, 1)


@pytest.mark.parametrize(
    "arm, overrides, length",
    [
        ("MC", {}, 32),
        ("HE", {}, 32),
        ("MA768", {}, 32),
        ("D", {}, 32),
        ("MC4", {"ssm_variant": "mamba"}, 24),
        ("HD", {"positions": "none"}, 40),
    ],
)
def test_step_equals_forward(arm, overrides, length):
    m = build_model("LOOPED", "micro", arm=arm, seed=4, **overrides).double().eval()
    tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(tokens).logits
        assert (full - _stepped(m, tokens)).abs().max() <= 1e-10 * max(1.0, full.abs().max().item())


def test_step_leaves_the_state_alone_and_is_fast():
    start = time.perf_counter()
    m = build_model("LOOPED", "micro", arm="HE").eval()
    with torch.no_grad():
        s0 = m.init_state(1)
        _, s1 = m.step(torch.tensor([3]), s0)
        a, _ = m.step(torch.tensor([4]), s1)
        b, _ = m.step(torch.tensor([4]), s1)
    assert time.perf_counter() - start < 1.0
    assert torch.equal(a, b) and s1.position == 1 and s0.position == 0


def test_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_model("LOOPED", "micro", arm="HE", seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_model("LOOPED", "micro", arm="HE", seed=5)
    c = build_model("LOOPED", "micro", arm="HE", seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)
    assert a.model_name == "LOOPED" and a.preset == "micro" and a.config.arm == "HE"


def test_bad_inputs():
    with pytest.raises(ValueError, match="did you mean 'n_loop'"):
        build_model("LOOPED", "micro", n_loops=2)
    with pytest.raises(ValueError, match="did you mean 'I12u'"):
        build_model("LOOPED", "micro", arm="I12U")
    for field in ("d_model", "n_head", "n_stored", "n_loop", "max_seq_len", "d_state"):
        with pytest.raises(ValueError, match=field):
            build_model("LOOPED", "micro", **{field: 0})
    with pytest.raises(ValueError, match="vanilla"):
        build_model("LOOPED", "micro", arm="A", n_loop=2)
    with pytest.raises(ValueError, match="divisible"):
        build_model("LOOPED", "micro", n_head=3)
    with pytest.raises(ValueError, match="schedule"):
        build_model("LOOPED", "micro", schedule="layers")
    with pytest.raises(ValueError, match="mixer"):
        build_model("LOOPED", "micro", mixer="mamba")
    m = build_model("LOOPED", "micro")
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m(torch.full((1, 4), 256))
    with pytest.raises(ValueError, match="rank 2"):
        m(torch.zeros(4, dtype=torch.long))
    state = m.init_state(1)
    for _ in range(32):
        _, state = m.step(torch.tensor([1]), state)
    with pytest.raises(ValueError, match="max_seq_len"):
        m.step(torch.tensor([1]), state)
    with pytest.raises(ValueError, match="shape \\[batch\\]"):
        m.step(torch.zeros(1, 1, dtype=torch.long), m.init_state(1))
    free = build_model("LOOPED", "micro", positions="none")
    assert not free.has_position_limit and free(torch.zeros(1, 40, dtype=torch.long)).logits.shape == (1, 40, 256)
