"""``drmlab proofs``: the five loop proofs on the command line (docs/looped.md section 7).

``drmlab proofs [1 2 3 4 5 | all] [--json PATH] [--plot PATH]`` runs the selected proofs of
:mod:`drmlab.experiments.loop.proofs` and prints each one's table, criterion and verdict. One
proof: the JSON is that proof's object (:meth:`~drmlab.experiments.loop.proofs.ProofResult.to_json`);
several (or ``all``): ``{"1": {...}, ..., "5": {...}}`` keyed by proof number. ``--plot`` writes one
PNG with a panel per proof. ``--seed``, ``--d``, ``--ns`` and ``--set NAME=VALUE`` override a
proof's settings, ``--remove-scaling`` runs the planted negative. The exit code is 0 whatever the
verdicts (2 on a usage error).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from drmlab.cli import common

PROOF_NUMBERS = (1, 2, 3, 4, 5)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "proofs",
        help="run the looped-residual numerical proofs (1-5) and print their verdicts",
        description="Numerical proofs of correlated accumulation in looped residual blocks: "
        "1 Theta(N^2) accumulation, 2 layer- vs model-loop, 3 pre-LN, "
        "4 learning-rate transfer, 5 selective-SSM mixer. Each prints its table "
        "and a verdict (CONFIRMED or REFUTED by its stated criterion).",
    )
    p.add_argument("which", nargs="*", default=["all"], metavar="PROOF", help="proof numbers 1-5, or 'all' (default)")
    p.add_argument(
        "--json",
        metavar="PATH",
        help='write the result as JSON: one proof -> its object; several -> {"1": {...}, ..., "5": {...}}',
    )
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG: per-arm numbers against N on log-log axes (one panel per proof)"
    )
    common.add_seed_argument(
        p, "override each selected proof's main seed (proof 4: data seed; proof 5: parameter seed)"
    )
    p.add_argument("--d", type=int, default=None, help="override the width d")
    p.add_argument("--ns", type=int, nargs="+", default=None, metavar="N", help="override the loop counts N")
    common.add_set_argument(
        p,
        "override any other argument of a single proof's function (lists comma-separated, e.g. lrs=0.01,0.1,1)",
        metavar="NAME=VALUE",
    )
    p.add_argument(
        "--remove-scaling", action="store_true", help="planted negative: every eps = 1 (each verdict should be REFUTED)"
    )
    p.set_defaults(func=run)


def selected(which: list[str]) -> list[int]:
    """The proof numbers named on the command line (``all`` or none: every proof)."""
    if not which or "all" in which:
        if which and len(which) > 1:
            raise ValueError("'all' cannot be combined with proof numbers")
        return list(PROOF_NUMBERS)
    out = []
    for w in which:
        if not w.isdigit() or int(w) not in PROOF_NUMBERS:
            raise ValueError(f"unknown proof {w!r}; choose from 1 2 3 4 5 or all")
        if int(w) not in out:
            out.append(int(w))
    return out


def parse_value(name: str, text: str, default):
    """``--set NAME=TEXT`` read as the type of the setting's default (lists comma-separated)."""

    def scalar(t, like):
        if isinstance(like, bool):
            if t.lower() in ("1", "true", "yes"):
                return True
            if t.lower() in ("0", "false", "no"):
                return False
            raise ValueError(f"--set {name}: expected a boolean, got {t!r}")
        if isinstance(like, int):
            return int(t)
        return float(t)

    try:
        if isinstance(default, (tuple, list)):
            like = default[0] if default else 0.0
            return tuple(scalar(t, like) for t in text.split(",") if t.strip())
        return scalar(text, default)
    except ValueError as exc:
        raise ValueError(f"--set {name}={text}: {exc}") from None


def proof_arguments(defaults: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags give one proof whose settings and defaults are ``defaults``."""
    kw: dict[str, Any] = {}
    if args.seed is not None:
        kw["seed"] = args.seed
    if args.d is not None:
        kw["d"] = args.d
    if args.ns:
        kw["ns"] = tuple(args.ns)
    if args.remove_scaling:
        kw["scaled"] = False
    for item in args.assignments or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in defaults or name == "scaled":
            choices = ", ".join(p for p in defaults if p != "scaled")
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME one of {choices}")
        kw[name] = parse_value(name, value.strip(), defaults[name])
    return kw


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.loop.proofs import plot_results, proof_settings, run_proof

    numbers = selected(args.which)
    if args.assignments and len(numbers) > 1:
        raise ValueError("--set applies to a single proof; name one proof")
    results = []
    for number in numbers:
        result = run_proof(number, **proof_arguments(proof_settings(number), args))
        results.append(result)
        print(result.report())
        print()
    if len(results) > 1:
        print("summary: " + ", ".join(f"{r.proof} {r.verdict}" for r in results))
    if args.json:
        payload = results[0].to_json() if len(results) == 1 else {str(r.proof): r.to_json() for r in results}
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
        print(f"wrote {path}")
    if args.plot:
        print(f"wrote {plot_results(results, args.plot)}")
    return 0
