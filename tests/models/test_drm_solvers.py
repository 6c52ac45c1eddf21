"""DRM solver options (``docs/drm.md`` section 14 and appendix S): step modes, block refiners,
consistency losses -- causality, convergence to the sequential rollout, stepping, refusals."""

import pytest
import torch

from drmlab.models import build_model
from drmlab.models.drm import solvers

MODES = [
    dict(step_mode="candidate", candidate_scale=0.5),
    dict(step_mode="geodesic"),
    dict(block_solver="fixed_point", solver_iters=3),
    dict(block_solver="anderson", solver_iters=3),
    dict(step_mode="candidate", block_solver="anderson", solver_iters=3, anderson_history=2),
    dict(step_mode="geodesic", block_solver="fixed_point", solver_iters=2),
]


def _ids(mode):
    return "-".join(f"{k}={v}" for k, v in mode.items())


def _prefix_change(model, length=21, t=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (2, length), generator=gen)
    changed = tokens.clone()
    changed[:, t + 1 :] = torch.randint(0, 256, changed[:, t + 1 :].shape, generator=gen)
    with torch.no_grad():
        a, b = model(tokens).logits, model(changed).logits
    return (a[:, : t + 1] - b[:, : t + 1]).abs().max().item(), tokens


@pytest.mark.parametrize("mode", MODES, ids=_ids)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_causal_solver_paths_keep_prefix_causality(mode, dtype, tol):
    model = build_model("J", preset="micro", seed=1, **mode).to(dtype)
    for t in (3, 7, 8, 12):  # micro blocks are 8 long: inside, at and past an edge
        moved, _ = _prefix_change(model, t=t)
        assert moved <= tol


def test_global_anderson_leaks_the_future_and_other_rows():
    """Planted negative: the global form (comparison only) is not causal."""
    # a larger step makes the within-block dynamics clearly nonlinear, so the leak is large
    model = build_model(
        "J", preset="micro", seed=1, block_solver="anderson", solver_iters=3, solver_causal=False, dt=1.0
    ).double()
    moved, tokens = _prefix_change(model, t=3)
    assert moved > 1e-5
    causal = build_model("J", preset="micro", seed=1, block_solver="anderson", solver_iters=3, dt=1.0).double()
    assert _prefix_change(causal, t=3)[0] <= 1e-12
    # and a change in batch row 1 moves row 0
    other = tokens.clone()
    other[1] = (other[1] + 1) % 256
    with torch.no_grad():
        assert (model(tokens).logits[0] - model(other).logits[0]).abs().max() > 1e-9
    with pytest.raises(ValueError, match="cannot be stepped"):
        model.step(tokens[:, 0], model.init_state(2))


def test_endpoint_correction_is_refused_and_its_leak_is_pinned():
    with pytest.raises(ValueError, match="not causal"):
        build_model("J", preset="micro", endpoint_correction_weight=0.5)
    # the reference formula moves earlier positions when only the block's last token changes
    model = build_model("J", preset="micro", seed=0, mixer="none").double()
    length = 8
    tokens = torch.randint(0, 256, (1, length))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 7) % 256

    def corrected(tok):
        states, _ = model.states(tok)
        token_part = model.transition.token_part(model.embedding(tok))
        target = model.transition.one_token(states[:, -2], token_part[:, -1], 0.5)
        return solvers.reference_endpoint_correction(states, target, 0.5, 1.0, model.bound)

    with torch.no_grad():
        a, b = corrected(tokens), corrected(changed)
    assert (a[:, : length - 1] - b[:, : length - 1]).abs().max() > 1e-9


@pytest.mark.parametrize("step_mode", ["velocity", "candidate", "geodesic"])
def test_fixed_point_converges_to_the_bounded_sequential_rollout(step_mode):
    length = 8
    model = build_model(
        "J",
        preset="micro",
        seed=2,
        mixer="none",
        token_state_residual=False,
        selective_memory=False,
        block_size=length,
        block_solver="fixed_point",
        solver_iters=length,
        step_mode=step_mode,
    ).double()
    tokens = torch.randint(0, 256, (2, length))
    with torch.no_grad():
        states, _ = model.states(tokens)
        token_part = model.transition.token_part(model.embedding(tokens))
        rollout = model.transition.rollout(model.initial_state(2).double(), token_part, 0.5)
    assert (states - model.bound(rollout)).abs().max() <= 1e-8


