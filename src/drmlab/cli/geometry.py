"""``drmlab geometry``: the geometry instruments (docs/geometry.md) on a trained run's validation stream.

Writes ``geometry.json``, ``tables.md`` and plots into ``RUN/geometry/`` (or ``--out``). The model is
the run's checkpoint in float64; the tokens are the first N of the run's validation stream (the
data and tokenizer of ``drmlab eval``).
"""

from __future__ import annotations

import argparse

from drmlab.cli import common
from drmlab.cli.common import add_data_arguments, add_runtime_arguments
from drmlab.cli.machine import apply_threads

EPILOG = """\
examples:
  drmlab geometry --ckpt runs/J-tiny-seed0                 # 512 validation tokens
  drmlab geometry --ckpt runs/J-tiny-seed0 --tokens 4096 --out /tmp/geo

instruments: the learned metric's exact kernel and ranks, rank strata, the decoder pullback metric
J^T (diag p - p p^T) J and its agreement with the learned metric, connection (holonomy, transport of
the directions between block starts), the model's block paths against geodesics, persistent
homology of the visited states (needs: pip install 'drmlab[geometry]'). A model without a metric
gets those that apply, and one line naming the others. Runs on one CPU thread unless --threads says
otherwise: the instruments are many small operations, where more threads only add overhead.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "geometry",
        help="geometry instruments (metric kernel, strata, pullback, holonomy, geodesics, topology) on a run",
        description="Run the geometry instruments of docs/geometry.md on a trained run's validation stream and "
        "write geometry.json, tables.md and plots.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, metavar="RUN", help="a run directory written by drmlab train")
    common.add_accept_edited_config_argument(parser)
    parser.add_argument("--tokens", default="512", metavar="N", help="validation tokens to measure on (default 512)")
    parser.add_argument(
        "--geodesic-hvp",
        type=int,
        default=None,
        metavar="N",
        help="Hessian-vector products the geodesic solve may spend (default 400; docs/geometry.md section 5)",
    )
    common.add_out_argument(parser, "output folder (default RUN/geometry)")
    add_data_arguments(parser, run="the run's")
    add_runtime_arguments(parser, device_default="cpu")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.geometry.run import run_geometry
    from drmlab.training.config import parse_tokens

    common.refuse_run_output(args.out, "--out")
    common.accept_edited_config(args, args.ckpt)
    common.say_recovered_checkpoint(args.ckpt)
    tokens = parse_tokens(args.tokens)
    if tokens < 2:
        raise ValueError(f"--tokens must be at least 2, got {args.tokens}")
    if args.threads is None:  # many small operations: more threads only add overhead (docs/geometry.md section 7)
        args.threads = 1
    budget = None
    if args.geodesic_hvp is not None:
        from drmlab.geometry.run import GeometryBudget

        if args.geodesic_hvp < 1:
            raise ValueError(f"--geodesic-hvp must be at least 1, got {args.geodesic_hvp}")
        # the iteration cap follows: the products are the budget that binds
        budget = GeometryBudget(geodesic_max_hvp=args.geodesic_hvp, geodesic_max_iter=max(200, args.geodesic_hvp))
    apply_threads(args)
    record, files = run_geometry(
        args.ckpt,
        tokens=tokens,
        out=args.out,
        device=args.device,
        data=args.data,
        tokenizer=args.tokenizer,
        cache_dir=args.cache_dir,
        budget=budget,
    )
    if not args.quiet:
        for name, result in record["instruments"].items():
            print(f"{name:<11} {result['seconds']:8.2f} s")
    for note in record["notes"]:
        print(note)
    print(
        f"{record['model']}: {len(record['instruments'])} instruments on {record['tokens']:,} tokens in "
        f"{record['seconds']:.1f} s; written to {', '.join(str(f) for f in files)}"
    )
    return 0
