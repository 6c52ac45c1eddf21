"""``drmlab ablate``: the paired ablation protocol on the command line (docs/drm.md section A.7).

Parses the flags into a :class:`~drmlab.experiments.spec.StudySpec` and a
:class:`~drmlab.experiments.spec.Runtime` for :func:`drmlab.experiments.ablate.protocol.run_study`, prints each
run's progress to stderr and the results table to stdout. ``--set KEY=VALUE`` is a train setting
for every run, ``--set MODEL.KEY=VALUE`` a model setting of that model only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli import common
from drmlab.naming import suggest

DEFAULT_MODELS = "J,SSM_CONTROL,GPT2"
DEFAULT_SEEDS = "1,2,3"

EPILOG = """\
examples:
  drmlab ablate                                     # J, SSM_CONTROL, GPT2 x seeds 1,2,3, tiny, 5,005,312 tokens
  drmlab ablate --models J,J_NO_DIRECTION --seeds 1,2,3 --preset tiny --tokens 1M --out studies/dir
  drmlab ablate --models J,GPT2 --set J.d_state=64 --set lr=1e-3
  drmlab ablate --models J,GPT2 --lr-grid 5e-4,1e-3,2e-3,4e-3 --tune-tokens 1M   # each at its own best lr
  drmlab ablate --models J --seeds 1 --lr-grid 4e-3,8e-3 --sweep-only   # tune at the full budget, no paired runs
  drmlab ablate --out studies/dir --status          # where that study stands; writes nothing

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
    parser.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help="comma-separated model names, NAME or NAME:ARM for a "
        f"named arm such as LOOPED:B (default {DEFAULT_MODELS})",
    )
    common.add_seeds_argument(parser, DEFAULT_SEEDS)
    common.add_preset_argument(parser, help="model size and training defaults (default tiny)")
    common.add_tokens_argument(parser, "token budget per run (default 5,005,312 = 611 x 8,192)")
    common.add_out_argument(parser, "study directory (default studies/ablate-PRESET)")
    common.add_data_arguments(parser)
    common.add_study_train_arguments(parser)
    common.add_set_argument(
        parser,
        "train setting for every run, or MODEL.KEY=VALUE for one model's config; repeatable",
        metavar="[MODEL.]KEY=VALUE",
    )
    common.add_bf16_argument(parser)
    common.add_compile_argument(
        parser, "off: the study's speed columns then compare the models eager, and --fast compiles every run"
    )
    parser.add_argument(
        "--lr-from",
        metavar="RESULTS_JSON",
        help="train each model at the rate another study chose for it (that study's results.json), "
        "instead of --lr or --lr-grid",
    )
    parser.add_argument(
        "--restore",
        metavar="RESULTS_JSON",
        help="continue a study begun on another machine: take the finished runs and sweep runs of its "
        "results.json (copied from its --out) and train only the rest",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="say where the study in --out stands (each run done, training now and by whom, stopped part-way or "
        "not begun; the training hours left) and exit; writes nothing",
    )
    common.add_tensorboard_argument(parser, "each run's directory (OUT/runs/MODEL-seedS)")
    common.add_runtime_arguments(parser)
    common.add_leave_held_argument(parser)
    parser.set_defaults(func=run)
    return parser


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
    from drmlab.experiments.ablate import protocol, report
    from drmlab.experiments.spec import StudySpec

    if args.status:
        from drmlab.experiments.ablate.status import format_status, study_status

        out = Path(args.out or f"studies/ablate-{args.preset}")
        print(format_status(out, study_status(out)))
        return 0

    common.check_sweep_only(args)
    runtime = common.runtime(args, log=common.log_to_stderr)  # --tensorboard checked, --threads applied
    models = common.split_list(args.models, "models")
    train, model_settings = split_settings(common.parse_assignments(args.assignments), models)
    spec = StudySpec(
        models=models,
        seeds=common.parse_seeds(args.seeds),
        preset=args.preset,
        tokens=args.tokens,
        train=common.train_settings(args, train),
        model_settings=model_settings,
        data=args.data,
        tokenizer=args.tokenizer or "bytes",
        lr_grid=args.lr_grid,
        tune_tokens=args.tune_tokens,
        rates=None if args.lr_from is None else rates_from(args.lr_from, models),
    )
    if args.lr_from is not None:
        same_recipe(args.lr_from, spec.train.get("recipe"))
    out = Path(args.out or f"studies/ablate-{args.preset}")
    common.refuse_run_output(out, "--out")
    if args.restore:
        restore(args.restore, out, runtime)
    results = protocol.run_study(spec, runtime, out, sweep_only=args.sweep_only)
    if results is None:  # --leave-held: the rest is another process's
        return 0
    print(report.markdown(results))
    print(
        f"results in {out}/: "
        + common.written_files(
            out, ["results.md", "results.csv", "results.json"], ["curves.png", "seeds.png", "lr_sweep.png"]
        )
    )
    return 0


def rates_from(path: str, models: list[str]) -> dict[str, float]:
    """``--lr-from``: each model's rate as the study of ``path`` (its results.json) chose it."""
    from drmlab.runs import read_json

    try:
        chosen = read_json(path)["models"]
        rates = {m: chosen[m]["lr"] for m in models if m in chosen}
    except (OSError, ValueError) as exc:
        raise ValueError(f"--lr-from: {exc}") from None
    except (KeyError, TypeError):
        raise ValueError(f"--lr-from {path}: not the results.json of an ablation study") from None
    missing = [m for m in models if rates.get(m) is None]
    if missing:
        raise ValueError(f"--lr-from {path}: no chosen rate for {', '.join(missing)} in that study")
    return rates


def same_recipe(path: str, asked: str | None) -> None:
    """``--lr-from`` a study of another recipe is refused naming both: a rate chosen under one schedule and
    decay says little of the best under another."""
    from drmlab.runs import read_json
    from drmlab.training.recipes import DEFAULT_RECIPE

    chosen_under = read_json(path).get("study", {}).get("train", {}).get("recipe", DEFAULT_RECIPE)
    if chosen_under != (asked or DEFAULT_RECIPE):
        raise ValueError(
            f"--lr-from {path}: its rates were chosen under recipe {chosen_under!r}, this study trains under "
            f"{asked or DEFAULT_RECIPE!r}; sweep this recipe's own rates (--lr-grid) or give --recipe {chosen_under}"
        )


def restore(path: str, out: Path, runtime) -> None:
    """``--restore``: the finished runs of a results.json written into ``out`` (one line says how many)."""
    from drmlab.experiments.ablate.restore import restore_study
    from drmlab.runs import read_json

    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--restore: {exc}") from None
    try:
        counts = restore_study(record, out)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"--restore {path}: not the results.json of an ablation study ({exc!r})") from None
    except ValueError as exc:
        raise ValueError(f"--restore {path}: {exc}") from None
    runtime.say(
        f"restored from {path}: {counts['restored']} finished runs written, {counts['kept']} already here, "
        f"{counts['left']} left as this machine has them"
    )
