"""The single command-line entry point ``drmlab``.

Every verb lives in the module that owns it; that module exposes
``add_parser(subparsers)`` which registers the verb and sets ``func`` to a callable
taking the parsed ``argparse.Namespace`` and returning an exit code. Modules are
imported only when the CLI is built, so ``import drmlab`` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module path) -- one entry per module that registers verbs.
VERB_MODULES = [
    "drmlab.experiments.inspect",      # drmlab inspect: build a model, run a forward, print diagnostics
    "drmlab.training.command",         # drmlab train
    "drmlab.evaluation.command",       # drmlab eval
    "drmlab.generation.command",       # drmlab generate
    "drmlab.experiments.ablate",       # drmlab ablate
    "drmlab.experiments.loop_study",   # drmlab loop-study
    "drmlab.experiments.mqar",         # drmlab mqar
    "drmlab.experiments.compare",      # drmlab compare: bits per byte beside MQAR accuracy
    "drmlab.experiments.loop_proofs",  # drmlab proofs
    "drmlab.experiments.residual_probe",  # drmlab residual-probe: residual-stream norms and update cosines at init
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drmlab",
        description="Build, train and judge causal language models with a recurrent latent state.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for path in VERB_MODULES:
        importlib.import_module(path).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"drmlab {args.verb}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