def test_refinement_distance_to_rollout_falls_with_iterations():
    length = 8
    tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(3))
    distances = {}
    for solver in ("fixed_point", "anderson"):
        for iters in (1, 2, 4, 8):
            model = build_model(
                "J",
                preset="micro",
                seed=2,
                mixer="none",
                token_state_residual=False,
                selective_memory=False,
                block_size=length,
                block_solver=solver,
                solver_iters=iters,
            ).double()
            with torch.no_grad():
                states, _ = model.states(tokens)
                token_part = model.transition.token_part(model.embedding(tokens))
                rollout = model.bound(model.transition.rollout(model.initial_state(2).double(), token_part, 0.5))
            distances[solver, iters] = (states - rollout).abs().max().item()
    fp = [distances["fixed_point", k] for k in (1, 2, 4, 8)]
    assert fp == sorted(fp, reverse=True) and fp[-1] < 1e-10
    assert distances["anderson", 8] < distances["anderson", 1]


@pytest.mark.parametrize("mode", MODES + [dict()], ids=_ids)
def test_stepping_equals_parallel_forward_for_every_mode(mode):
    model = build_model("J", preset="micro", seed=4, **mode).double().eval()
    tokens = torch.randint(0, 256, (2, 19))
    with torch.no_grad():
        parallel = model(tokens).logits
        state, outs = model.init_state(2), []
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            outs.append(logits)
    assert (parallel - torch.stack(outs, 1)).abs().max() <= 1e-10


@pytest.mark.parametrize(
    "mode",
    [
        dict(step_mode="candidate"),
        dict(step_mode="geodesic"),
        dict(block_solver="fixed_point"),
        dict(block_solver="anderson"),
    ],
    ids=_ids,
)
def test_solvers_finite_at_t4096(mode):
    model = build_model("J", preset="micro", seed=5, solver_iters=2, **mode)
    with torch.no_grad():
        out = model(torch.randint(0, 256, (1, 4096)))
    assert torch.isfinite(out.logits).all()


def test_consistency_losses_and_solver_diagnostics():
    model = build_model(
        "J",
        preset="micro",
        seed=6,
        block_solver="anderson",
        solver_iters=2,
        loss_weights={"block_consistency": 0.1, "sampled_block_consistency": 0.1},
    )
    out = model(torch.randint(0, 256, (2, 24)))
    aux = out.aux
    assert aux["solver_iterations"].item() == 2
    assert torch.isfinite(aux["solver_residual"]) and torch.isfinite(aux["refined_action"])
    assert aux["loss/block_consistency"] > 0 and aux["loss/sampled_block_consistency"] > 0
    aux["loss_aux"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "variant, overrides, match",
    [
        ("J_NO_DIRECTION", dict(step_mode="candidate"), "direction field"),
        ("SSM_CONTROL", dict(block_solver="anderson"), "geometry"),
        ("J", dict(step_mode="newton"), "step_mode"),
        ("J", dict(block_solver="gmres"), "block_solver"),
        ("J", dict(block_solver="fixed_point", solver_iters=0), "solver_iters"),
    ],
)
def test_bad_solver_configs(variant, overrides, match):
    with pytest.raises(ValueError, match=match):
        build_model(variant, preset="micro", **overrides)


def test_other_variants_accept_the_solver_overrides():
    for variant in ("J_NO_METRIC", "J_NO_DIRECTION", "A", "G"):
        model = build_model(variant, preset="micro", step_mode="geodesic", block_solver="fixed_point", solver_iters=2)
        assert torch.isfinite(model(torch.randint(0, 256, (1, 12))).logits).all()
