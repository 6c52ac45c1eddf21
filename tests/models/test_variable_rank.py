"""Variable rank (``drmlab/models/drm/rank.py``, ``docs/variable-rank.md``) and its registry entries
ASM_VR_R, ASM_VR_RS, ASM_VR_S and ASM_CM_VR: parameter counts against upstream's, full rank equal to
the base model bit for bit, the prefix mask and what it discards, the controller's policies, the
straight-through gradient, the curriculum and its losses, the sliced form against the masked one in
float64, exact stepping and prefill, constant decode state, and every refused setting; ASM_CM_VR with
the epistemic gates (ASM_CM_E's) on its rank-aware memory in the same tests."""

from __future__ import annotations

import math

import pytest
import torch

from drmlab.experiments.mqar.distance import state_nbytes
from drmlab.models import build_model, count_parameters
from drmlab.models.drm import build_config, closed_form_parameter_count
from drmlab.models.drm.config import matched_memory_width
from drmlab.models.drm.rank import RankMask, rank_losses, rank_schedule

F64 = torch.float64
VR_NAMES = ["ASM_VR_R", "ASM_VR_RS", "ASM_VR_S", "ASM_CM_VR"]
# every entry, and ASM_CM_VR with ASM_CM_E's epistemic gates on its rank-aware memory (the two compose)
EPISTEMIC = dict(fast_weight_epistemic_gates=True)
VR_CASES = [pytest.param(name, {}, id=name) for name in VR_NAMES] + [
    pytest.param("ASM_CM_VR", EPISTEMIC, id="ASM_CM_VR+epistemic")
]

# upstream's Phase 3A / PMCS-64 preset in our fields (../shared/notes/upstream-asm-vr.md section 6); the
# unused risk field it instantiates is risk="dead" (8,582 parameters at d = 64)
UPSTREAM_PRESET = dict(
    d_token=64,
    d_state=64,
    hidden_size=128,
    metric_rank=8,
    direction_basis_size=0,
    metric_u_basis_size=0,
    mixer_hidden=64,
    mixer_kernel=4,
    mixer_layers=1,
    memory_hidden=64,
    block_size=32,
    bounded_state=False,
    risk="dead",
    fast_weight_dim=128,
    max_seq_len=256,
)
UPSTREAM_COUNTS = {  # (total, trainable with a frozen controller), upstream's table
    "ASM_VR_R": (223_814, 219_654),
    "ASM_VR_RS": (244_550, 240_390),
    "ASM_VR_S": (274_135, 269_975),  # S = 465, matched to ASM-CM (PMCS-64)
    "ASM_CM_VR": (265_866, 261_706),
}
COUNTS_125M = {  # upstream's note, section 6 (our 125m dims)
    "ASM_VR_R": (83_596_288, 81_235_456),
    "ASM_VR_RS": (85_567_232, 83_206_400),
    "ASM_VR_S": (84_008_289, 81_647_457),  # S = 7,009, matched to ASM_CM
    "ASM_CM_VR": (92_861_700, 90_500_868),
}
# ours, recorded (docs/variable-rank.md section 8): total parameters at tiny, full or fixed rank
COUNTS_TINY = {"ASM_VR_R": 777_728, "ASM_VR_RS": 819_136, "ASM_VR_S": 837_165, "ASM_CM_VR": 878_148}
# the base each entry equals at full rank, with the settings that make the two the same model
BASES = {
    "ASM_VR_R": ("J_NO_DIRECTION", lambda c: dict(selective_memory=False)),
    "ASM_VR_RS": ("J_NO_DIRECTION", lambda c: {}),
    "ASM_VR_S": ("J_DIRECT_CONTROL", lambda c: dict(memory_hidden=c.memory_hidden)),
    "ASM_CM_VR": ("ASM_CM", lambda c: dict(fast_weight_value_dim=c.d_state)),
}
EPISTEMIC_BASES = {"ASM_CM_VR": ("ASM_CM_E", lambda c: dict(fast_weight_value_dim=c.d_state))}


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------------ counts
@pytest.mark.parametrize("name", VR_NAMES)
def test_parameter_counts_equal_upstream_at_its_preset(name):
    total, frozen = UPSTREAM_COUNTS[name]
    preset = dict(UPSTREAM_PRESET)
    if name == "ASM_VR_S":  # the width nearest ASM-CM's count at that preset (its memory 64 wide, like ours)
        target = closed_form_parameter_count(build_config("ASM_CM", "micro", **UPSTREAM_PRESET))
        assert target == 274_058
        preset["memory_hidden"] = matched_memory_width(build_config(name, "micro", **preset), target, "nearest")
        assert preset["memory_hidden"] == 465
    assert closed_form_parameter_count(build_config(name, "micro", **preset)) == total
    model = build_model(name, "micro", **preset)
    assert count_parameters(model) == total and trainable(model) == frozen
    assert trainable(build_model(name, "micro", rank_policy="adaptive", **preset)) == total


