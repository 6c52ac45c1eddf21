"""The metric-first compositions of ``docs/drm.md`` section U (J_METRIC_SUBSPACE = ASM-U,
J_METRIC_ORTHONORMAL_DIRECTION = ASM-F): the frame against a dense float64 formula written out with
numpy (forward) and with plain dense torch.linalg (gradients), s = 0 reducing to unnaturalised J, the
solve and Cholesky fallbacks (whole batch for ASM-U, per sample for ASM-F), the value-free form taken
under ``torch.compile``, float32 under bf16 autocast, and the configuration's refusals.
(Parameter counts, causality and step equivalence: ``test_drm_models.py``, ``test_step_equivalence.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from drmlab.models import build_model
from drmlab.models.drm import build_config
from drmlab.models.drm.components import (
    CHOLESKY_RETRY_MULTIPLIERS,
    compose_metric_first,
    damped_direction_gram,
    metric_first_frame,
    metric_orthonormal_frame,
    metric_subspace_frame,
)

COMPOSITIONS = ("metric_subspace", "metric_orthonormal")
VARIANT = {"metric_subspace": "J_METRIC_SUBSPACE", "metric_orthonormal": "J_METRIC_ORTHONORMAL_DIRECTION"}
DAMPING = 0.3


def _example(batch=3, positions=5, n=4, d=7, r=2, seed=0):
    """A tiny geometry in float64: unit directions V [B, n, d], gates [B, n], coefficients [B, L, n],
    gamma [B, d], U [B, d, r]."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    gates = torch.sigmoid(torch.randn(batch, n, generator=g, dtype=torch.float64))
    coeff = torch.tanh(torch.randn(batch, positions, n, generator=g, dtype=torch.float64))
    gamma = torch.nn.functional.softplus(torch.randn(batch, d, generator=g, dtype=torch.float64)) + 1e-4
    u_factor = torch.randn(batch, d, r, generator=g, dtype=torch.float64) / np.sqrt(r)
    return directions, gates, coeff, gamma, u_factor


def _dense_numpy(composition, directions, gates, coeff, gamma, u_factor, strength):
    """Section U written out per sample and position: K = V G V^T + lambda I with the dense G, then
    v_metric = V^T K^-1 w (ASM-U) or W^T w with W = L^-1 V, K = L L^T (ASM-F); v = (1-s) V^T w + s v_metric."""
    out = []
    for V, a, c, gam, U in zip(*(t.detach().numpy() for t in (directions, gates, coeff, gamma, u_factor))):
        metric = np.diag(gam) + U @ U.T
        k = V @ metric @ V.T + DAMPING * np.eye(V.shape[0])
        rows = []
        for c_t in c:
            w = a * c_t
            if composition == "metric_subspace":
                v_metric = V.T @ np.linalg.solve(k, w)
            else:
                v_metric = np.linalg.solve(np.linalg.cholesky(k), V).T @ w
            rows.append((1 - strength) * (V.T @ w) + strength * v_metric)
        out.append(rows)
    return torch.tensor(np.array(out))


def _dense_torch(composition, directions, gates, coeff, gamma, u_factor, strength):
    """The same formula in plain dense torch.linalg (differentiable), for the gradients."""
    metric = torch.diag_embed(gamma) + u_factor @ u_factor.mT
    k = directions @ metric @ directions.mT + DAMPING * torch.eye(directions.shape[-2], dtype=directions.dtype)
    w = coeff * gates.unsqueeze(-2)  # [B, L, n]
    if composition == "metric_subspace":
        v_metric = (directions.mT @ torch.linalg.solve(k, w.mT)).mT
    else:
        frame = torch.linalg.solve(torch.linalg.cholesky(k), directions)
        v_metric = w @ frame
    return (1 - strength) * (w @ directions) + strength * v_metric


