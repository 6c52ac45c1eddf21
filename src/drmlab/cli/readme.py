"""``drmlab readme``: render the README's study tables and figure from the committed results, or check them.

The numbers live in ``docs/studies/NAME/results.json``; the rendering and the checks are
:mod:`drmlab.experiments.readme_tables`. ``--write`` rewrites every block between
``<!-- generated: NAME -->`` and ``<!-- end generated -->`` and ``docs/figures/compare-tiny.png``;
``--check`` (the default) changes nothing and exits 1 naming each block, figure or quoted number
of the prose that differs from the committed results.
"""

from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  drmlab readme --check       # exit 1 and name every block, figure or prose number that differs
  drmlab readme --write       # regenerate the tables and the figure after editing docs/studies
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "readme", help="render (--write) or check (--check) the README's study tables and figure from docs/studies",
        description="Render the README's study tables and figure from the committed results in docs/studies, "
                    "or check that the README (tables, figure and the numbers its prose quotes) matches them.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="compare only; exit 1 if anything differs (default)")
    action.add_argument("--write", action="store_true", help="rewrite the generated blocks and the figure")
    parser.add_argument("--root", default=".", metavar="DIR",
                        help="the repository root holding README.md and docs/studies (default: the current folder)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments import readme_tables

    if args.write:
        for name in readme_tables.write(args.root):
            print(f"rewrote {name}")
    problems = readme_tables.check(args.root)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print("README.md and its figure match docs/studies")
    return 1 if problems else 0