def test_vr_s_matched_to_vr_r_is_upstreams_308():
    target = closed_form_parameter_count(build_config("ASM_VR_R", "micro", **UPSTREAM_PRESET))
    width = matched_memory_width(build_config("ASM_VR_S", "micro", **UPSTREAM_PRESET), target, rule="nearest")
    assert width == 308
    overrides = dict(UPSTREAM_PRESET, memory_hidden=308)
    assert closed_form_parameter_count(build_config("ASM_VR_S", "micro", **overrides)) == 223_738


@pytest.mark.parametrize("name", VR_NAMES)
def test_parameter_counts_at_125m_and_ours(name):
    with torch.device("meta"):
        model = build_model(name, "125m")
    assert (count_parameters(model), trainable(model)) == COUNTS_125M[name]
    assert count_parameters(model) == closed_form_parameter_count(model.config)
    assert count_parameters(build_model(name, "tiny")) == COUNTS_TINY[name]
    for preset in ("micro", "small"):
        with torch.device("meta"):
            model = build_model(name, preset)
        assert count_parameters(model) == closed_form_parameter_count(model.config)
    controller = (model.config.d_token + 1) * model.config.d_state
    assert sum(p.numel() for p in model.rank_controller.parameters()) == controller


def test_parameter_count_of_the_rank_aware_memory_with_epistemic_gates():
    """ASM_CM_VR + the gates: ASM_CM_VR's count plus ASM_CM_E's four confidence MLPs, in closed form."""
    for preset in ("micro", "tiny", "small", "125m"):
        with torch.device("meta"):
            both = build_model("ASM_CM_VR", preset, **EPISTEMIC)
            vr, gates = build_model("ASM_CM_VR", preset), build_model("ASM_CM_E", preset)
            cm = build_model("ASM_CM", preset)
        assert count_parameters(both) == closed_form_parameter_count(both.config)
        assert count_parameters(both) - count_parameters(vr) == count_parameters(gates) - count_parameters(cm)


