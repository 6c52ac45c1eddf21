"""Loop proof 4 (docs/looped.md section 7): learning-rate transfer across the loop count N for a
looped tanh residual student trained by full-batch gradient descent on a tanh teacher; with eps = 1
the optimal learning rate shifts down as N grows, with eps = 1/N it stays put.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from drmlab.experiments.loop.proofs.common import ProofResult, blas_single, check_ns

LR_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


@blas_single
def train_looped_student(X, Y, W, P, lr, eps, n_loop, steps, div_at=1e6):
    """Full-batch GD on one looped tanh residual student; final loss, or None if it diverged.

    Student: ``h_0 = X``, ``h_{k+1} = h_k + ε·tanh(h_k Wᵀ)``, prediction ``h_N Pᵀ``, loss the
    mean squared error over all entries; exact manual backprop (the shared W sums its gradient
    over the N applications). Each step: forward, loss; a loss that is non-finite or above
    ``div_at`` ends the run as diverged; otherwise update W and P. The returned loss is the
    one of the last forward (before its update). Buffers are reused across steps: the arrays
    are small, and fresh allocations dominated the run time.
    """
    W, P = W.copy(), P.copy()
    coef = 2.0 / Y.size
    hs = [X] + [np.empty_like(X) for _ in range(n_loop)]
    acts = [np.empty_like(X) for _ in range(n_loop)]
    tmp, v, g = np.empty_like(X), np.empty_like(X), np.empty_like(X)
    gW, tW = np.empty_like(W), np.empty_like(W)
    e = np.empty_like(Y)
    loss = None
    with np.errstate(all="ignore"):
        for _ in range(steps):
            for k in range(n_loop):
                np.matmul(hs[k], W.T, out=acts[k])
                np.tanh(acts[k], out=acts[k])
                np.multiply(acts[k], eps, out=tmp)
                np.add(hs[k], tmp, out=hs[k + 1])
            h = hs[n_loop]
            np.matmul(h, P.T, out=e)
            e -= Y
            loss = float(np.mean(e**2))
            if not (math.isfinite(loss) and loss <= div_at):
                return None
            gP = coef * (e.T @ h)
            np.matmul(e, P, out=g)
            g *= coef
            gW.fill(0.0)
            for k in range(n_loop - 1, -1, -1):
                np.square(acts[k], out=tmp)
                np.subtract(1.0, tmp, out=tmp)  # 1 - tanh²
                np.multiply(g, eps, out=v)
                v *= tmp  # v = ε·g ⊙ (1 - tanh²)
                np.matmul(v.T, hs[k], out=tW)
                gW += tW
                np.matmul(v, W, out=tmp)
                g += tmp
            W -= lr * gW
            P -= lr * gP
    return loss


def lr_teacher_data(seed: int = 0, n_samples: int = 256, d: int = 64, d_out: int = 8):
    """Proof 4's data: X (n_samples×d)/8, W* (d×d)/8, P* (d_out×d)/8; Y = tanh(X W*ᵀ) P*ᵀ."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_samples, d)) / 8
    W_star = rng.normal(size=(d, d)) / 8
    P_star = rng.normal(size=(d_out, d)) / 8
    return X, np.tanh(X @ W_star.T) @ P_star.T


def lr_student_inits(init_seed: int = 42, count: int = 7, d: int = 64, d_out: int = 8):
    """Proof 4's student inits for one (N, mode): a new generator, per LR W·0.5/8 then P/8."""
    rng = np.random.default_rng(init_seed)
    out = []
    for _ in range(count):
        W0 = rng.normal(size=(d, d)) * 0.5 / 8
        P0 = rng.normal(size=(d_out, d)) / 8
        out.append((W0, P0))
    return out


def _argmin_first(losses) -> int | None:
    best = None
    for i, v in enumerate(losses):
        if v is not None and (best is None or v < losses[best]):
            best = i
    return best


