"""``drmlab report DIR``: a run or study directory as one self-contained HTML page.

The page is :mod:`drmlab.experiments.report.pages`'s: for a run directory its curves, final numbers,
checkpoint, configuration and data provenance; for an ablation, loop or MQAR study its own tables
and figures, the promotion-gate verdicts and its settings. Figures are embedded, nothing is loaded
from elsewhere, so the file can be mailed or archived alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli import common


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="turn a run or study directory into one self-contained HTML page",
        description="Write one HTML page for a run directory (drmlab train) or a study directory (drmlab ablate, "
        "loop-study, mqar): curves and figures embedded as PNGs, tables, the promotion-gate verdicts, "
        "configuration and data provenance. The page loads nothing from elsewhere (no script, no network).",
        epilog="examples:\n"
        "  drmlab report runs/J-tiny-seed0                 # writes runs/J-tiny-seed0/report.html\n"
        "  drmlab report studies/ablate-tiny --out ablate.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "dir", metavar="DIR", help="a run directory (config.json) or a study directory (study.json or mqar.json)"
    )
    common.add_out_argument(parser, "where to write the page (default DIR/report.html)", metavar="FILE")
    common.add_accept_edited_config_argument(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.report.pages import REPORT_FILE, write_report

    common.refuse_run_output(args.out, "--out", Path(args.dir) / REPORT_FILE)
    for run_dir in [Path(args.dir), *sorted(Path(args.dir).glob("runs/*"))]:  # a run, or a study's runs
        common.accept_edited_config(args, run_dir)
    target = write_report(args.dir, args.out)
    print(f"wrote {target}")
    return 0