def _composed(composition, directions, gates, coeff, gamma, u_factor, strength):
    frame = metric_first_frame(directions, gamma, u_factor, DAMPING, composition)
    return compose_metric_first(gates, coeff, directions, frame, strength)


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_composition_equals_the_dense_float64_formula_forward_and_backward(composition):
    inputs = [t.requires_grad_() for t in _example()]
    ours = _composed(composition, *inputs, 0.5)
    assert (ours.detach() - _dense_numpy(composition, *inputs, 0.5)).abs().max() <= 1e-12
    reference = _dense_torch(composition, *inputs, 0.5)
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * weights).sum(), inputs)
    reference_grads = torch.autograd.grad((reference * weights).sum(), inputs)
    for name, a, b in zip(("directions", "gates", "coeff", "gamma", "U"), ours_grads, reference_grads):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item()), name
    # the velocity lies in span(V): its component orthogonal to the directions vanishes
    q, _ = torch.linalg.qr(inputs[0].detach().mT)  # [B, d, n] orthonormal basis of span(V)
    residual = ours.detach() - (ours.detach() @ q) @ q.mT
    assert residual.abs().max() <= 1e-12


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_the_model_velocity_is_the_dense_formula_at_its_geometry(composition):
    """Transition.velocity of the registered variant, float64 at micro, against the dense formula at the
    geometry and flow coefficients the model computes (the wiring, not only the helper)."""
    model = build_model(VARIANT[composition], "micro", seed=4).double()
    g = torch.Generator().manual_seed(2)
    z = 0.5 * torch.randn(2, model.config.d_state, generator=g, dtype=torch.float64)
    token_part = model.flow.token_part(model.embedding(torch.randint(0, 256, (2, 6), generator=g)))
    geometry = model.transition.geometry_at(z)
    gates, directions, gamma, u_factor, _ = geometry
    strength = model.naturalization_strength(None)
    with torch.no_grad():
        velocity = model.transition.velocity(z, geometry, token_part, strength)
        coeff = model.flow(model.read(z).unsqueeze(-2), token_part)
        expected = _dense_numpy(composition, directions, gates, coeff, gamma, u_factor, strength)
    assert strength == 0.5 and (velocity - expected).abs().max() <= 1e-12


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_strength_zero_is_unnaturalised_j(composition):
    tokens = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(3))
    metric_first = build_model(VARIANT[composition], "micro", seed=5)
    unnaturalised = build_model("J_NO_NATURALIZATION", "micro", seed=5)
    j = build_model("J", "micro", seed=5)
    at_step_zero = metric_first(tokens, step=0).logits  # the warm-up's s = 0
    assert torch.equal(at_step_zero, unnaturalised(tokens).logits)
    assert torch.equal(at_step_zero, j(tokens, step=0).logits)
    off = build_model(VARIANT[composition], "micro", seed=5, use_metric_naturalization=False)
    assert torch.equal(off(tokens).logits, unnaturalised(tokens).logits)
    # and at s > 0 the composition does change the function
    assert not torch.allclose(metric_first(tokens).logits, unnaturalised(tokens).logits)
    helper = _example()
    assert torch.equal(
        compose_metric_first(helper[1], helper[2], helper[0], None, 0.0),
        (helper[2] * helper[1].unsqueeze(-2)) @ helper[0],
    )


def _failing_batch(n=4, d=6):
    """K_lambda for four samples: positive definite; indefinite but finite (diag(-1, 1, ...): the
    retry m = 10 is the first to factor, lambda m = 3); indefinite beyond every retry
    (diag(-1000, ...)); non-finite. Plus directions V with an infinite entry in the last sample."""
    g = torch.Generator().manual_seed(6)
    good = torch.randn(n, n, generator=g, dtype=torch.float64)
    good = good @ good.T + DAMPING * torch.eye(n, dtype=torch.float64)
    indefinite = torch.diag(torch.tensor([-1.0, 1.0, 2.0, 3.0], dtype=torch.float64))
    hopeless = torch.diag(torch.tensor([-1000.0, 1.0, 2.0, 3.0], dtype=torch.float64))
    broken = good.clone()
    broken[0, 1] = broken[1, 0] = float("nan")
    k = torch.stack([good, indefinite, hopeless, broken])
    directions = torch.randn(4, n, d, generator=g, dtype=torch.float64)
    directions[3, 0, 0] = float("inf")
    return k, directions


