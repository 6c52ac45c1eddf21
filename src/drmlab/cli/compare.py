"""``drmlab compare``: bits per byte beside MQAR accuracy, from finished studies (docs/mqar.md
section 7); the table and the plot are :mod:`drmlab.experiments.probes.compare`'s."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from drmlab.cli import common


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="join ablation (bits per byte) and MQAR studies into one table and plot",
        description="Join finished studies by model name: validation bits per byte from `drmlab ablate` beside "
        "MQAR test accuracy from `drmlab mqar`. Nothing is trained or rescored; the protocols of both "
        "studies are written above the table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  drmlab compare --ablate studies/ablate-tiny --mqar studies/mqar-tiny --out studies/compare",
    )
    p.add_argument(
        "--ablate", action="append", default=[], metavar="DIR", help="a `drmlab ablate` study folder (repeatable)"
    )
    p.add_argument("--mqar", metavar="DIR", help="a `drmlab mqar` output folder")
    p.add_argument("--kv", type=int, default=None, help="the MQAR number of pairs to show (default: the study's first)")
    common.add_out_argument(
        p, "output folder for compare.md and compare.png (default compare)", default="compare", metavar=None
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.probes.compare import write_compare

    if not args.ablate and not args.mqar:
        raise ValueError("give at least one --ablate DIR or --mqar DIR")
    common.refuse_run_output(args.out, "--out")
    text, plotted = write_compare(args.ablate, args.mqar, args.out, kv=args.kv, log=common.log_to_stderr)
    print(text, end="")
    print(f"wrote {Path(args.out) / 'compare.md'}" + (", compare.png" if plotted else ""), file=sys.stderr)
    return 0
