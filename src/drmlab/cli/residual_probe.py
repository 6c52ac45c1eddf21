"""``drmlab residual-probe``: the residual-stream profile of a model at initialisation, printed one
row per block application (docs/looped.md section 6; :mod:`drmlab.experiments.probes.residual`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drmlab.cli import common, machine


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "residual-probe",
        help="per-layer residual-stream norm and update cosines of a model at init",
        description="Build MODEL at PRESET (at initialisation), run random tokens through it and print, per "
        "block application, the residual-stream norm ||x||/sqrt(d), the update norm, and the cosine "
        "between successive updates and between updates of the same stored block.",
    )
    p.add_argument("--model", default="LOOPED", help="registered model name (default LOOPED)")
    common.add_preset_argument(p)
    common.add_set_argument(p, "model setting, e.g. --set arm=E3 or --set n_loop=4 (repeatable)")
    common.add_seed_argument(p, "model and token seed (default 0)", default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=None, help="tokens per sequence (default: the model's limit, <= 256)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    common.add_threads_argument(p)
    p.set_defaults(func=run)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.probes.residual import probe_model

    machine.apply_threads(args)
    report = probe_model(
        args.model,
        args.preset,
        seed=args.seed,
        batch=args.batch,
        length=args.length,
        **common.parse_assignments(args.assignments),
    )
    rows, summary = report["rows"], report["summary"]
    batch, length = report["tokens"]
    print(f"residual stream of {args.model} at init (preset {args.preset}, {batch} x {length} tokens)")
    print(f"{'layer':>5} {'block':>5} {'norm':>10} {'update':>10} {'cos_prev':>9} {'cos_same':>9}")
    for r in rows:
        print(
            f"{r['layer']:>5} {_fmt(r['block'], 'd'):>5} {r['norm']:>10.4f} {_fmt(r['update_norm'], '.4f'):>10} "
            f"{_fmt(r['cos_prev'], '.4f'):>9} {_fmt(r['cos_same_block'], '.4f'):>9}"
        )
    print(
        f"final/initial norm {summary['norm_ratio']:.4f}; mean cos(successive updates) "
        f"{_fmt(summary['mean_cos_prev'], '.4f')}; "
        f"mean cos(same block) {_fmt(summary['mean_cos_same_block'], '.4f')}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0