# ------------------------------------------------------------------------------------------ full rank
def _randomised(model, seed=0):
    """Every weight moved off its initialisation (W_o = 0 would hide the fast-weight memory)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("rank_controller."):
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("name, extra", VR_CASES)
def test_full_rank_is_the_base_model_bit_for_bit(name, extra):
    """Same seed, same weights: logits, stepped logits and every gradient are identical; the state dicts
    differ by the controller only."""
    vr = build_model(name, "micro", seed=5, **extra)
    base_name, settings = (EPISTEMIC_BASES if extra else BASES)[name]
    base = _randomised(build_model(base_name, "micro", seed=5, **settings(vr.config)))
    missing, unexpected = vr.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("rank_controller.") for k in missing)
    tokens = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(0))
    for model in (vr, base):
        model.train()
        out = model(tokens, step=7)
        out.logits.square().mean().backward()
    assert torch.equal(vr(tokens, step=7).logits, base(tokens, step=7).logits)
    base_grads = dict(base.named_parameters())
    for key, p in vr.named_parameters():
        if not key.startswith("rank_controller."):
            assert torch.equal(p.grad, base_grads[key].grad), key
    vr.eval(), base.eval()
    with torch.no_grad():
        assert torch.equal(vr(tokens).logits, base(tokens).logits)
        a, b = vr.init_state(2), base.init_state(2)
        for t in range(tokens.shape[1]):
            la, a = vr.step(tokens[:, t], a)
            lb, b = base.step(tokens[:, t], b)
            assert torch.equal(la, lb), t


# ------------------------------------------------------------------------------------------ the mask
def _varied(model, seed=0, scale=3.0):
    """A live controller: random scores, so the rank differs between examples and blocks."""
    g = torch.Generator().manual_seed(seed)
    head = model.rank_controller.score_head
    with torch.no_grad():
        head.weight.copy_(scale * torch.randn(head.weight.shape, generator=g, dtype=head.weight.dtype))
        head.bias.copy_(torch.randn(head.bias.shape, generator=g, dtype=head.bias.dtype))
    return model


def test_rank_counts_scores_over_the_threshold_clamped_to_the_minimum():
    model = build_model("ASM_VR_S", "micro", rank_policy="adaptive", rank_min=3, rank_threshold=0.6)
    controller = model.rank_controller
    logits = torch.tensor([[5.0] * 2 + [-5.0] * 14, [-5.0] * 10 + [5.0] * 6, [0.5] * 16, [0.3] * 16])
    # which coordinates pass does not matter, only how many; sigmoid(0.5) = 0.62 passes 0.6, 0.57 does not
    assert controller.ranks(logits).tolist() == [3, 6, 16, 3]
    fixed = build_model("ASM_VR_S", "micro", rank_policy="fixed", rank_fixed=7).rank_controller
    e = torch.randn(5, 16)
    assert fixed.ranks(fixed.logits(e)).tolist() == [7] * 5 and not fixed.trainable
    full = build_model("ASM_VR_S", "micro").rank_controller
    assert full.ranks(full.logits(e)).tolist() == [16] * 5 and not full.trainable
    adaptive = build_model("ASM_VR_S", "micro", rank_policy="adaptive").rank_controller
    assert adaptive.trainable and torch.allclose(torch.sigmoid(adaptive.logits(e)), torch.full((5, 16), 0.95))
    # a frozen policy's rank is its setting, whatever controller a checkpoint brings
    fixed.load_state_dict(
        _varied(build_model("ASM_VR_S", "micro", rank_policy="adaptive")).rank_controller.state_dict()
    )
    assert fixed.decide(e)[0].tolist() == [7] * 5 and fixed.decide(e)[1] is None
    assert torch.equal(adaptive.decide(e)[0], adaptive.ranks(adaptive.logits(e)))


@pytest.mark.parametrize("name, extra", VR_CASES)
def test_discarded_coordinates_are_zero_and_change_nothing(name, extra):
    """Every state is zero outside its block's prefix, in the forward and the decoding state, and a start
    state that differs only there gives the same logits; the gradient to it is exactly zero."""
    model = build_model(name, "micro", seed=2, rank_policy="adaptive", **extra)
    model = _varied(_randomised(model)).double().eval()
    tokens = torch.randint(0, 256, (3, 29), generator=torch.Generator().manual_seed(1))
    controller = model.rank_controller
    with torch.no_grad():  # every row starts with one token whose rank is neither the least nor full
        first_ranks = controller.ranks(controller.logits(model.embedding.weight))
        tokens[:, 0] = int(((first_ranks > 4) & (first_ranks < 16)).nonzero()[0, 0])
    out = model(tokens)
    ranks = out.aux["rank"].long()
    assert len(set(ranks.flatten().tolist())) > 2  # the ranks vary between examples and blocks
    states, _ = model.states(tokens)
    outside = torch.arange(16) >= ranks.unsqueeze(-1)
    assert outside.any() and (states[outside] == 0).all()
    first = int(ranks[0, 0])
    with torch.no_grad():  # z_0 differs only where the first block discards it
        model.initial_state.z0[first:] += 7.0
        assert torch.equal(model(tokens).logits, out.logits)
    z0 = model.initial_state.z0
    model(tokens).logits.sum().backward()
    assert (z0.grad[first:] == 0).all() and (z0.grad[:first] != 0).all()
    state = model.init_state(3)
    with torch.no_grad():
        for t in range(13):
            _, state = model.step(tokens[:, t], state)
    assert (state.z_start[torch.arange(16) >= state.rank.unsqueeze(-1)] == 0).all()


def test_a_dropped_coordinate_is_not_resurrected():
    """Rank 16 -> 4 -> 16: what the second block discards stays zero through it, in the states and in the
    memory's value columns, so the third block reopens those coordinates from zero."""
    model = _randomised(build_model("ASM_CM_VR", "micro", seed=3, rank_policy="adaptive")).double().eval()
    head = model.rank_controller.score_head
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    tokens[:, 8] = 7  # the second block's first token
    with torch.no_grad():
        head.bias.fill_(5.0)  # every score open, except for token 7, whose embedding drives all below: rank_min
        e7 = model.embedding.weight[7]
        head.weight.copy_(-20.0 * e7.unsqueeze(0).expand(16, -1) / e7.pow(2).sum())
        out = model(tokens)
        assert out.aux["rank"][:, ::8].tolist() == [[16.0, 4.0, 16.0]] * 2
        states, _ = model.states(tokens)
        assert (states[:, 8:16, 4:] == 0).all() and (states[:, 16:, 4:] != 0).any()
        memory = model(tokens[:, :16], return_state=True).state.stages[-1]
        assert (memory.fast[..., 4:] == 0).all() and (memory.slow[..., 4:] == 0).all()


