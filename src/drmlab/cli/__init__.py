"""The single command-line entry point ``drmlab VERB``.

One module per verb in this package; each exposes ``add_parser(subparsers)`` (registering the verb
and setting ``func``) and ``run(args) -> exit code``. Verb modules import nothing heavy at module
level (no torch, numpy or matplotlib): ``drmlab --help``, ``drmlab VERB --help`` and argument errors
answer at once, and the library below is imported only when a verb runs. Every shared flag (--out,
--set, --seed / --seeds, --preset, --device, --threads, --quiet, --tensorboard, the data and lr sweep
flags) is defined once, in :mod:`drmlab.cli.common`, which also turns them into a study's Runtime.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from drmlab.training.pauses import counting_pauses

# Torch's CPU threads (GNU OpenMP) spin while they wait for each other; on a machine shared with other busy
# processes a spinning thread holds a core the others need, and two default runs on 2 cores each kept ~10%
# of their solo speed. Sleeping waits (read by OpenMP when torch loads, so set before any verb imports it;
# a value the user set is kept) -- benchmarks/bench_sharing.py measures both.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# verb -> module, in the order ``drmlab --help`` lists them.
VERBS = {
    "train": "drmlab.cli.train",
    "eval": "drmlab.cli.eval",
    "generate": "drmlab.cli.generate",
    "export": "drmlab.cli.export",
    "lm-eval": "drmlab.cli.lm_eval",
    "inspect": "drmlab.cli.inspect",
    "ablate": "drmlab.cli.ablate",
    "mqar": "drmlab.cli.mqar",
    "specialise": "drmlab.cli.specialise",
    "loop-study": "drmlab.cli.loop_study",
    "compare": "drmlab.cli.compare",
    "report": "drmlab.cli.report",
    "proofs": "drmlab.cli.proofs",
    "residual-probe": "drmlab.cli.residual_probe",
    "geometry": "drmlab.cli.geometry",
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
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given, for advice that repeats it
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with counting_pauses():  # Ctrl-Z / SIGTSTP: the time suspended is left out of every run's times
            return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (``drmlab inspect --list | head``): nothing left to say
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C, or a second SIGINT / SIGTERM during training (StoppedAtOnce)
        print(f"drmlab {args.verb}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except RuntimeError as exc:  # a training stop inside a study (drmlab train reports its own)
        code = training_stop(args.verb, exc)
        if code is None:
            raise
        return code
    except (ValueError, OSError, ImportError) as exc:  # bad input, missing or damaged files, a full disk
        print(f"drmlab {args.verb}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


def training_stop(verb: str, exc: BaseException) -> int | None:
    """One line for a run of a study stopped by a signal (exit 128 + signal) or by the trainer's
    non-finite / divergence guards (exit 1); None for any other error. The trainer's classes are
    looked up only when the trainer was imported (this module imports no torch)."""
    trainer = sys.modules.get("drmlab.training.trainer")
    if trainer is None:
        return None
    if isinstance(exc, trainer.TrainingInterrupted):
        print(f"drmlab {verb}: {exc}\n  rerun the same command to continue", file=sys.stderr)
        return 128 + exc.signal
    if isinstance(exc, trainer.NonFiniteLossError):
        print(f"drmlab {verb}: error: {exc}", file=sys.stderr)
        return 1
    return None
