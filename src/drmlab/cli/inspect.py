"""``drmlab inspect``: one model's diagnostics on the command line.

``drmlab inspect --model NAME --preset P [--set KEY=VALUE ...]`` builds a registered model
(untrained), ``drmlab inspect --ckpt RUN_DIR`` loads a trained run; either way it runs one forward
pass on real text and prints the report of :mod:`drmlab.experiments.probes.inspect` (parameters, forward
time, cross-entropy beside the uniform guess, and the geometry diagnostics of the DRM family).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drmlab.cli import common, machine

DEFAULT_MODEL = "J"
DEFAULT_PRESET = "tiny"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="build a model, run a forward pass and print its diagnostics",
        description="Build MODEL at PRESET (or load a trained run with --ckpt), run one forward pass on a piece "
        "of real text and print the parameter count, the cross-entropy and (for DRM variants) the "
        "geometry diagnostics: dimD, metric energy and action, coupling, numerical ranks.",
        epilog="examples:\n  drmlab inspect --model GPT2 --preset micro\n"
        "  drmlab inspect --model LOOPED --set arm=C --json looped.json\n"
        "  drmlab inspect --ckpt runs/J-tiny-seed0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help=f"registered model name (default {DEFAULT_MODEL}; see --list)")
    common.add_preset_argument(p, default=None, help=f"model size (default {DEFAULT_PRESET})")
    common.add_set_argument(p, "a model setting, e.g. --set d_state=64 (repeatable)")
    common.add_seed_argument(p, "initialisation seed (default 0)")
    p.add_argument("--ckpt", default=None, metavar="DIR", help="inspect this trained run instead (a run directory)")
    p.add_argument(
        "--length",
        type=int,
        default=None,
        help="tokens per sequence (default: the preset's training window, or the run's seq_len)",
    )
    p.add_argument("--json", default=None, help="also write the report as JSON to this path")
    p.add_argument("--list", action="store_true", help="list every registered model name and exit")
    p.add_argument(
        "--settings",
        action="store_true",
        help="list every setting --set takes for --model at --preset (train settings, then the model's) with its "
        "value there, and exit",
    )
    common.add_runtime_arguments(p, device_default="cpu", quiet=False)
    p.set_defaults(func=run)


def print_report(report: dict, indent: str = "") -> None:
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            print_report(value, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], list):
            print(f"{indent}{key}: [{len(value)} x {len(value[0])} matrix, see --json]")
        elif isinstance(value, float):
            print(f"{indent}{key}: {value:.6g}")
        else:
            print(f"{indent}{key}: {value}")


def print_settings(name: str, preset: str, assignments: list[str]) -> None:
    """Every name ``--set`` takes for model ``name`` at ``preset``, one a line with its value there: the train
    settings (:class:`drmlab.training.config.TrainConfig`), then the model's config fields."""
    from drmlab.models.registry import config_fields
    from drmlab.training.config import TRAIN_KEYS, resolve_train_config, split_overrides

    common.check_model_names([name])
    fields = config_fields(name, preset)
    train_set, model_set = split_overrides(common.parse_assignments(assignments), fields)
    train = resolve_train_config(preset, **train_set)
    fields = config_fields(name, preset, **model_set)
    print(f"train settings at preset {preset} ({len(TRAIN_KEYS)}):")
    for key in TRAIN_KEYS:
        print(f"  {key} = {json.dumps(getattr(train, key))}")
    print(f"model settings of {name} at preset {preset} ({len(fields)}):")
    for key, value in fields.items():
        print(f"  {key} = {json.dumps(value, default=str)}")


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.probes.inspect import inspect_registered, inspect_run

    if args.list:
        from drmlab.models import list_models

        print("\n".join(list_models()))
        return 0
    if args.settings:
        print_settings(args.model or DEFAULT_MODEL, args.preset or DEFAULT_PRESET, args.assignments)
        return 0
    machine.apply_threads(args)
    if args.ckpt is not None:
        given = [
            flag
            for flag, value in (
                ("--model", args.model),
                ("--preset", args.preset),
                ("--set", args.assignments),
                ("--seed", args.seed),
            )
            if value
        ]
        if given:
            raise ValueError(f"--ckpt inspects the run's own model; drop {', '.join(given)}")
        common.say_recovered_checkpoint(args.ckpt)
        report = inspect_run(args.ckpt, length=args.length, device=args.device)
    else:
        name = args.model or DEFAULT_MODEL
        common.check_model_names([name])
        report = inspect_registered(
            name,
            args.preset or DEFAULT_PRESET,
            seed=args.seed or 0,
            length=args.length,
            device=args.device,
            **common.parse_assignments(args.assignments),
        )
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0
