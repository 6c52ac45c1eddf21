"""The DRM metric options of ``docs/geometry.md`` sections 8 and 9, in float64: the degenerate floor
(``metric_diagonal``) with its exact zeros, exact rank and pseudo-inverse naturalization against a dense
SVD; ``metric="pullback"`` with the closed-form emitter Jacobian against autodiff, its metric against
``drmlab.geometry.pullback_metric`` and its naturalization (both solve paths) against a dense solve;
parameter counts, step equivalence, causality, finite training gradients and the refusals.
(The default floor reproducing today's models bit for bit: ``tools/fingerprint.py``.)"""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev, vmap

from drmlab.geometry.metric import kernel_split
from drmlab.geometry.pullback import pullback_metric
from drmlab.models import build_model, count_parameters
from drmlab.models.drm import closed_form_parameter_count
from drmlab.models.drm.components import naturalize
from drmlab.models.drm.metric_options import emitter_jacobian
from drmlab.ops import exact_rank, kernel_project, metric_dense

DEGENERATE = ("softplus", "relu", "none")
OPTIONS = [dict(metric_diagonal=k) for k in DEGENERATE] + [dict(metric="pullback")]


def _model(name="J", **overrides):
    return build_model(name, preset="micro", seed=2, **overrides).double().eval()


