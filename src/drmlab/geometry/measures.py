"""The geometry instruments on a model (``docs/geometry.md`` section 7), one function per instrument
(``measure_*``), each taking a :class:`~.model_adapter.ModelView` and, where it has one, its share of
the :class:`GeometryBudget`: the metric's ranks (section 1), the pullback (section 3), the strata
(section 2), the agreement angles, the connection under step control (section 4), the geodesics
(section 5) and the topology (section 6). Each measurement says what it is: numerical ranks name their
tolerance, an estimated pullback says so, a solver that did not converge gives its residual and no
number, and the action ratio is a diagnostic, not evidence that the model's paths are geodesics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .model_adapter import ModelView


@dataclass
class GeometryBudget:
    """How much of each instrument to run (the defaults fit a tiny model in well under 5 minutes on 2 cores)."""

    pullback_states: int = 64  # block starts (the first of each window) for the pullback and the agreement angles
    strata_states: int = 64  # evenly spaced visited states per window for the strata
    max_exact_vocab: int = 4096  # above: the estimator
    estimator_samples: int = 64
    holonomy_points: int = 2  # block starts at which a small-loop holonomy is measured
    holonomy_side: float = 1.0  # the loop's first G-side; halved until small against the metric's variation
    holonomy_metric_change: float = 1e-2  # the loop's bound on the metric change and on a side's bend
    holonomy_rtol: float = 1e-9  # the loop transport's local error
    holonomy_max_substeps: int = 2000
    transport_blocks: int = 2  # block-to-block transports of the directions
    transport_rtol: float = 1e-8
    transport_metric_change: float = 0.1
    transport_max_substeps: int = 400  # per transport (and per ladder: rung attempts)
    geodesic_blocks: int = 1  # model paths compared with the geodesic between their endpoints
    geodesic_max_iter: int = 200
    geodesic_max_hvp: int = 400  # Hessian-vector products of the Newton-CG solve (its cost bound)
    topology_landmarks: int = 120
    topology_resamples: int = 5
    topology_threshold: float = 0.1  # long bars: persistence > threshold x the landmark cloud's diameter


def _metric_tensors(view: ModelView, z: torch.Tensor):
    """gamma [N, d], U [N, d, r] at states z [N, d]."""
    from torch.func import vmap

    return vmap(view.metric_fn)(z)


def _dense_metric(view, z):
    from drmlab.ops import metric_dense

    gamma, u = _metric_tensors(view, z)
    return metric_dense(gamma, u)


def _flat_starts(view: ModelView) -> torch.Tensor:
    return view.block_starts.reshape(-1, view.d_state)


def exact_rank_source(view: ModelView, gamma: torch.Tensor) -> str | None:
    """How the exact ranks of the model's metric at states with floors gamma [N, d] are known
    (``docs/geometry.md`` sections 2, 8 and 9), or None where there are none: the pullback's rank is
    only bounded, by min(d, V - 1)."""
    config = view.metric_config
    if config.get("metric") == "pullback":
        return None
    diagonal = config.get("metric_diagonal", "softplus_eps")
    if bool((gamma > 0).all()):
        why = "eps > 0 by construction" if diagonal == "softplus_eps" else f"metric_diagonal={diagonal!r} can vanish"
        return f"exact: the floor is positive at every state measured ({why}), so G has rank d"
    return (
        f"exact: the floor's zero set (metric_diagonal={diagonal!r}) and rank(U_Z) from the SVD of U_Z at "
        f"LAPACK's tolerance (smallest margin: u_z_margin_min)"
    )


def measure_metric(view: ModelView) -> dict:
    """Section 1 on the model's metric at every block start: exact rank (through the exact kernel), or for
    the pullback option its bound and the SVD rank labelled approximate; numerical ranks at stated
    tolerances; the damped pseudo-inverse checked against the model's Woodbury solve (equal where the
    floor is positive) and, for a degenerate floor, against the model's own pseudo-inverse solve."""
    from drmlab.ops import pseudo_inverse_solve, woodbury_solve

    from .metric import RANK_TOLERANCES, damped_pinv_apply, kernel_split, numerical_rank

    z = _flat_starts(view)
    gamma, u = _metric_tensors(view, z)
    sigma = torch.linalg.eigvalsh(_dense_metric(view, z))
    splits = [kernel_split(g, w) for g, w in zip(gamma, u)]
    lam = float(view.metric_config.get("metric_damping", 0.3))
    probe = torch.randn(z.shape[0], 1, view.d_state, dtype=z.dtype, generator=torch.Generator().manual_seed(0))
    pinv = torch.stack([damped_pinv_apply(g, w, p, lam, s) for g, w, p, s in zip(gamma, u, probe, splits)])
    wood = woodbury_solve(gamma, u, probe, damping=lam)
    ranks = numerical_rank(sigma, RANK_TOLERANCES)
    source = exact_rank_source(view, gamma)
    out = {"states": int(z.shape[0]), "metric": view.metric_config.get("metric", "relational")}
    if source is None:
        out["exact_rank_bound"] = min(view.d_state, view.vocab_size - 1)
        out["svd_rank_approx"] = sorted({s.rank for s in splits})  # G_pb = U U^T: U's rank at LAPACK's tolerance
        out["note"] = "the pullback's exact rank is only bounded; every rank given is a numerical approximation"
    else:
        out["exact_rank"] = sorted({s.rank for s in splits})
        out["kernel_dim"] = sorted({s.kernel_dim for s in splits})
        out["u_z_margin_min"] = min(s.margin for s in splits)
        out["exact_rank_how"] = source.replace("u_z_margin_min", f"{out['u_z_margin_min']:.3g}")
        out["note"] = "exact rank from the exact kernel; rtol ranks are numerical approximations"
    out.update(
        {
            "floor_zero_coordinates_max": int(max(int(s.zero.sum()) for s in splits)),
            "numerical_rank_approx": {k: float(v.double().mean()) for k, v in ranks.items()},
            "eigenvalue_min": float(sigma[:, 0].min()),
            "eigenvalue_max": float(sigma[:, -1].max()),
            # infinite where G has an exact kernel (None); otherwise from the spectrum
            "condition_number_mean": None
            if any(s.kernel_dim for s in splits) and source is not None
            else float((sigma[:, -1] / sigma[:, 0]).mean()),
            "pinv_vs_woodbury_max_rel": float((pinv - wood).abs().max() / wood.abs().max()),
            "damping": lam,
            "_spectrum_first": sigma[0].tolist(),
        }
    )
    if view.metric_config.get("metric_diagonal", "softplus_eps") != "softplus_eps" and lam > 0:
        model_solve = pseudo_inverse_solve(gamma, u, probe, lam)  # what the model's naturalization applies
        out["pinv_vs_model_max_rel"] = float((pinv - model_solve).abs().max() / pinv.abs().max())
    return out