def test_the_rank_reads_only_the_blocks_first_token_and_the_model_stays_causal():
    model = _varied(build_model("ASM_VR_RS", "micro", seed=1, rank_policy="adaptive")).double().eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 24), generator=g)
    base = model(tokens)
    changed = tokens.clone()
    changed[:, [1, 2, 9, 15, 20]] = torch.randint(0, 256, (2, 5), generator=g)
    assert torch.equal(model(changed).aux["rank"], base.aux["rank"])
    changed[:, 16] = (tokens[:, 16] + 1) % 256
    assert not torch.equal(model(changed).aux["rank"][:, 16:], base.aux["rank"][:, 16:])
    for t in (0, 7, 8, 15):
        later = tokens.clone()
        later[:, t + 1 :] = torch.randint(0, 256, later[:, t + 1 :].shape, generator=g)
        out = model(later).logits
        assert (out[:, : t + 1] - base.logits[:, : t + 1]).abs().max() == 0
        assert (out[:, t + 1 :] - base.logits[:, t + 1 :]).abs().max() > 0


def test_projection_selects_so_a_non_finite_value_outside_the_prefix_is_cleared():
    mask = RankMask.of(torch.tensor([2, 3]), 4, sliced=False)
    x = torch.tensor([[[1.0, 2.0, float("nan"), float("inf")]], [[1.0, 2.0, 3.0, float("-inf")]]])
    assert mask.project(x).tolist() == [[[1.0, 2.0, 0.0, 0.0]], [[1.0, 2.0, 3.0, 0.0]]]
    sliced = RankMask.of(torch.tensor([2, 3]), 4, sliced=True)
    assert sliced.width == 3 and sliced.sliced == 3
    assert sliced.enter(torch.ones(2, 4)).tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert RankMask.of(torch.tensor([4, 4]), 4, sliced=True).sliced is None  # full width: the plain path


# ------------------------------------------------------------------------------------------ training
def test_straight_through_gradient_reaches_the_controller_and_leaves_the_value():
    """CE alone (rank losses off): the forward value is the hard mask's, the controller gets a gradient;
    frozen policies get none and leave the optimizer's parameters."""
    model = _varied(_randomised(build_model("ASM_VR_S", "micro", seed=4, rank_policy="adaptive")))
    model.config.rank_budget_weight = model.config.rank_binary_weight = model.config.rank_switch_weight = 0.0
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hard = model(tokens, step=300).logits
    out = model(tokens, step=300)
    assert torch.equal(out.logits, hard)
    torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 256), tokens[:, 1:].reshape(-1)).backward()
    grad = model.rank_controller.score_head.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    fixed = build_model("ASM_VR_S", "micro", rank_policy="fixed", rank_fixed=8)
    fixed(tokens, step=3).logits.sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in fixed.rank_controller.parameters())


