"""``drmlab loop-study``: the loop study on the command line (docs/looped.md section 4).

Parses the flags into a :class:`~drmlab.experiments.loop.study.LoopSpec` and a Runtime for
:func:`drmlab.experiments.loop.study.run_study`, prints each run's progress to stderr and the ablation
table and the loop table to stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli import common

DEFAULT_ARMS = "A,B,C,I12u,I12"
DEFAULT_SEEDS = "1,2,3"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "loop-study",
        help="train looped arms with paired seeds (eps = 1/N against eps = 1)",
        description="Train arms of the looped-residual study through the ablation protocol and tabulate "
        "validation CE against the loop count N for scaled and unscaled arms.",
        epilog="example:\n  drmlab loop-study --arms A,B,C,I12u,I12 --seeds 1,2,3 --preset tiny --tokens 1M",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated LOOPED arms (default {DEFAULT_ARMS})")
    common.add_seeds_argument(parser, DEFAULT_SEEDS)
    common.add_preset_argument(parser)
    common.add_tokens_argument(parser, "token budget per run (default 1M)")
    common.add_out_argument(parser, "study directory (default studies/loop-PRESET)")
    common.add_data_arguments(parser)
    common.add_study_train_arguments(parser)
    common.add_set_argument(parser, "a train setting for every run, repeatable")
    common.add_bf16_argument(parser)
    parser.add_argument(
        "--eval-loops",
        default=None,
        metavar="N1,N2,...",
        help="also rescore every trained looped arm with its blocks applied N' times for each N' "
        "given (e.g. 2,4,8,16), eps frozen at the trained value and re-set to 1/N' "
        "(docs/looped.md section 4.1); vanilla arms are reported as not applicable",
    )
    common.add_runtime_arguments(parser)
    common.add_leave_held_argument(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.ablate import report
    from drmlab.experiments.loop.study import LoopSpec, run_study

    common.check_sweep_only(args)
    runtime = common.runtime(args, log=common.log_to_stderr)
    spec = LoopSpec(
        models=common.split_list(args.arms, "arms"),
        seeds=common.parse_seeds(args.seeds),
        preset=args.preset,
        tokens=args.tokens,
        train=common.train_settings(args, common.parse_assignments(args.assignments)),
        data=args.data,
        tokenizer=args.tokenizer or "bytes",
        lr_grid=args.lr_grid,
        tune_tokens=args.tune_tokens,
        eval_loops=args.eval_loops,
    )
    out = Path(args.out or f"studies/loop-{args.preset}")
    common.refuse_run_output(out, "--out")
    done = run_study(spec, runtime, out, sweep_only=args.sweep_only)
    if done is None:  # --leave-held: the rest is another process's
        return 0
    results, loop_table = done
    print(report.markdown(results))
    print(loop_table)
    extra = " (and eval_loops/, the per-run scores)" if (out / "eval_loops.png").exists() else ""
    print(
        f"results in {out}/: "
        + common.written_files(
            out,
            ["results.md", "results.json", "loop.md"],
            ["curves.png", "seeds.png", "loss_vs_n.png", "lr_sweep.png", "eval_loops.png"],
        )
        + extra
    )
    return 0