@blas_single
def proof4(
    seed: int = 0,
    init_seed: int = 42,
    n_samples: int = 256,
    d: int = 64,
    d_out: int = 8,
    ns=(1, 2, 4, 8),
    lrs=LR_GRID,
    steps: int = 300,
    scaled: bool = True,
    min_shift: float = 4.0,
) -> ProofResult:
    """Proof 4 -- learning-rate transfer across N for a looped tanh residual student.

    Hypothesis: with ε = 1 the optimal GD learning rate shifts down as N grows (the looped map's
    sensitivity grows with N); with ε = 1/N it stays where it is at N = 1.

    Procedure: data generator ``seed`` draws X (n_samples×d)/8, W* (d×d)/8, P* (d_out×d)/8;
    teacher Y = tanh(X W*ᵀ) P*ᵀ. For each N and mode (unscaled ε=1, scaled ε=1/N) a new
    generator ``init_seed`` gives the LR runs, in grid order, W = normal·0.5/8 then P = normal/8;
    each run is ``steps`` steps of full-batch GD (divergence: loss non-finite or > 1e6). The
    optimum is the first argmin over the grid.

    Criterion: opt_unscaled(N_min)/opt_unscaled(N_max) >= ``min_shift`` AND every scaled
    optimum is within one grid position of the scaled N_min optimum.
    """
    t0 = time.perf_counter()
    ns = check_ns(ns)
    lrs = tuple(float(x) for x in lrs)
    X, Y = lr_teacher_data(seed, n_samples, d, d_out)

    modes = ("unscaled", "scaled")
    losses: dict[tuple[int, str], list] = {}
    done: dict[tuple, float | None] = {}
    for n in ns:
        for mode in modes:
            inits = lr_student_inits(init_seed, len(lrs), d, d_out)
            eps = 1.0 / n if (mode == "scaled" and scaled) else 1.0
            ls = []
            for lr, (W0, P0) in zip(lrs, inits):
                # (N, mode) pairs with equal ε (N = 1, or scaling removed) are the same runs
                key = (n, eps, lr, len(ls))
                if key not in done:
                    done[key] = train_looped_student(X, Y, W0, P0, lr, eps, n, steps)
                ls.append(done[key])
            losses[(n, mode)] = ls

    head = f"{'N':>3} {'mode':>9}" + "".join(f"{lr:>9g}" for lr in lrs) + f"{'opt':>9}"
    lines = [head]
    opt_idx: dict[tuple[int, str], int | None] = {}
    rows = []
    for n in ns:
        row: dict[str, Any] = {"n": n}
        for mode in modes:
            ls = losses[(n, mode)]
            i = _argmin_first(ls)
            opt_idx[(n, mode)] = i
            opt = lrs[i] if i is not None else None
            row[mode] = opt
            row[f"loss_{mode}"] = ls
            cells = "".join(f"{v:9.4f}" if v is not None else f"{'div':>9}" for v in ls)
            lines.append(f"{n:3d} {mode:>9}{cells}{(f'{opt:9g}' if opt is not None else '     none')}")
        rows.append(row)

    u0, uN = opt_idx[(ns[0], "unscaled")], opt_idx[(ns[-1], "unscaled")]
    s0 = opt_idx[(ns[0], "scaled")]
    shift = (lrs[u0] / lrs[uN]) if (u0 is not None and uN is not None) else None
    within = s0 is not None and all(
        opt_idx[(n, "scaled")] is not None and abs(opt_idx[(n, "scaled")] - s0) <= 1 for n in ns
    )
    checks = {
        "unscaled_optimum_shifts": bool(shift is not None and shift >= min_shift),
        "scaled_optimum_within_one_notch": bool(within),
    }
    opts = {mode: [r[mode] for r in rows] for mode in modes}
    lines.append("")
    lines.append(
        f"unscaled optima {opts['unscaled']}, scaled {opts['scaled']}; "
        f"shift {f'{shift:.1f}x' if shift is not None else 'n/a'} (>= {min_shift:g}); "
        f"scaled within one notch: {within}"
    )
    if u0 is not None and u0 == len(lrs) - 1:
        lines.append("note: the N_min optimum sits on the top edge of the grid (censored)")
    return ProofResult(
        proof=4,
        title="learning-rate transfer across N",
        hypothesis="With eps=1 the optimal LR shifts down with N; with eps=1/N it transfers.",
        criterion=f"opt_unscaled(N_min)/opt_unscaled(N_max) >= {min_shift:g} and every scaled "
        "optimum within one grid position of the scaled N_min optimum",
        arms={
            "unscaled": "optimal LR (first argmin over the grid), eps=1",
            "scaled": "optimal LR, eps=1/N",
            "loss_unscaled": "final loss per grid LR (null = diverged), eps=1",
            "loss_scaled": "final loss per grid LR (null = diverged), eps=1/N",
        },
        rows=rows,
        checks=checks,
        stats={"lrs": list(lrs), "shift": shift, "optima": opts},
        params={
            "seed": seed,
            "init_seed": init_seed,
            "n_samples": n_samples,
            "d": d,
            "d_out": d_out,
            "ns": list(ns),
            "lrs": list(lrs),
            "steps": steps,
            "scaled": scaled,
            "min_shift": min_shift,
        },
        text="\n".join(lines),
        plot_keys=["unscaled", "scaled"],
        plot_ylabel="optimal learning rate",
        seconds=time.perf_counter() - t0,
    )