def test_curriculum_schedule():
    c = build_config("ASM_VR_S", "micro", rank_policy="adaptive")  # W 50, R 150, H 200, f 0.5, d 16
    lb, lbin, ls = c.rank_budget_weight, c.rank_binary_weight, c.rank_switch_weight
    s = rank_schedule(c, 10)
    assert (s.temperature, s.target, s.budget_weight, s.binary_weight, s.switch_weight) == (2.0, 16.0, 0, 0, 0)
    s = rank_schedule(c, 50 + 75)  # half-way up the ramp
    assert (s.temperature, s.target, s.binary_weight) == (2.0, 12.0, 0.0)
    assert math.isclose(s.budget_weight, lb / 2) and math.isclose(s.switch_weight, ls / 2)
    s = rank_schedule(c, 200 + 100)  # half-way through hardening
    assert s.target == 8.0 and math.isclose(s.temperature, 1.25) and math.isclose(s.binary_weight, lbin / 2)
    assert (s.budget_weight, s.switch_weight) == (lb, ls)
    for step in (400, 10_000, None):
        s = rank_schedule(c, step)
        assert (s.temperature, s.target, s.budget_weight, s.binary_weight) == (0.5, 8.0, lb, lbin)


def test_rank_losses_against_a_loop():
    g = torch.Generator().manual_seed(0)
    gates = torch.rand(3, 4, 16, generator=g, dtype=F64)
    c = build_config("ASM_VR_S", "micro", rank_policy="adaptive")
    schedule = rank_schedule(c, 260)
    got = rank_losses(gates, schedule)
    sums = [float(gates[b, k].sum()) for b in range(3) for k in range(4)]
    budget = (sum(sums) / len(sums) - schedule.target) ** 2
    binary = sum(float(x * (1 - x)) for x in gates.flatten()) / gates.numel()
    steps = [
        float((gates[b, k, i] - gates[b, k - 1, i]).abs()) for b in range(3) for k in range(1, 4) for i in range(16)
    ]
    switch = sum(steps) / len(steps)
    assert math.isclose(got["loss/rank_budget"].item(), budget, rel_tol=1e-12)
    assert math.isclose(got["loss/rank_binary"].item(), binary, rel_tol=1e-12)
    assert math.isclose(got["loss/rank_switch"].item(), switch, rel_tol=1e-12)
    total = schedule.budget_weight * budget + schedule.binary_weight * binary + schedule.switch_weight * switch
    assert math.isclose(got["loss_aux"].item(), total, rel_tol=1e-12)
    assert rank_losses(gates[:, :1], schedule)["loss/rank_switch"].item() == 0.0


def test_the_model_returns_the_rank_losses_of_the_step():
    model = _varied(build_model("ASM_VR_R", "micro", seed=1, rank_policy="adaptive"), scale=0.3)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(4))
    assert "loss_aux" not in build_model("ASM_VR_R", "micro")(tokens, step=300).aux  # full: no rank losses
    early = model(tokens, step=10).aux
    assert early["loss_aux"].item() == 0.0 and early["loss/rank_budget"].item() > 0
    aux = model(tokens, step=300).aux
    schedule = rank_schedule(model.config, 300)
    want = sum(
        w * aux[f"loss/rank_{k}"]
        for k, w in (
            ("budget", schedule.budget_weight),
            ("binary", schedule.binary_weight),
            ("switch", schedule.switch_weight),
        )
    )
    assert torch.allclose(aux["loss_aux"], want) and aux["loss_aux"].requires_grad
    aux["loss_aux"].backward()
    assert model.rank_controller.score_head.bias.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------ sliced
@pytest.mark.parametrize("name, extra", VR_CASES)
@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_sliced_equals_masked_in_float64(name, extra, policy):
    """The logits and, for the frozen policy, every gradient of the sliced form equal the masked form's
    (float64); the adaptive controller is compared in evaluation (it cannot be trained sliced)."""
    settings = dict(rank_policy=policy, rank_fixed=5) if policy == "fixed" else dict(rank_policy="adaptive")
    models = {}
    for compute in ("masked", "sliced"):
        model = build_model(name, "micro", seed=6, rank_compute=compute, **settings, **extra)
        model = _randomised(model, seed=1)
        models[compute] = (_varied(model) if policy == "adaptive" else model).double()
    tokens = torch.randint(0, 256, (3, 27), generator=torch.Generator().manual_seed(5))
    masked, sliced = models["masked"], models["sliced"]
    with torch.no_grad():
        want = masked.eval()(tokens)
        got = sliced.eval()(tokens)
    assert torch.equal(want.aux["rank"], got.aux["rank"])
    assert (got.logits - want.logits).abs().max() <= 1e-12 * want.logits.abs().max()
    for key in ("fast_weight_read_confidence", "fast_weight_write_confidence"):  # the epistemic gates' c^r, c^w
        assert (key in got.aux) == bool(extra) == (key in want.aux)
        if extra:
            assert (got.aux[key] - want.aux[key]).abs().max() <= 1e-12
            assert want.aux[key].std() > 0  # randomised: the confidences vary over the positions
    assert (sliced.states(tokens)[0] - masked.states(tokens)[0]).abs().max() <= 1e-12
    if policy == "fixed":
        for model in (masked, sliced):
            model.train()
            model(tokens, step=3).logits.square().mean().backward()
        grads = dict(masked.named_parameters())
        for key, p in sliced.named_parameters():
            if p.requires_grad:
                assert (p.grad - grads[key].grad).abs().max() <= 1e-12 * max(1.0, grads[key].grad.abs().max()), key
    else:
        with pytest.raises(ValueError, match="rank_compute='sliced' cannot train the adaptive controller"):
            sliced.train()(tokens, step=3)


