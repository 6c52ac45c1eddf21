"""Numerical proofs of the looped-residual study: correlated accumulation under weight sharing.

The reference study (a weight-tied "looped" GPT with a loop-aware residual scale ε) backs its
ε = 1/N rule with five small numpy proofs (``docs/looped.md`` section 7). Each is
re-implemented here as a function that returns a :class:`ProofResult` (its table, the checks of
its stated criterion, and a verdict ``CONFIRMED`` or ``REFUTED``):

1. :func:`proof1` -- Θ(N²) vs Θ(N): with one matrix applied N times (ε = 1/N) the summed
   residual energy ‖Σ rₙ‖² grows like N²; with N independent matrices like N.
2. :func:`proof2` -- layer-loop vs model-loop: repeating a block N times in a row correlates its
   residuals more than looping the whole stack; ε = 1/(N√L) keeps the final norm bounded.
3. :func:`proof3` -- pre-LN does not remove it: with LayerNorm inside the branch the shared
   unscaled norm still grows ~N (independent ~√N); ε = 1/(N√L) keeps it flat and damps weight
   perturbations.
4. :func:`proof4` -- learning-rate transfer: for a looped tanh residual student trained by full-
   batch GD, the optimal LR shifts down with N when ε = 1 but stays put when ε = 1/N.
5. :func:`proof5` -- mixer-agnostic: the same accumulation with a selective-SSM (Mamba-style)
   mixer, fixed by ε = 1/N.

Modules: ``common`` (the result type, verdicts, the one-BLAS-thread rule, helpers),
``relu_chains`` (proofs 1-3), ``lr_transfer`` (proof 4), ``ssm_mixer`` (proof 5), ``plot``.

With the default arguments every proof draws from the same generators in the same order as the
original scripts and prints their numbers (proof 5 is checked digit for digit against the original
script). Every proof takes ``scaled``: ``scaled=False`` removes the loop-aware scaling (every
ε becomes 1); that is the planted negative, under which each criterion must say REFUTED.

Differences from the original scripts: proof 4 trains each grid point with preallocated
buffers and runs the identical points (N = 1, where ε = 1/N = 1) once, so the full grid takes
~10-15 s of CPU instead of ~490 s; it counts grid notches by list position (the original
crashes on numpy 2 there). Every proof runs with OpenBLAS limited to one thread
(:func:`single_blas_thread`). Proofs 1-3 printed no computed test in the original; their
criteria below formalise the study's reading of the tables. The ratio tests of proofs 3 and 5
(linear vs √N growth, ratio > 2) need N_max/N_min >= 8 to be able to pass.

Python: ``run_proof(number, **settings)`` (settings are the proof function's arguments; seeds and
sizes default to the original values; :func:`proof_settings` lists them). A result's
:meth:`ProofResult.to_json` is ``{"proof", "title", "hypothesis", "criterion", "arms", "rows",
"checks", "stats", "verdict", "params", "seconds", "text"}``, where each row holds ``n`` and one
number per arm (``arms`` maps each row key to its meaning); non-finite numbers are null, as are the
cells a proof does not run (proof 3's amplification at N = 16) and diverged runs (proof 4's "div").
:func:`plot_results` draws the proofs' per-arm numbers against N on log-log axes, one panel each.

This package uses numpy (and matplotlib for the plot) only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from drmlab.experiments.loop.proofs.common import CONFIRMED, REFUTED, ProofResult, single_blas_thread
from drmlab.experiments.loop.proofs.lr_transfer import (
    LR_GRID,
    lr_student_inits,
    lr_teacher_data,
    proof4,
    train_looped_student,
)
from drmlab.experiments.loop.proofs.plot import plot_results
from drmlab.experiments.loop.proofs.relu_chains import proof1, proof2, proof3
from drmlab.experiments.loop.proofs.ssm_mixer import proof5
from drmlab.naming import suggest

__all__ = [
    "CONFIRMED",
    "REFUTED",
    "LR_GRID",
    "PROOFS",
    "ProofResult",
    "lr_student_inits",
    "lr_teacher_data",
    "plot_results",
    "proof1",
    "proof2",
    "proof3",
    "proof4",
    "proof5",
    "proof_settings",
    "run_proof",
    "single_blas_thread",
    "train_looped_student",
]

PROOFS: dict[int, Callable[..., ProofResult]] = {1: proof1, 2: proof2, 3: proof3, 4: proof4, 5: proof5}


def proof_settings(number: int) -> dict[str, Any]:
    """Proof ``number``'s settings (its function's arguments) and their defaults, ``scaled`` included."""
    if number not in PROOFS:
        raise ValueError(f"unknown proof {number!r}; choose from 1-5")
    return {name: p.default for name, p in inspect.signature(PROOFS[number]).parameters.items()}


def run_proof(number: int, **settings) -> ProofResult:
    """Run proof ``number`` (1-5) with ``settings`` overriding its defaults (an unknown name is refused)."""
    known = proof_settings(number)
    for name in settings:
        if name not in known:
            raise ValueError(
                f"proof {number} has no setting {name!r}{suggest(name, known)}; settings: {', '.join(known)}"
            )
    return PROOFS[number](**settings)