def _pullback_states(view: ModelView, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(states [N, d], their labels [B, k] layout index): every window's first blocks' starts."""
    starts = view.block_starts
    per = max(1, min(starts.shape[1], count // max(starts.shape[0], 1)))
    chosen = starts[:, :per]
    return chosen.reshape(-1, view.d_state), chosen


def measure_pullback(view: ModelView, budget: GeometryBudget, cache: dict) -> dict:
    """Section 3: G_pb = J^T (diag p - p p^T) J at block starts (exact by autodiff, or the estimator
    above ``max_exact_vocab``), its exact rank bound and numerical ranks."""
    from .metric import RANK_TOLERANCES, numerical_rank
    from .pullback import pullback_auto

    z, chosen = _pullback_states(view, budget.pullback_states)
    g_pb, how = pullback_auto(
        view.logits_fn,
        z,
        view.vocab_size,
        budget.max_exact_vocab,
        budget.estimator_samples,
        torch.Generator().manual_seed(0),
    )
    cache["pullback"], cache["pullback_states"], cache["pullback_layout"] = g_pb, z, chosen.shape[:2]
    sigma = torch.linalg.eigvalsh(g_pb)
    ranks = numerical_rank(sigma, RANK_TOLERANCES)
    return {
        "states": int(z.shape[0]),
        "how": how,
        "exact_rank_bound": min(view.d_state, view.vocab_size - 1),
        "numerical_rank_approx": {k: float(v.double().mean()) for k, v in ranks.items()},
        "trace_mean": float(sigma.sum(-1).mean()),
        "eigenvalue_max": float(sigma[:, -1].max()),
        "_spectrum_first": sigma[0].tolist(),
    }


def _visited(view: ModelView, per_window: int) -> torch.Tensor:
    """Up to ``per_window`` evenly spaced visited states of each window, in order: [B, k, d]."""
    length = view.states.shape[1]
    index = torch.linspace(0, length - 1, min(per_window, length)).round().long().unique()
    return view.states[:, index]


def measure_strata(view: ModelView, budget: GeometryBudget, rtol: float = 1e-4) -> dict:
    """Section 2: stratify the states each window visits (``strata_states`` evenly spaced per window)
    by the exact rank of G where the construction gives one (:func:`exact_rank_source`, which labels
    it), its numerical rank at ``rtol``, and the numerical rank of the pullback (the exact one is only
    bounded, by min(d, V - 1)); occupancy and transitions along each window."""
    from .pullback import pullback_auto
    from .strata import exact_ranks, numerical_ranks, stratify

    visited = _visited(view, budget.strata_states)
    layout, z = visited.shape[:2], visited.reshape(-1, view.d_state)
    out = {"rtol": rtol, "states_per_window": int(layout[1]), "windows": int(layout[0])}
    if view.metric_fn is not None:
        gamma, u = _metric_tensors(view, z)
        source = exact_rank_source(view, gamma)
        if source is None:  # the pullback option: no exact rank, its bound only
            out["metric_exact_bound"] = min(view.d_state, view.vocab_size - 1)
        else:
            ranks, margin = exact_ranks(gamma, u, with_margin=True)
            out["metric_exact"] = stratify(ranks.view(layout))
            out["metric_exact_how"] = source.replace("u_z_margin_min", f"{margin:.3g}")
        sigma = torch.linalg.eigvalsh(_dense_metric(view, z))
        out["metric_numerical_approx"] = stratify(numerical_ranks(sigma, rtol).view(layout))
    g_pb, how = pullback_auto(
        view.logits_fn,
        z,
        view.vocab_size,
        budget.max_exact_vocab,
        budget.estimator_samples,
        torch.Generator().manual_seed(1),
    )
    out["pullback_how"] = how
    out["pullback_numerical_approx"] = stratify(numerical_ranks(torch.linalg.eigvalsh(g_pb), rtol).view(layout))
    return out


def measure_agreement(view: ModelView, cache: dict) -> dict:
    """Section 3's diagnostic: learned G against G_pb along the trajectories. Energies of every step's
    velocity under the block-start metrics (the pullback energy exactly, by one JVP per step), their
    log-Pearson and Spearman correlations, and principal angles between the top-r eigen-subspaces."""
    from drmlab.ops import metric_energy

    from .pullback import _pearson, _ranks, metric_agreement, pullback_energy

    if "pullback" not in cache:
        measure_pullback(view, GeometryBudget(), cache)
    block, (b, nb) = view.block_size, view.block_starts.shape[:2]
    length = view.states.shape[1]
    z_rows, v_rows = [], []
    for k in range(nb):
        lo, hi = k * block, min((k + 1) * block, length)
        v_rows.append(view.velocities[:, lo:hi])
        z_rows.append(view.block_starts[:, k].unsqueeze(1).expand(-1, hi - lo, -1))
    z = torch.cat(z_rows, 1).reshape(-1, view.d_state)
    v = torch.cat(v_rows, 1).reshape(-1, view.d_state)
    gamma, u = _metric_tensors(view, view.block_starts.reshape(-1, view.d_state))
    starts_index = torch.cat([torch.full((min((k + 1) * block, length) - k * block,), k) for k in range(nb)])
    index = (torch.arange(b).unsqueeze(1) * nb + starts_index.unsqueeze(0)).reshape(-1)
    e_learned = metric_energy(gamma[index], u[index], v.unsqueeze(1))[:, 0]
    e_pb = pullback_energy(view.logits_fn, z, v)
    tiny = torch.finfo(z.dtype).tiny
    out = {
        "steps": int(v.shape[0]),
        "energy_log_pearson": _pearson(e_learned.clamp_min(tiny).log(), e_pb.clamp_min(tiny).log()),
        "energy_spearman": _pearson(_ranks(e_learned), _ranks(e_pb)),
        "energy_learned_mean": float(e_learned.mean()),
        "energy_pullback_mean": float(e_pb.mean()),
    }
    cache["energies"] = (e_learned, e_pb)
    g_pb, zs = cache["pullback"], cache["pullback_states"]
    g = _dense_metric(view, zs)
    k = max(1, min(int(view.metric_config.get("metric_rank") or 1), view.d_state - 1))
    first_velocity = view.velocities[:, ::block][:, : cache["pullback_layout"][1]].reshape(-1, view.d_state)
    at_starts = metric_agreement(g, g_pb, first_velocity, k)
    out["subspace_k"] = k
    out["principal_angles_mean_rad"] = at_starts["principal_angles_mean_rad"]
    out["principal_angle_largest_mean_rad"] = at_starts["principal_angle_largest_mean_rad"]
    out["random_subspace_largest_angle_rad"] = _random_angle(view.d_state, k)
    return out


def _random_angle(d: int, k: int, samples: int = 32) -> float:
    """The mean largest principal angle between two random k-subspaces of R^d (the no-agreement baseline)."""
    from .pullback import principal_angles

    g = torch.Generator().manual_seed(0)
    a = torch.randn(samples, d, k, generator=g, dtype=torch.float64)
    b = torch.randn(samples, d, k, generator=g, dtype=torch.float64)
    return float(principal_angles(a, b)[..., -1].mean())


def _model_metric(view: ModelView) -> tuple:
    """(the learned metric as a :class:`~.connection.LowRankMetric`, a note or None). The Levi-Civita
    connection needs G non-degenerate: where the floor vanishes at a block start (a degenerate
    metric), the instruments run on G + lambda I (lambda = the model's damping) and say so."""
    from .connection import LowRankMetric

    gamma, _ = _metric_tensors(view, _flat_starts(view))
    if bool((gamma > 0).all()):
        return LowRankMetric(view.metric_fn), None
    lam = float(view.metric_config.get("metric_damping") or 0.0) or 1e-3

    def damped(z):
        g, u = view.metric_fn(z)
        return g + lam, u

    what = (
        "the model's metric is the pullback G_pb (rank <= min(d, V - 1))"
        if view.metric_config.get("metric") == "pullback"
        else "the metric's floor vanishes (a degenerate metric)"
    )
    return LowRankMetric(damped), f"{what}: connection and geodesics are measured on G + {lam:g} I"


def _g_angle(metric, z, a, b) -> float:
    """The unsigned G-angle between a and b at z (of the lines they span); NaN when either is non-finite
    (never a clamped 0: min(1, NaN) is 1 in Python, which made a diverged transport read as perfect)."""
    cos = float(metric.inner(z, a, b)) / math.sqrt(
        max(float(metric.inner(z, a, a)) * float(metric.inner(z, b, b)), 1e-300)
    )
    if not math.isfinite(cos):
        return math.nan
    return math.acos(max(-1.0, min(1.0, abs(cos))))


def measure_connection(view: ModelView, budget: GeometryBudget) -> dict:
    """Section 4 on the learned metric, under step control in G-length (section 4): small-loop
    holonomy (sectional-curvature estimates at two loop sizes) in the plane of the first two
    directions (or the two leading eigenvectors of G) at a few block starts, and the transport of
    the directions along each block's own path to the next block start (anchor maps): the G-angle
    between the transported V_i(z_b) and V_i(z_{b+1}), beside the angle without transport, and
    Schild's ladder against the ODE on the first block. A transport or ladder that hits its
    sub-step cap gives its reason and no angle."""
    from .connection import StepControl, schild_ladder, small_loop_holonomy, transport_adaptive

    metric, note = _model_metric(view)
    starts = view.block_starts[0]
    loop_control = StepControl(rtol=budget.holonomy_rtol, max_substeps=budget.holonomy_max_substeps)
    path_control = StepControl(
        rtol=budget.transport_rtol,
        max_metric_change=budget.transport_metric_change,
        max_substeps=budget.transport_max_substeps,
    )
    out: dict = {"holonomy": [], "transport": [], "step_control": asdict(path_control)}
    if note:
        out["note"] = note
    for k in range(min(budget.holonomy_points, starts.shape[0])):
        z = starts[k]
        if view.directions_fn is not None:
            dirs = view.directions_fn(z)[0]
            u, w = dirs[0], dirs[1]
        else:
            vecs = torch.linalg.eigh(metric.dense(z))[1]
            u, w = vecs[:, -1], vecs[:, -2]
        est = small_loop_holonomy(metric, z, u, w, budget.holonomy_metric_change, budget.holonomy_side, loop_control)
        out["holonomy"].append({"block": k, **est})
    if view.directions_fn is None:
        out["transport_note"] = "no learned directions: nothing to transport"
        return out
    for k in range(min(budget.transport_blocks, starts.shape[0] - 1)):
        path = view.block_path(0, k)
        v_start, _ = view.directions_fn(path[0])
        v_end, _ = view.directions_fn(path[-1])
        z1 = path[-1]
        lengths = [float(metric.inner(p, q - p, q - p)) ** 0.5 for p, q in zip(path[:-1], path[1:])]
        raw = [_g_angle(metric, z1, v_start[i], v_end[i]) for i in range(v_end.shape[0])]
        moved = transport_adaptive(metric, path, v_start.mT, path_control)
        row = {
            "block": k,
            "segments": int(path.shape[0] - 1),
            "segment_g_length_max": max(lengths),
            "angle_untransported_mean_rad": sum(raw) / len(raw),
            **moved.as_dict(),
        }
        if moved.completed:
            angles = [_g_angle(metric, z1, moved.frame[:, i], v_end[i]) for i in range(v_end.shape[0])]
            row["angle_transported_mean_rad"] = sum(angles) / len(angles)
            row["angle_transported_rad"] = angles
        else:
            row["angle_transported_mean_rad"] = None
            row["transport_failed"] = moved.reason
        if k == 0:
            ladder = schild_ladder(metric, path, v_start[0], path_control)
            row["schild"] = ladder.as_dict()
            if ladder.completed and moved.completed:
                row["schild_vs_ode_angle_rad"] = _g_angle(metric, z1, ladder.frame[:, 0], moved.frame[:, 0])
            else:
                row["schild_vs_ode_angle_rad"] = None
                if not ladder.completed:
                    row["schild_failed"] = ladder.reason
        out["transport"].append(row)
    return out


def measure_geodesics(view: ModelView, budget: GeometryBudget) -> dict:
    """Section 5: each of the first blocks' own paths against the discrete geodesic (issue's left
    rule; trust-region Newton-CG preconditioned by the frozen-metric Hessian, at most
    ``geodesic_max_hvp`` Hessian-vector products) between its endpoints under the learned metric:
    the action ratio (>= 1 when the solve found the minimiser; a diagnostic) or, unconverged, the
    residuals alone. ``state_norm_max`` says whether the geodesic stays where the model's states are."""
    from .geodesics import path_versus_geodesic

    metric, note = _model_metric(view)
    rows = []
    for k in range(min(budget.geodesic_blocks, view.block_starts.shape[1] - 1)):
        path = view.block_path(0, k)
        result = path_versus_geodesic(
            metric, path, rule="left", max_iter=budget.geodesic_max_iter, max_hvp=budget.geodesic_max_hvp
        )
        rows.append({"block": k, "path_state_norm_max": float(path.norm(dim=-1).max()), **result})
    return {
        "blocks": rows,
        "note": "the action ratio is a diagnostic, not evidence of geodesic emergence" + (f"; {note}" if note else ""),
    }


def measure_topology(view: ModelView, budget: GeometryBudget) -> dict:
    """Section 6: persistent homology (Rips, H0 and H1) of the visited states through farthest-point
    landmarks, the bars longer than ``topology_threshold`` x the landmarks' diameter, and the
    bootstrap spread of the longest bars."""
    import numpy as np

    from .topology import betti_at, bootstrap_persistence, landmarks, persistence

    points = view.states.reshape(-1, view.d_state).double().numpy()
    idx = landmarks(points, budget.topology_landmarks)
    cloud = points[idx]
    diameter = float(np.max(np.linalg.norm(cloud[:, None] - cloud[None], axis=-1)))
    diagrams = persistence(cloud, max_dim=1, max_edge=diameter)
    threshold = budget.topology_threshold * diameter
    spread = bootstrap_persistence(cloud, resamples=budget.topology_resamples, max_dim=1, max_edge=diameter)
    return {
        "landmarks": len(idx),
        "diameter": diameter,
        "threshold": threshold,
        "betti_at_threshold": betti_at(diagrams, threshold),
        "longest_h1": float(max((d - b for b, d in diagrams[1]), default=0.0)),
        "bootstrap_top_persistence": spread,
        "_diagrams": {k: v.tolist() for k, v in diagrams.items()},
    }
