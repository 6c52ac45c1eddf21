"""``drmlab mqar``: the MQAR probe on the command line (docs/mqar.md).

Parses the flags into plain arguments of :func:`drmlab.experiments.mqar.plan_study` and
:func:`~drmlab.experiments.mqar.run_planned`, prints each run's line to stderr and the table to
stdout. The defaults below mirror the study's (tests/test_cli.py checks they agree).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli.common import add_runtime_arguments, apply_threads, log_to_stderr, parse_int_list, parse_seeds, split_list
from drmlab.presets import PRESETS

ANCHOR_ARM_NAMES = ("L1_ds8", "L1_ds64", "L4_ds8", "L4_ds64", "L4u_ds8", "L4u_ds64")
ARM_MODELS = ("study", "registry")
DEFAULT_MODELS = "L1_ds64,L4_ds64,L4u_ds64"
DEFAULT_KVS = "4,16"
DEFAULT_SEEDS = "0,1"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mqar", help="multi-query associative recall probe (model x kv accuracy table)",
        description="Train models on synthetic multi-query associative recall through the trainer and tabulate "
                    "the test accuracy on the query positions (mean +- std over seeds) beside chance and the "
                    "reference study's values (docs/mqar.md).",
        epilog="anchor arms: " + " ".join(ANCHOR_ARM_NAMES) + "\nexamples:\n"
               "  drmlab mqar                                   # L1/L4/L4u at d_state 64, kv 4 and 16, seeds 0,1\n"
               "  drmlab mqar --models L4_ds64 --kv 4 --steps 300\n"
               "  drmlab mqar --models GPT2,MAMBA,J --width 128 --kv 4,8,16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"comma-separated registered models (NAME or NAME:ARM, e.g. LOOPED:B) and/or "
                             f"anchor arms (default {DEFAULT_MODELS})")
    parser.add_argument("--kv", default=DEFAULT_KVS, help=f"comma-separated numbers of key-value pairs (default {DEFAULT_KVS})")
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"comma-separated run seeds (default {DEFAULT_SEEDS})")
    parser.add_argument("--preset", default="tiny", choices=PRESETS, help="model preset for the non-width dimensions (default tiny)")
    parser.add_argument("--width", type=int, default=None, help="model width: d_model / n_embd / d_token = d_state "
                        "(docs/mqar.md section 5); default: the preset's (128 for the anchor arms)")
    parser.add_argument("--arm-model", choices=ARM_MODELS, default="study",
                        help="anchor arms: 'study' = untied head + torch default init (default); "
                             "'registry' = LOOPED as registered (tied head, GPT-2 init)")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps per run (default 1500)")
    parser.add_argument("--batch-size", type=int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--vocab-kv", type=int, default=64, help="number of keys = number of values (default 64)")
    parser.add_argument("--queries", type=int, default=None, help="queries per sequence (default kv)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default 2*kv + queries + 4)")
    parser.add_argument("--n-train", type=int, default=4096,
                        help="training sequences (default 4096); 0 = a fresh batch every step")
    parser.add_argument("--n-test", type=int, default=1024, help="test sequences (default 1024)")
    parser.add_argument("--set", dest="assignments", action="append", metavar="KEY=VALUE",
                        help="a TrainConfig or model-config setting for every run (repeatable), e.g. lr=3e-4, d_state=16")
    parser.add_argument("--out", default="runs/mqar", help="output folder (default runs/mqar)")
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments import mqar, mqar_report
    from drmlab.cli.common import parse_assignments

    apply_threads(args)
    study = mqar.plan_study(split_list(args.models, "models"), parse_int_list(args.kv, "kv"), parse_seeds(args.seeds),
                            preset=args.preset, width=args.width, steps=args.steps, batch_size=args.batch_size,
                            vocab_kv=args.vocab_kv, queries=args.queries, seq_len=args.seq_len, n_train=args.n_train,
                            n_test=args.n_test, arm_model=args.arm_model, settings=parse_assignments(args.assignments))
    summary = mqar.run_planned(study, args.out, device=args.device, quiet=args.quiet, log=log_to_stderr)
    print(mqar_report.markdown(summary), end="")
    print(f"wrote {Path(args.out) / 'mqar.md'}, mqar.json, mqar.png")
    return 0