@pytest.mark.parametrize("name", ["ASM_VR_RS", "ASM_CM_VR"])
@pytest.mark.parametrize("option", [dict(metric="pullback"), dict(metric_diagonal="relu")], ids=["pullback", "relu"])
def test_sliced_equals_masked_under_the_metric_options(name, option):
    """The metric options (docs/geometry.md 8, 9) under a fixed rank of 5, float64: sliced logits equal the
    masked ones to 1e-12 (the pullback metric reads the sliced state zero-padded), stepping equals the
    parallel pass to 1e-10 in both forms."""
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    logits = {}
    for compute in ("masked", "sliced"):
        model = build_model(name, "micro", seed=6, rank_policy="fixed", rank_fixed=5, rank_compute=compute, **option)
        model = _randomised(model, seed=3).double().eval()
        with torch.no_grad():
            logits[compute] = model(tokens).logits
            state, stepped = model.init_state(2), []
            for t in range(tokens.shape[1]):
                step_logits, state = model.step(tokens[:, t], state)
                stepped.append(step_logits)
        assert (torch.stack(stepped, 1) - logits[compute]).abs().max() <= 1e-10 * logits[compute].abs().max()
    assert (logits["sliced"] - logits["masked"]).abs().max() <= 1e-12 * logits["masked"].abs().max()


