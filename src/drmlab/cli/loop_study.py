"""``drmlab loop-study``: the loop study on the command line (docs/looped.md section 4).

Parses the flags into plain arguments of :func:`drmlab.experiments.loop.study.run_study`, prints
each run's progress to stderr and the ablation table and the loop table to stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli.common import add_data_arguments, add_lr_sweep_arguments, add_runtime_arguments, apply_threads, check_sweep_only, log_to_stderr, parse_seeds, split_list, written_files
from drmlab.presets import PRESETS

DEFAULT_ARMS = "A,B,C,I12u,I12"
DEFAULT_SEEDS = "1,2,3"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "loop-study", help="train looped arms with paired seeds (eps = 1/N against eps = 1)",
        description="Train arms of the looped-residual study through the ablation protocol and tabulate "
                    "validation CE against the loop count N for scaled and unscaled arms.",
        epilog="example:\n  drmlab loop-study --arms A,B,C,I12u,I12 --seeds 1,2,3 --preset tiny --tokens 1M",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated LOOPED arms (default {DEFAULT_ARMS})")
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"comma-separated seeds (default {DEFAULT_SEEDS})")
    parser.add_argument("--preset", default="tiny", choices=PRESETS)
    parser.add_argument("--tokens", default=None, metavar="N", help="token budget per run (default 1M)")
    parser.add_argument("--out", default=None, metavar="DIR", help="study directory (default studies/loop-PRESET)")
    add_data_arguments(parser)
    parser.add_argument("--lr", type=float, default=None)
    add_lr_sweep_arguments(parser)
    parser.add_argument("--eval-tokens", default=None, metavar="N")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="a train setting for every run, repeatable")
    parser.add_argument("--bf16", action="store_true", default=None)
    parser.add_argument("--eval-loops", default=None, metavar="N1,N2,...",
                        help="also rescore every trained looped arm with its blocks applied N' times for each N' "
                             "given (e.g. 2,4,8,16), eps frozen at the trained value and re-set to 1/N' "
                             "(docs/looped.md section 4.1); vanilla arms are reported as not applicable")
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.cli.ablate import train_settings
    from drmlab.experiments.ablate import report as ablate_report
    from drmlab.experiments.loop import study as loop_study
    from drmlab.cli.common import parse_assignments

    check_sweep_only(args)
    apply_threads(args)
    arms = split_list(args.arms, "arms")
    seeds = parse_seeds(args.seeds)
    out = Path(args.out or f"studies/loop-{args.preset}")
    results, loop_table = loop_study.run_study(
        arms, seeds, out=out, preset=args.preset, tokens=args.tokens,
        train=train_settings(args, parse_assignments(args.assignments)), data=args.data,
        tokenizer=args.tokenizer or "bytes", cache_dir=args.cache_dir, device=args.device, quiet=args.quiet,
        log=log_to_stderr, lr_grid=args.lr_grid, tune_tokens=args.tune_tokens, eval_loops=args.eval_loops,
        sweep_only=args.sweep_only)
    print(ablate_report.markdown(results))
    print(loop_table)
    extra = " (and eval_loops/, the per-run scores)" if (out / "eval_loops.png").exists() else ""
    print(f"results in {out}/: " + written_files(out, ["results.md", "results.json", "loop.md"],
                                                 ["curves.png", "seeds.png", "loss_vs_n.png", "lr_sweep.png",
                                                  "eval_loops.png"]) + extra)
    return 0