def _states(model, count=6, seed=0):
    return torch.randn(count, model.config.d_state, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@torch.no_grad()
def _naturalized_and_raw(model, z, strength=0.5, seed=1):
    """The transition's velocity at states z [N, d] for random tokens: (naturalized, raw u) [N, L, d]."""
    f = model.transition
    tokens = torch.randint(0, model.config.vocab_size, (z.shape[0], 3), generator=torch.Generator().manual_seed(seed))
    part = f.token_part(model.embedding(tokens))
    geometry = f.geometry_at(z)
    return f.velocity(z, geometry, part, strength), f.velocity(z, geometry, part, 0.0), geometry


def _dense_pinv(g, damping):
    left, sigma, _ = torch.linalg.svd(g)
    keep = (sigma > 1e-12 * sigma[..., :1]).to(g.dtype)
    return (left * (keep / (sigma + damping)).unsqueeze(-2)) @ left.mT


def test_default_floor_keeps_the_section_5_solve():
    assert _model().transition.naturalize is naturalize


@pytest.mark.parametrize("diagonal", DEGENERATE)
def test_degenerate_floor_naturalizes_through_the_damped_pseudo_inverse(diagonal):
    model = _model(metric_diagonal=diagonal)
    z = _states(model)
    v, u, geometry = _naturalized_and_raw(model, z)
    gamma, u_factor = geometry[2], geometry[3]
    s, lam = 0.5, model.config.metric_damping
    want = (1 - s) * u + s * u @ _dense_pinv(metric_dense(gamma, u_factor), lam)
    assert float((v - want).abs().max() / want.abs().max()) < 1e-10
    # the naturalized part has no component in the kernel of G
    assert float(kernel_project(gamma, u_factor, (v - (1 - s) * u) / s).abs().max()) < 1e-12


@torch.no_grad()
def test_relu_floor_has_exact_zeros_a_kernel_and_its_exact_rank():
    model = _model(metric_diagonal="relu")
    c = model.config
    gamma, u_factor = model.metric(model.read(_states(model, 32)))
    zeros = (gamma == 0).sum(-1)
    assert bool((zeros > c.metric_rank).any())  # a genuine kernel somewhere at init
    ranks = exact_rank(gamma, u_factor)
    assert ranks.tolist() == (c.d_state - zeros + zeros.clamp(max=c.metric_rank)).tolist()
    assert ranks.tolist() == torch.linalg.matrix_rank(metric_dense(gamma, u_factor), hermitian=True).tolist()
    assert ranks.tolist() == [kernel_split(g, u).rank for g, u in zip(gamma, u_factor)]
    g = metric_dense(gamma, u_factor)
    eye = torch.eye(c.d_state, dtype=torch.float64).expand(gamma.shape[0], -1, -1)
    p = kernel_project(gamma, u_factor, eye)
    assert float((g @ p).norm() / g.norm()) < 1e-12


@torch.no_grad()
def test_low_rank_metric_is_u_u_transpose_of_rank_r():
    model = _model(metric_diagonal="none")
    assert model.metric.diag_head is None
    gamma, u_factor = model.metric(model.read(_states(model)))
    assert torch.equal(gamma, torch.zeros_like(gamma))
    assert exact_rank(gamma, u_factor).tolist() == [model.config.metric_rank] * gamma.shape[0]
    sigma = torch.linalg.eigvalsh(metric_dense(gamma, u_factor))
    assert float(sigma[:, : -model.config.metric_rank].abs().max() / sigma.max()) < 1e-12


def test_emitter_jacobian_in_closed_form_against_autodiff():
    model = _model(toroidal_dims=3)
    x = model.read(_states(model))
    logits, jac = emitter_jacobian(model.emitter, x)
    assert float((logits - model.emitter(x)).abs().max()) < 1e-12
    auto = vmap(jacrev(model.emitter))(x)
    assert float((jac - auto).abs().max() / auto.abs().max()) < 1e-12


@pytest.mark.parametrize("toroidal_dims", [0, 3])
def test_pullback_metric_equals_the_geometry_pullback(toroidal_dims):
    model = _model(metric="pullback", toroidal_dims=toroidal_dims)
    z = _states(model)
    gamma, u_factor = model.transition.metric(model.read(z))
    assert torch.equal(gamma, torch.zeros_like(gamma)) and u_factor.shape == (6, 16, 256)
    want = pullback_metric(lambda s: model.emitter(model.read(s)), z)
    assert float((metric_dense(gamma, u_factor) - want).abs().max() / want.abs().max()) < 1e-12


@pytest.mark.parametrize("vocab_size", [256, 9])  # V >= d: the dense d x d solve; V < d: the Woodbury solve
@pytest.mark.parametrize("name", ["J", "J_NO_DIRECTION"])
def test_pullback_naturalization_against_a_dense_solve(vocab_size, name):
    model = build_model(name, preset="micro", seed=2, vocab_size=vocab_size, metric="pullback").double().eval()
    z = _states(model)
    v, u, _ = _naturalized_and_raw(model, z)
    g = pullback_metric(lambda s: model.emitter(model.read(s)), z)
    lam, s = model.config.metric_damping, 0.5
    solved = torch.linalg.solve(g + lam * torch.eye(g.shape[-1], dtype=g.dtype), u.mT).mT
    want = (1 - s) * u + s * solved
    assert float((v - want).abs().max() / want.abs().max()) < 1e-10


@pytest.mark.parametrize("overrides", OPTIONS, ids=str)
def test_parameter_count_and_step_equivalence(overrides):
    model = _model(**overrides)
    assert count_parameters(model) == closed_form_parameter_count(model.config)
    tokens = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        parallel = model(tokens).logits
        state, stepped = model.init_state(2), []
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            stepped.append(logits)
    assert float((parallel - torch.stack(stepped, 1)).abs().max()) < 1e-10 * max(1.0, float(parallel.abs().max()))


@pytest.mark.parametrize("overrides", OPTIONS, ids=str)
def test_prefix_causality(overrides):
    model = _model(**overrides)
    tokens = torch.randint(0, 256, (1, 19), generator=torch.Generator().manual_seed(5))
    changed = tokens.clone()
    changed[0, 12:] = (changed[0, 12:] + 7) % 256
    with torch.no_grad():
        a, b = model(tokens).logits, model(changed).logits
    assert torch.equal(a[:, :12], b[:, :12])


def test_pullback_metric_in_the_metric_first_composition_and_geodesic_step():
    for overrides in (dict(directional_metric_composition="metric_subspace"), dict(step_mode="geodesic")):
        model = _model(metric="pullback", **overrides)
        assert torch.isfinite(model(torch.randint(0, 256, (2, 12))).logits).all()


@pytest.mark.parametrize("overrides", OPTIONS, ids=str)
def test_training_gradients_are_finite(overrides):
    model = build_model("J", preset="micro", seed=2, **overrides).train()
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(6))
    logits = model(tokens[:, :-1], step=10_000).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    if overrides.get("metric") == "pullback":  # the naturalization's gradient reaches the emitter through G_pb
        assert model.metric is None and float(grads["emitter.fc1.weight"].abs().sum()) > 0
    else:
        assert float(grads["metric.u_head.weight"].abs().sum()) > 0


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(metric_diagonal="relu", name="J_NO_METRIC"), "metric_diagonal='relu' needs a metric"),
        (dict(metric="pullback", name="J_NO_METRIC"), "metric='pullback' needs a metric"),
        (dict(metric_diagonal="none", name="SSM_CONTROL"), "needs a metric"),
        (dict(metric_diagonal="relu", metric_rank=17), r"metric_rank \(17\) exceeds d_state \(16\)"),
        (dict(metric_damping=-0.1), "metric_damping must be >= 0"),
        (dict(metric_damping=float("nan")), "metric_damping must be a finite number"),
        (dict(metric_diagonal="relu", metric_damping=0.0), "metric_damping must be > 0 with metric_diagonal"),
        (dict(metric="pullback", metric_damping=0.0), "metric_damping must be > 0 with metric='pullback'"),
        (dict(metric_diagonal="exp"), "metric_diagonal must be one of"),
        (dict(metric="fisher"), "metric must be one of"),
        (dict(metric="pullback", metric_diagonal="relu"), "metric='pullback' has none"),
        (dict(metric_diagonal="none", metric_rank=0), "needs metric_rank >= 1"),
        (dict(metric_diagonal="relu", metric_rank=6, metric_u_basis_size=4), "rank-deficient by construction"),
        (dict(metric_diagonal="relu", directional_metric_composition="metric_subspace"), "damped pseudo-inverse"),
        (dict(metric_diagonal="relu", name="G"), "refinement layers"),
        (dict(metric="pullback", loss_weights={"metric_reg": 0.1}), "'metric_reg' regularises the relational"),
        (dict(metric_diagonal="relu", loss_weights={"condition": 0.1}), "'condition' penalises cond G"),
    ],
)
def test_bad_settings_are_one_line_value_errors(overrides, match):
    overrides = dict(overrides)
    name = overrides.pop("name", "J")
    with pytest.raises(ValueError, match=match) as info:
        build_model(name, preset="micro", **overrides)
    assert "\n" not in str(info.value)