def _value_free(monkeypatch):
    """Take the branch ``torch.compile`` takes (no data-dependent Python branch)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "value_free"])
def test_orthonormal_fallback_is_per_sample(traced, monkeypatch):
    k, directions = _failing_batch()
    alone = metric_orthonormal_frame(k[:1], directions[:1], DAMPING)  # the good sample by itself (fast path)
    k.requires_grad_()
    directions.requires_grad_()
    if traced:
        _value_free(monkeypatch)
    frame = metric_orthonormal_frame(k, directions, DAMPING)
    assert (
        torch.linalg.cholesky_ex(k[1])[1] != 0 and torch.linalg.cholesky_ex(k[1] + DAMPING * 1.0 * torch.eye(4))[1] != 0
    )
    assert CHOLESKY_RETRY_MULTIPLIERS.index(10.0) == 4  # 1e-3 ... 1 all fail for sample 1, 10 factors
    shifted = np.linalg.cholesky(k[1].detach().numpy() + DAMPING * 10.0 * np.eye(4))
    expected = [
        alone[0].detach().numpy(),
        np.linalg.solve(shifted, directions[1].detach().numpy()),
        directions[2].detach().numpy(),
        np.nan_to_num(directions[3].detach().numpy(), nan=0.0),
    ]
    for i, want in enumerate(expected):
        assert np.abs(frame[i].detach().numpy() - want).max() <= 1e-13, i
    assert torch.equal(frame[0], alone[0])  # the good sample keeps exactly its own frame
    assert torch.isfinite(frame).all()
    frame.sum().backward()  # the fallback keeps gradients finite where the inputs are
    assert torch.isfinite(k.grad[:3]).all() and torch.isfinite(directions.grad).all()
    assert (k.grad[2:] == 0).all()  # the Euclidean frame does not depend on K


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "value_free"])
def test_subspace_fallback_takes_the_pseudo_inverse_for_the_whole_batch(traced, monkeypatch):
    g = torch.Generator().manual_seed(7)
    good = torch.randn(3, 3, generator=g, dtype=torch.float64)
    good = good @ good.T + torch.eye(3, dtype=torch.float64)
    singular = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    k = torch.stack([good, singular])
    directions = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    assert (torch.linalg.lu_factor_ex(singular)[2] != 0).item()  # the solve reports the failure
    alone = metric_subspace_frame(good[None], directions[:1])
    assert np.abs(alone[0].numpy() - np.linalg.solve(good.numpy(), directions[0].numpy())).max() <= 1e-13
    if traced:
        _value_free(monkeypatch)
        assert torch.equal(metric_subspace_frame(good[None], directions[:1]), alone)  # same numbers without failure
    frame = metric_subspace_frame(k, directions)
    for i in range(2):
        want = np.linalg.pinv(k[i].numpy(), hermitian=True) @ directions[i].numpy()
        assert np.abs(frame[i].numpy() - want).max() <= 1e-12, i
    assert not torch.equal(frame[0], alone[0])  # the good sample too went through the pseudo-inverse


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_value_free_path_gives_the_same_numbers_without_failures(composition, monkeypatch):
    directions, gates, coeff, gamma, u_factor = _example(seed=8)
    eager = _composed(composition, directions, gates, coeff, gamma, u_factor, 0.5)
    _value_free(monkeypatch)
    assert torch.equal(_composed(composition, directions, gates, coeff, gamma, u_factor, 0.5), eager)


FACTORISATIONS = ("linalg_cholesky", "linalg_lu", "linalg_solve", "linalg_pinv", "linalg_eigh", "lu_")


class LinalgDtypes(TorchDispatchMode):
    """Records the dtype of the first argument of every linear-algebra and matrix-product call."""

    WATCHED = ("linalg_", "lu_", "bmm", "mm", "matmul")

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name.startswith(self.WATCHED) and args and isinstance(args[0], torch.Tensor):
            self.calls.append((name, args[0].dtype))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_bf16_autocast_runs_the_composition_in_float32(composition):
    directions, gates, coeff, gamma, u_factor = (t.float() for t in _example(seed=9))
    fp32 = _composed(composition, directions, gates, coeff, gamma, u_factor, 0.5)
    low = [t.bfloat16() for t in (directions, gates, coeff, gamma, u_factor)]
    recorder = LinalgDtypes()
    with torch.autocast("cpu", dtype=torch.bfloat16), recorder:
        frame = metric_first_frame(low[0], low[3], low[4], DAMPING, composition)
        velocity = compose_metric_first(low[1], low[2], low[0], frame, 0.5)
    assert frame.dtype == torch.float32 and velocity.dtype == torch.bfloat16  # cast back to the caller's dtype
    # the frame equals the float32 computation on the same (bf16-rounded) inputs: no step ran in bf16
    assert torch.equal(frame, metric_first_frame(*(t.float() for t in (low[0], low[3], low[4])), DAMPING, composition))
    names = {name for name, _ in recorder.calls}
    assert {"linalg_cholesky_ex" if composition == "metric_orthonormal" else "linalg_lu_factor_ex"} <= names
    assert all(dtype == torch.float32 for _, dtype in recorder.calls), recorder.calls
    assert (velocity.float() - fp32).abs().max() <= 2 * 2.0**-8 * fp32.abs().max()
    # inside the model too: every factorisation of a bf16 forward reads float32
    model = build_model(VARIANT[composition], "micro", seed=1)
    recorder = LinalgDtypes()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), recorder:
        model(torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)))
    factorisations = [(n, t) for n, t in recorder.calls if n.startswith(FACTORISATIONS)]
    assert factorisations and all(t == torch.float32 for _, t in factorisations), factorisations


@pytest.mark.parametrize("composition", COMPOSITIONS)
@pytest.mark.parametrize(
    "variant, settings",
    [
        ("G", {}),  # refinement layers: each position's own geometry, [B, L, n, n] Grams
        ("B", {"sequence_mode": "recurrent", "mixer": "none"}),  # the Euler rollout
        ("J", {"block_solver": "anderson", "solver_iters": 2}),  # the causal block refiner
    ],
)
def test_other_paths_step_like_their_parallel_forward(composition, variant, settings):
    model = (
        build_model(variant, "micro", seed=2, directional_metric_composition=composition, **settings).double().eval()
    )
    tokens = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        parallel = model(tokens).logits
        state, stepped = model.init_state(2), []
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            stepped.append(logits)
        plain = build_model(variant, "micro", seed=2, **settings).double().eval()(tokens).logits
    assert (parallel - torch.stack(stepped, dim=1)).abs().max() <= 1e-10
    assert not torch.allclose(parallel, plain)  # the composition reached this path


@pytest.mark.parametrize(
    "variant, composition, missing",
    [
        ("J_NO_DIRECTION", "metric_subspace", "use_direction_field"),
        ("J_NO_METRIC", "metric_orthonormal", "use_relational_metric"),
        ("SSM_CONTROL", "metric_subspace", "use_drm_geometry"),
        ("J_DIRECT_CONTROL", "metric_orthonormal", "use_direction_field, use_relational_metric"),
    ],
)
def test_a_composition_without_directions_or_metric_is_refused(variant, composition, missing):
    with pytest.raises(ValueError, match=f"section U.*sets {missing}=False"):
        build_config(variant, "micro", directional_metric_composition=composition)
    with pytest.raises(ValueError, match="use_direction_field=False"):
        build_config("J_METRIC_SUBSPACE", "micro", use_direction_field=False)
    with pytest.raises(ValueError, match="must be one of 'post_naturalize', 'metric_subspace', 'metric_orthonormal'"):
        build_config("J", "micro", directional_metric_composition="metric_first")


def test_damped_gram_is_the_symmetrised_coupling_plus_damping():
    directions, _, _, gamma, u_factor = _example(seed=10)
    k = damped_direction_gram(directions, gamma, u_factor, DAMPING)
    dense = directions @ (torch.diag_embed(gamma) + u_factor @ u_factor.mT) @ directions.mT
    assert torch.equal(k, k.mT)
    assert (k - dense - DAMPING * torch.eye(4, dtype=torch.float64)).abs().max() <= 1e-14
    assert (damped_direction_gram(directions, gamma, u_factor, 0.0) - dense - 1e-6 * torch.eye(4)).abs().max() <= 1e-14
