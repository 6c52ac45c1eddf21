"""The single command-line entry point ``drmlab VERB``.

One module per verb in this package; each exposes ``add_parser(subparsers)`` (registering the verb
and setting ``func``) and ``run(args) -> exit code``. Verb modules import nothing heavy at module
level (no torch, numpy or matplotlib): ``drmlab --help``, ``drmlab VERB --help`` and argument errors
answer at once, and the library below is imported only when a verb runs. Shared arguments
(data, device, threads, sequence length checks) live in :mod:`drmlab.cli.common`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# verb -> module, in the order ``drmlab --help`` lists them.
VERBS = {
    "train": "drmlab.cli.train",
    "eval": "drmlab.cli.eval",
    "generate": "drmlab.cli.generate",
    "inspect": "drmlab.cli.inspect",
    "ablate": "drmlab.cli.ablate",
    "mqar": "drmlab.cli.mqar",
    "loop-study": "drmlab.cli.loop_study",
    "compare": "drmlab.cli.compare",
    "proofs": "drmlab.cli.proofs",
    "residual-probe": "drmlab.cli.residual_probe",
    "readme": "drmlab.cli.readme",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drmlab",
        description="Build, train and judge causal language models with a recurrent latent state.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for module in VERBS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (``drmlab inspect --list | head``): nothing left to say
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        print(f"drmlab {args.verb}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError) as exc:  # bad input, missing or damaged files, a full disk
        print(f"drmlab {args.verb}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
