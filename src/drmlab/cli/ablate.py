"""``drmlab ablate``: the paired ablation protocol on the command line (docs/drm.md section A.7).

Parses the flags into plain arguments of :func:`drmlab.experiments.ablate.protocol.run_study`, prints each
run's progress to stderr and the results table to stdout. ``--set KEY=VALUE`` is a train setting
for every run, ``--set MODEL.KEY=VALUE`` a model setting of that model only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli.common import (add_data_arguments, add_lr_sweep_arguments, add_runtime_arguments, add_tensorboard_argument, apply_threads, check_sweep_only,
                               check_tensorboard, log_to_stderr, parse_seeds, split_list, written_files)
from drmlab.naming import suggest
from drmlab.presets import PRESETS

DEFAULT_MODELS = "J,SSM_CONTROL,GPT2"
DEFAULT_SEEDS = "1,2,3"

EPILOG = """\
examples:
  drmlab ablate                                     # J, SSM_CONTROL, GPT2 x seeds 1,2,3, tiny, 5,005,312 tokens
  drmlab ablate --models J,J_NO_DIRECTION --seeds 1,2,3 --preset tiny --tokens 1M --out studies/dir
  drmlab ablate --models J,GPT2 --set J.d_state=64 --set lr=1e-3
  drmlab ablate --models J,GPT2 --lr-grid 5e-4,1e-3,2e-3,4e-3 --tune-tokens 1M   # each at its own best lr
  drmlab ablate --models J --seeds 1 --lr-grid 4e-3,8e-3 --sweep-only   # tune at the full budget, no paired runs

  With --lr-grid every model first trains once per rate (first seed, --tune-tokens tokens), is scored
  on a slice held out of the training split, and runs its seeds at its best rate.
  Rerun the same command to resume an interrupted study; run it in a second terminal to use a second
  core (each process takes the runs the other does not hold; give each --threads 1 on 2 cores). Settings: --set KEY=VALUE applies a train
  setting to every run; --set MODEL.KEY=VALUE a model setting to that model only.

promotion gate (the reference's, for every ordered pair candidate/baseline): >= 3 paired seeds,
mean CE gain >= 0.005 nats, wins >= 2 of 3 seeds, candidate population std <= 0.03.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ablate",
        help="paired ablation: several models x seeds on the same batches, with the promotion gate",
        description="Train every model once per seed with identical batches (per seed), rescore each on the "
                    "validation stream, and tabulate mean +- std, per-seed pairs and the promotion gate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated model names, NAME or NAME:ARM for a named arm such as LOOPED:B "
                             f"(default {DEFAULT_MODELS})")
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"comma-separated seeds (default {DEFAULT_SEEDS})")
    parser.add_argument("--preset", default="tiny", choices=PRESETS, help="model size and training defaults (default tiny)")
    parser.add_argument("--tokens", default=None, metavar="N", help="token budget per run (default 5,005,312 = 611 x 8,192)")
    parser.add_argument("--out", default=None, metavar="DIR", help="study directory (default studies/ablate-PRESET)")
    add_data_arguments(parser)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    add_lr_sweep_arguments(parser)
    parser.add_argument("--eval-tokens", default=None, metavar="N", help="cap on validation tokens rescored per run (default: all)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="[MODEL.]KEY=VALUE",
                        help="train setting for every run, or MODEL.KEY=VALUE for one model's config; repeatable")
    parser.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast for training")
    add_tensorboard_argument(parser, "each run's directory (OUT/runs/MODEL-seedS)")
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def train_settings(args: argparse.Namespace, assignments: dict) -> dict:
    """The train settings of the flags (--lr, --bf16, --eval-tokens), then ``--set KEY=VALUE``."""
    flags = {"lr": args.lr, "bf16": args.bf16,
             "eval_tokens": None if args.eval_tokens in (None, "all") else args.eval_tokens}
    return {**{k: v for k, v in flags.items() if v is not None}, **assignments}


def split_settings(assignments: dict, models: list[str]) -> tuple[dict, dict[str, dict]]:
    """``--set`` assignments -> (train settings, {model: its settings}) by the ``MODEL.`` prefix."""
    train, per_model = {}, {}
    for key, value in assignments.items():
        prefix, dot, name = key.partition(".")
        if not dot:
            train[key] = value
        elif prefix not in models:
            raise ValueError(f"--set {key}: {prefix!r} is not one of --models{suggest(prefix, models)}")
        else:
            per_model.setdefault(prefix, {})[name] = value
    return train, per_model


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.ablate import protocol as ablate
    from drmlab.experiments.ablate import report as ablate_report
    from drmlab.cli.common import parse_assignments

    check_tensorboard(args)
    check_sweep_only(args)
    apply_threads(args)
    models = split_list(args.models, "models")
    seeds = parse_seeds(args.seeds)
    train, model_settings = split_settings(parse_assignments(args.assignments), models)
    out = Path(args.out or f"studies/ablate-{args.preset}")
    results = ablate.run_study(models, seeds, out=out, preset=args.preset, tokens=args.tokens,
                               train=train_settings(args, train), model_settings=model_settings, data=args.data,
                               tokenizer=args.tokenizer or "bytes", cache_dir=args.cache_dir, device=args.device,
                               quiet=args.quiet, log=log_to_stderr, lr_grid=args.lr_grid, tune_tokens=args.tune_tokens,
                               tensorboard=args.tensorboard, sweep_only=args.sweep_only)
    print(ablate_report.markdown(results))
    print(f"results in {out}/: " + written_files(out, ["results.md", "results.csv", "results.json"],
                                                 ["curves.png", "seeds.png", "lr_sweep.png"]))
    return 0