@pytest.mark.parametrize("name, extra", VR_CASES)
@pytest.mark.parametrize("compute", ["masked", "sliced"])
def test_stepping_and_prefill_with_varying_ranks(name, extra, compute):
    """float64, 1e-10: stepping reproduces the parallel logits with ranks that change between examples
    and blocks; the prefilled state equals the stepped one at every length (a short final block
    included) and has one size at every block phase."""
    model = build_model(name, "micro", seed=7, rank_policy="adaptive", rank_compute=compute, **extra)
    model = _varied(_randomised(model))
    model = model.double().eval()
    tokens = torch.randint(0, 256, (3, 29), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        parallel = model(tokens).logits
        state, stepped, sizes = model.init_state(3), [], {}
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            stepped.append(logits)
            if t + 1 in (5, 16, 21, 24):
                prefilled = model(tokens[:, : t + 1], return_state=True).state
                assert torch.equal(prefilled.rank, state.rank) if state.rank is not None else prefilled.rank is None
                assert (prefilled.z_start - state.z_start).abs().max() <= 1e-10
                assert state_nbytes(prefilled) == state_nbytes(state)
                sizes.setdefault(state.position, set()).add(state_nbytes(state) if compute == "masked" else 0)
        assert (torch.stack(stepped, 1) - parallel).abs().max() <= 1e-10 * max(1.0, parallel.abs().max())
    assert all(len(v) == 1 for v in sizes.values())  # 16 and 24 are block edges: the same bytes


def test_state_bytes():
    """The decoding state at a block edge is z_start (d_state floats) plus the crossing memory's; inside a
    block the rank [B] int64 is added. ASM_VR_S at tiny, batch 1, float32: 512 B at an edge."""
    tokens = torch.randint(0, 256, (1, 64 * 3 + 5), generator=torch.Generator().manual_seed(0))
    for name, edge in (("ASM_VR_S", 128 * 4), ("ASM_CM_VR", 128 * 4 + 2 * 64 * 128 * 4 + 128 * 4)):
        model = build_model(name, "tiny").eval()
        with torch.no_grad():
            at_edge = [state_nbytes(model(tokens[:, :n], return_state=True).state) for n in (64, 128, 192)]
            assert at_edge == [edge] * 3
            inside = state_nbytes(model(tokens, return_state=True).state)
            assert inside > edge


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "variant, overrides, match",
    [
        ("J", dict(rank_policy="full"), "does not compose with the direction field"),
        ("SSM_CONTROL", dict(rank_policy="full"), "needs the direct transition"),
        ("ASM_VR_S", dict(rank_policy="fixed", rank_fixed=17), r"rank_fixed \(17\) exceeds d_state \(16\)"),
        ("ASM_VR_S", dict(rank_policy="fixed", rank_fixed=3), r"rank_fixed \(3\) is below rank_min \(4\)"),
        ("ASM_VR_S", dict(rank_policy="fixed"), r"rank_fixed \(0\) is below rank_min"),
        ("ASM_VR_S", dict(rank_min=0), "rank_min must be in"),
        ("ASM_VR_S", dict(rank_min=17), "rank_min must be in"),
        ("ASM_VR_S", dict(rank_policy="sometimes"), "rank_policy must be one of"),
        ("ASM_VR_S", dict(rank_compute="sparse"), "rank_compute must be"),
        ("ASM_VR_S", dict(rank_threshold=1.0), "rank_threshold must be in"),
        ("ASM_VR_S", dict(rank_target_fraction=0.0), "rank_target_fraction must be in"),
        ("ASM_VR_S", dict(rank_temperature_final=0.0), "rank_temperature_final must be"),
        ("ASM_VR_S", dict(rank_budget_weight=-1.0), "rank_budget_weight must be"),
        ("ASM_VR_S", dict(rank_warmup_steps=-1), "rank_warmup_steps must be"),
        ("ASM_VR_S", dict(rank_aware_memory=True), "needs the fast-weight backend"),
        ("ASM_CM", dict(rank_policy="full"), "needs rank_aware_memory=True"),
        ("ASM_CM", dict(rank_aware_memory=True), "needs rank_policy other than 'off'"),
        ("ASM_CM_VR", dict(fast_weight_value_dim=8), "fast_weight_value_dim equal to d_state"),
        ("ASM_VR_R", dict(refinement_layers=1), "refuses refinement_layers=1"),
        ("ASM_VR_R", dict(block_solver="fixed_point"), "refuses block_solver='fixed_point'"),
        ("ASM_VR_R", dict(step_mode="geodesic"), "refuses step_mode='geodesic'"),
        ("ASM_VR_R", dict(toroidal_dims=2), "refuses toroidal_dims=2"),
        ("ASM_VR_R", dict(loss_weights={"block_consistency": 1.0}), "refuses the block-consistency"),
        (
            "ASM_VR_R",
            dict(sequence_mode="recurrent", mixer="none", token_state_residual=False),
            "refuses sequence_mode='recurrent'",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line(variant, overrides, match):
    with pytest.raises(ValueError, match=match) as error:
        build_config(variant, "micro", **overrides)
    assert "\n" not in str(error.value)


def test_derived_settings_follow_the_callers_dimensions():
    config = build_config("ASM_CM_VR", "micro", d_state=24)
    assert (config.rank_min, config.fast_weight_value_dim) == (6, 24)
    assert build_config("ASM_VR_S", "tiny").rank_min == 32
    assert build_config("ASM_VR_S", "tiny", rank_min=2).rank_min == 2


def test_cli_trains_a_vr_model_with_set_and_refuses_bad_rank_in_one_line(tmp_path, capsys, monkeypatch):
    from drmlab.cli import main

    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i}" for i in range(300)))
    common = ["train", "--model", "ASM_VR_S", "--preset", "micro", "--data", str(text), "--quiet"]
    args = common + ["--tokens", "1024", "--eval-tokens", "256", "--out", str(tmp_path / "run")]
    assert main(args + ["--set", "rank_policy=fixed", "--set", "rank_fixed=8"]) == 0
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "bad"), "--set", "rank_policy=fixed", "--set", "rank_fixed=99"]) == 2
    err = capsys.readouterr().err.strip()
    assert "rank_fixed (99) exceeds d_state (16)" in err and len(err.splitlines()) == 1
