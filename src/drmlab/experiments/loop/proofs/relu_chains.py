"""Loop proofs 1-3 (docs/looped.md section 7): correlated accumulation of residuals in chains
``h <- h + eps * W_i relu(norm(h))`` of random matrices, without and with pre-LN.

1. :func:`proof1` -- Theta(N^2) vs Theta(N): one matrix applied N times (eps = 1/N) sums residual
   energy like N^2, N independent matrices like N.
2. :func:`proof2` -- layer-loop vs model-loop: repeating a block N times in a row correlates its
   residuals more than looping the whole stack; eps = 1/(N sqrt L) keeps the final norm bounded.
3. :func:`proof3` -- pre-LN does not remove it: with LayerNorm in the branch the shared unscaled
   norm still grows ~N (independent ~sqrt N); eps = 1/(N sqrt L) keeps it flat and damps weight
   perturbations.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from drmlab.experiments.loop.proofs.common import (
    ProofResult,
    blas_single,
    check_ns,
    loglog_slope,
    ratio,
    relu,
    study_matrix,
)


@blas_single
def proof1(
    seed: int = 0, d: int = 512, ns=(4, 8, 16, 32, 64, 128), scaled: bool = True, slope_tol: float = 0.35
) -> ProofResult:
    """Proof 1 -- Θ(N²) vs Θ(N) accumulation of residuals under weight sharing.

    Hypothesis: in ``h <- h + ε·W·relu(h)`` run for N steps with ε = 1/N, the residuals of a
    single shared matrix W are correlated, so S = ‖Σₙ rₙ‖²/d grows like N²; with N independent
    matrices they are nearly orthogonal and S grows like N.

    Procedure (one generator, ``seed``): for each N in order draw h0, then W = M(d); run the
    shared chain; then draw N independent M(d) and run the same chain from the same h0.

    Criterion (the study printed no test; this formalises its reading "shared/N grows, shared/N²
    and indep/N flat"): the least-squares log-log slope of S_shared against N is within
    ``slope_tol`` of 2 AND that of S_indep is within ``slope_tol`` of 1.
    """
    t0 = time.perf_counter()
    ns = check_ns(ns)
    rng = np.random.default_rng(seed)

    def chain(h0, mats, eps):
        h = h0.copy()
        acc = np.zeros_like(h0)
        for W in mats:
            r = W @ relu(h)
            h = h + eps * r
            acc = acc + r
        return float(acc @ acc) / d

    rows, s_sh, s_ind = [], [], []
    lines = [f"{'N':>4} {'shared/N':>12} {'indep/N':>12} {'shared/N^2':>12}"]
    for n in ns:
        eps = 1.0 / n if scaled else 1.0
        h0 = rng.normal(size=d)
        W = study_matrix(rng, d)
        sh = chain(h0, [W] * n, eps)
        ind = chain(h0, [study_matrix(rng, d) for _ in range(n)], eps)
        s_sh.append(sh)
        s_ind.append(ind)
        rows.append({"n": n, "shared_over_n": sh / n, "indep_over_n": ind / n, "shared_over_n2": sh / n**2})
        lines.append(f"{n:4d} {sh / n:12.3f} {ind / n:12.3f} {sh / n**2:12.4f}")
    with np.errstate(all="ignore"):
        sl_sh = loglog_slope(ns, s_sh)
        sl_ind = loglog_slope(ns, s_ind)
    checks = {
        "shared_slope_near_2": bool(abs(sl_sh - 2.0) <= slope_tol),
        "indep_slope_near_1": bool(abs(sl_ind - 1.0) <= slope_tol),
    }
    lines.append("")
    lines.append(
        f"log-log slope of ||sum r||^2 vs N: shared {sl_sh:.3f} (Theta(N^2) predicts 2), "
        f"indep {sl_ind:.3f} (Theta(N) predicts 1); tolerance {slope_tol}"
    )
    return ProofResult(
        proof=1,
        title="Theta(N^2) vs Theta(N) accumulation",
        hypothesis="With eps=1/N a shared matrix gives ||sum r||^2 ~ N^2, independent matrices ~ N.",
        criterion=f"|slope(S_shared) - 2| <= {slope_tol} and |slope(S_indep) - 1| <= {slope_tol} "
        "(least-squares log-log slopes against N)",
        arms={
            "shared_over_n": "S_shared / N, S = ||sum_n r_n||^2 / d",
            "indep_over_n": "S_indep / N",
            "shared_over_n2": "S_shared / N^2",
        },
        rows=rows,
        checks=checks,
        stats={"slope_shared": sl_sh, "slope_indep": sl_ind},
        params={"seed": seed, "d": d, "ns": list(ns), "scaled": scaled, "slope_tol": slope_tol},
        text="\n".join(lines),
        plot_keys=["shared_over_n", "indep_over_n", "shared_over_n2"],
        plot_ylabel="||sum r||^2 / d, normalised",
        seconds=time.perf_counter() - t0,
    )


def _schedule(n_layers: int, n: int, kind: str) -> list[int]:
    if kind == "layer":
        return [i for i in range(n_layers) for _ in range(n)]
    if kind == "model":
        return [i for _ in range(n) for i in range(n_layers)]
    raise ValueError(f"unknown schedule {kind!r}")


def _run_relu(h0, mats, order, eps, norm=None, collect=False):
    h = h0.copy()
    res: list[list[np.ndarray]] = [[] for _ in mats]
    for i in order:
        z = norm(h) if norm is not None else h
        r = mats[i] @ relu(z)
        h = h + eps * r
        if collect:
            res[i].append(r)
    return (h, res) if collect else h


def _mean_pair_cosine(res: list[list[np.ndarray]]) -> float:
    cos = []
    for rs in res:
        for i in range(len(rs)):
            for j in range(i + 1, len(rs)):
                a, b = rs[i], rs[j]
                cos.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    return float(np.mean(cos)) if cos else float("nan")


@blas_single
def proof2(
    seed: int = 1,
    d: int = 512,
    n_layers: int = 6,
    ns=(2, 4, 8),
    scaled: bool = True,
    flat_tol: float = 1.5,
    blowup: float = 10.0,
) -> ProofResult:
    """Proof 2 -- layer-loop vs model-loop, ``r = W_i·relu(h)`` with no norm.

    Hypothesis: applying each of L stored blocks N times in a row (layer-loop) correlates that
    block's residuals more than looping the whole stack (model-loop); ε = 1/(N√L) keeps the
    final norm bounded under both orders while ε = 1 blows up.

    Procedure (one generator, ``seed``). Test A: for each N draw L matrices M(d) then h0, run
    both orders with ε = 1/(N√L), report the mean pairwise cosine of each block's N residuals.
    Test B: for each N and schedule (layer, model) draw L fresh matrices then a fresh h0 and
    report R = ‖h_final‖/√d for ε = 1 and ε = 1/(N√L).

    Criterion (the study printed no test; it read cos ≈ 0.99 vs 0.95 and bounded R): layer
    cosine > model cosine at every N; scaled R max/min over all (N, schedule) < ``flat_tol``;
    unscaled R at the largest N exceeds ``blowup`` × the largest scaled R for both schedules.
    """
    t0 = time.perf_counter()
    ns = check_ns(ns, 1)
    rng = np.random.default_rng(seed)
    sq = np.sqrt(n_layers)

    def eps_scaled(n):
        return 1.0 / (n * sq) if scaled else 1.0

    by_n: dict[int, dict[str, Any]] = {n: {"n": n} for n in ns}
    lines = [
        "Test A: mean pairwise cosine of each block's N residuals",
        f"{'N':>3} {'cos layer':>12} {'cos model':>12}",
    ]
    for n in ns:
        mats = [study_matrix(rng, d) for _ in range(n_layers)]
        h0 = rng.normal(size=d)
        cl = _mean_pair_cosine(_run_relu(h0, mats, _schedule(n_layers, n, "layer"), eps_scaled(n), collect=True)[1])
        cm = _mean_pair_cosine(_run_relu(h0, mats, _schedule(n_layers, n, "model"), eps_scaled(n), collect=True)[1])
        by_n[n].update(cos_layer=cl, cos_model=cm)
        lines.append(f"{n:3d} {cl:12.4f} {cm:12.4f}")
    lines += [
        "",
        "Test B: R = ||h_final|| / sqrt(d)",
        f"{'N':>3} {'schedule':>8} {'R eps=1':>12} {'R eps=1/(N√L)':>14}",
    ]
    with np.errstate(over="ignore", invalid="ignore"):
        for n in ns:
            for kind in ("layer", "model"):
                mats = [study_matrix(rng, d) for _ in range(n_layers)]
                h0 = rng.normal(size=d)
                order = _schedule(n_layers, n, kind)
                r1 = float(np.linalg.norm(_run_relu(h0, mats, order, 1.0)) / np.sqrt(d))
                rs = float(np.linalg.norm(_run_relu(h0, mats, order, eps_scaled(n))) / np.sqrt(d))
                by_n[n].update({f"R_{kind}_eps1": r1, f"R_{kind}_scaled": rs})
                lines.append(f"{n:3d} {kind:>8} {r1:12.2e} {rs:14.3f}")
    rows = [by_n[n] for n in ns]
    scaled_r = [r[f"R_{k}_scaled"] for r in rows for k in ("layer", "model")]
    flat = ratio(max(scaled_r), min(scaled_r))
    last = rows[-1]
    checks = {
        "cos_layer_gt_model_every_n": all(r["cos_layer"] > r["cos_model"] for r in rows),
        "scaled_R_bounded": bool(flat < flat_tol),
        "unscaled_R_blows_up": all(last[f"R_{k}_eps1"] > blowup * max(scaled_r) for k in ("layer", "model")),
    }
    lines.append("")
    lines.append(
        f"cos layer > cos model at every N: {checks['cos_layer_gt_model_every_n']}; "
        f"scaled R max/min {flat:.3f} (< {flat_tol}): {checks['scaled_R_bounded']}; "
        f"unscaled R at N={ns[-1]} > {blowup:g} x max scaled R: "
        f"{checks['unscaled_R_blows_up']}"
    )
    return ProofResult(
        proof=2,
        title="layer-loop vs model-loop",
        hypothesis="Layer-loop correlates a block's residuals more than model-loop; "
        "eps=1/(N sqrt L) keeps the final norm bounded, eps=1 blows up.",
        criterion=f"cos_layer > cos_model at every N; max/min scaled R < {flat_tol}; "
        f"unscaled R at the largest N > {blowup:g} x max scaled R (both schedules)",
        arms={
            "cos_layer": "mean pairwise residual cosine, layer-loop, eps=1/(N sqrt L)",
            "cos_model": "mean pairwise residual cosine, model-loop, eps=1/(N sqrt L)",
            "R_layer_eps1": "||h_final||/sqrt(d), layer-loop, eps=1",
            "R_layer_scaled": "||h_final||/sqrt(d), layer-loop, eps=1/(N sqrt L)",
            "R_model_eps1": "||h_final||/sqrt(d), model-loop, eps=1",
            "R_model_scaled": "||h_final||/sqrt(d), model-loop, eps=1/(N sqrt L)",
        },
        rows=rows,
        checks=checks,
        stats={"scaled_R_max_over_min": flat},
        params={
            "seed": seed,
            "d": d,
            "n_layers": n_layers,
            "ns": list(ns),
            "scaled": scaled,
            "flat_tol": flat_tol,
            "blowup": blowup,
        },
        text="\n".join(lines),
        plot_keys=["R_layer_eps1", "R_model_eps1", "R_layer_scaled", "R_model_scaled"],
        plot_ylabel="||h_final|| / sqrt(d)",
        seconds=time.perf_counter() - t0,
    )


def _ln_std(x: np.ndarray) -> np.ndarray:
    """``(x - mean) / (std + 1e-6)``, population std, no affine (proof 3's norm)."""
    return (x - x.mean()) / (x.std() + 1e-6)


@blas_single
def proof3(
    seed: int = 2,
    d: int = 512,
    n_layers: int = 6,
    ns=(2, 4, 8, 16),
    amp_ns=(2, 4, 8),
    perturb: float = 0.01,
    scaled: bool = True,
    flat_tol: float = 1.5,
) -> ProofResult:
    """Proof 3 -- pre-LN: ``h <- h + ε·W_i·relu(ln(h))`` in layer-loop order.

    Hypothesis: LayerNorm in the branch bounds each residual but not their correlation, so the
    shared ε = 1 norm still grows ~N while independent weights grow ~√N; ε = 1/(N√L) keeps the
    norm flat in N and amplifies a weight perturbation less than ε = 1.

    Procedure (one generator, ``seed``). Part 1: for each N in ``ns`` draw L matrices, h0, then
    L·N independent matrices; report ‖h‖/√d for shared ε=1, independent ε=1, shared ε=1/(N√L).
    Part 2: for each N in ``amp_ns`` draw L matrices, L perturbations ``perturb``·M(d), then h0;
    amp = ‖h(W+ΔW) − h(W)‖/‖h(W)‖ for ε = 1 and ε = 1/(N√L).

    Criterion (proof 5's test applied to part 1, plus part 2): r_sh = shared(N_max)/shared(N_min)
    > 0.6·N_max/N_min; scaled max/min < ``flat_tol``; r_sh / r_ind > 2; scaled amp < unscaled
    amp at every N of part 2.
    """
    t0 = time.perf_counter()
    ns = check_ns(ns)
    amp_ns = tuple(int(n) for n in amp_ns)
    rng = np.random.default_rng(seed)
    sq = np.sqrt(n_layers)

    def eps_scaled(n):
        return 1.0 / (n * sq) if scaled else 1.0

    def rnorm(h):
        return float(np.linalg.norm(h) / np.sqrt(d))

    by_n: dict[int, dict[str, Any]] = {}
    lines = ["Part 1: ||h|| / sqrt(d)", f"{'N':>3} {'shared eps=1':>14} {'indep eps=1':>13} {'shared scaled':>14}"]
    for n in ns:
        mats = [study_matrix(rng, d) for _ in range(n_layers)]
        h0 = rng.normal(size=d)
        indep = [study_matrix(rng, d) for _ in range(n_layers * n)]
        order = _schedule(n_layers, n, "layer")
        sh = rnorm(_run_relu(h0, mats, order, 1.0, norm=_ln_std))
        ind = rnorm(_run_relu(h0, indep, range(n_layers * n), 1.0, norm=_ln_std))
        sc = rnorm(_run_relu(h0, mats, order, eps_scaled(n), norm=_ln_std))
        by_n[n] = {
            "n": n,
            "shared_eps1": sh,
            "indep_eps1": ind,
            "shared_scaled": sc,
            "amp_eps1": None,
            "amp_scaled": None,
        }
        lines.append(f"{n:3d} {sh:14.2f} {ind:13.2f} {sc:14.3f}")
    lines += [
        "",
        "Part 2: perturbation amplification ||h(W+dW) - h(W)|| / ||h(W)||",
        f"{'N':>3} {'amp eps=1':>14} {'amp scaled':>14}",
    ]
    for n in amp_ns:
        mats = [study_matrix(rng, d) for _ in range(n_layers)]
        deltas = [perturb * study_matrix(rng, d) for _ in range(n_layers)]
        h0 = rng.normal(size=d)
        order = _schedule(n_layers, n, "layer")
        pert = [m + dm for m, dm in zip(mats, deltas)]
        amps = []
        for eps in (1.0, eps_scaled(n)):
            base = _run_relu(h0, mats, order, eps, norm=_ln_std)
            moved = _run_relu(h0, pert, order, eps, norm=_ln_std)
            amps.append(float(np.linalg.norm(moved - base) / np.linalg.norm(base)))
        row = by_n.setdefault(n, {"n": n, "shared_eps1": None, "indep_eps1": None, "shared_scaled": None})
        row.update(amp_eps1=amps[0], amp_scaled=amps[1])
        lines.append(f"{n:3d} {amps[0]:14.4f} {amps[1]:14.4f}")
    rows = [by_n[n] for n in sorted(by_n)]
    p1 = [by_n[n] for n in ns]
    n_ratio = ns[-1] / ns[0]
    r_sh = ratio(p1[-1]["shared_eps1"], p1[0]["shared_eps1"])
    r_ind = ratio(p1[-1]["indep_eps1"], p1[0]["indep_eps1"])
    sc_vals = [r["shared_scaled"] for r in p1]
    flat = ratio(max(sc_vals), min(sc_vals))
    checks = {
        "shared_grows_linearly": bool(r_sh > 0.6 * n_ratio),
        "scaled_flat": bool(flat < flat_tol),
        "shared_outgrows_indep": bool(ratio(r_sh, r_ind) > 2),
        "scaled_amp_smaller": all(by_n[n]["amp_scaled"] < by_n[n]["amp_eps1"] for n in amp_ns),
    }
    lines.append("")
    lines.append(
        f"N x{n_ratio:.0f}: shared eps=1 norm x{r_sh:.2f} (linear predicts "
        f"x{n_ratio:.0f}), indep x{r_ind:.2f} (sqrt predicts x{np.sqrt(n_ratio):.1f})"
    )
    lines.append(
        f"scaled max/min {flat:.3f} (< {flat_tol}): {checks['scaled_flat']}; "
        f"scaled amp < eps=1 amp at every N: {checks['scaled_amp_smaller']}"
    )
    return ProofResult(
        proof=3,
        title="pre-LN does not remove correlated accumulation",
        hypothesis="With LN in the branch the shared eps=1 norm grows ~N (independent ~sqrt N); "
        "eps=1/(N sqrt L) keeps it flat and damps weight perturbations.",
        criterion=f"r_sh > 0.6 N_max/N_min; scaled max/min < {flat_tol}; r_sh / r_ind > 2; "
        "amp_scaled < amp_eps1 at every N of part 2",
        arms={
            "shared_eps1": "||h||/sqrt(d), shared weights, eps=1",
            "indep_eps1": "||h||/sqrt(d), independent weights, eps=1",
            "shared_scaled": "||h||/sqrt(d), shared weights, eps=1/(N sqrt L)",
            "amp_eps1": "perturbation amplification, eps=1 (null where not run)",
            "amp_scaled": "perturbation amplification, eps=1/(N sqrt L) (null where not run)",
        },
        rows=rows,
        checks=checks,
        stats={"n_ratio": n_ratio, "shared_ratio": r_sh, "indep_ratio": r_ind, "scaled_max_over_min": flat},
        params={
            "seed": seed,
            "d": d,
            "n_layers": n_layers,
            "ns": list(ns),
            "amp_ns": list(amp_ns),
            "perturb": perturb,
            "scaled": scaled,
            "flat_tol": flat_tol,
        },
        text="\n".join(lines),
        plot_keys=["shared_eps1", "indep_eps1", "shared_scaled"],
        plot_ylabel="||h|| / sqrt(d)",
        seconds=time.perf_counter() - t0,
    )
