"""``drmlab mqar``: the MQAR probe on the command line (docs/mqar.md).

Parses the flags into a :class:`~drmlab.experiments.mqar.study.MQARSpec` and a Runtime for
:func:`~drmlab.experiments.mqar.study.run_study`, prints each run's line to stderr and the table to
stdout. The defaults below mirror the study's (tests/cli/test_cli.py checks they agree).
``--protocol distance`` runs :mod:`drmlab.experiments.mqar.distance` instead (docs/mqar.md section 8),
``--protocol zoology`` :mod:`drmlab.experiments.mqar.zoology` (section 10): the flags the protocols
share default to None here and take each protocol's own default.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.cli import common

ANCHOR_ARM_NAMES = ("L1_ds8", "L1_ds64", "L4_ds8", "L4_ds64", "L4u_ds8", "L4u_ds64")
ARM_MODELS = ("study", "registry")
DEFAULT_MODELS = "L1_ds64,L4_ds64,L4u_ds64"
DEFAULT_KVS = "4,16"
DEFAULT_SEEDS = "0,1"
DEFAULT_STEPS, DEFAULT_BATCH_SIZE, DEFAULT_OUT = 1500, 256, "runs/mqar"
PROTOCOLS = ("fixed", "distance", "zoology")
ZOOLOGY_OUT = "runs/mqar-zoology"
# --protocol distance (docs/mqar.md section 8; tests/experiments/test_mqar_distance.py checks they are the study's)
DISTANCE_MODELS = "J_NO_DIRECTION,SSM_CONTROL"
DISTANCE_SEEDS = "1234"
DISTANCE_LENGTHS = "40,512,4096,32768"
DISTANCE_STEPS, DISTANCE_BATCH_SIZE, DISTANCE_LR, DISTANCE_OUT = 2000, 32, 1e-3, "runs/mqar-distance"
DISTANCE_MILESTONES = "250,500,1000,2000"
# drmlab.experiments.mqar.controls.CONTROLS, spelled here so --help needs no torch (a test compares them)
RECALL_CONTROLS = "memory_read_off, memory_write_off, pairs_unwritten, keys_shuffled, queries_shuffled"
DISTANCE_N_EVAL, DISTANCE_EVAL_BATCH, DISTANCE_EVAL_SEED, DISTANCE_CHUNK = 512, 128, 0, 512
DISTANCE_PAIRS, DISTANCE_MAX_PAIRS = 8, 32  # the task's PAIRS and MAX_PAIRS (the 32 key ids)
# the fixed protocol's own flags: refused with --protocol distance unless left at these defaults
FIXED_ONLY = {
    "kv": "--kv",
    "vocab_kv": "--vocab-kv",
    "queries": "--queries",
    "seq_len": "--seq-len",
    "n_train": "--n-train",
    "n_test": "--n-test",
    "arm_model": "--arm-model",
    "lr_grid": "--lr-grid",
}
DISTANCE_ONLY = {
    "lengths": "--lengths",
    "milestones": "--milestones",
    "lr": "--lr",
    "n_eval": "--n-eval",
    "eval_batch": "--eval-batch",
    "eval_seed": "--eval-seed",
    "chunk": "--chunk",
    "read_all": "--read-all",
    "ckpt": "--ckpt",
    "controls": "--controls",
    "pairs": "--pairs",
}


ZOOLOGY_ONLY = {
    "widths": "--widths",
    "seq_lens": "--seq-lens",
    "epochs": "--epochs",
    "early_stop": "--early-stop",
    "restore": "--restore",
    "collect": "--collect",
    "probe_epochs": "--probe-epochs",
    "fast": "--fast",
    "status": "--status",
    "leave_held": "--leave-held",
}


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mqar",
        help="multi-query associative recall probe (model x kv accuracy table)",
        description="Train models on synthetic multi-query associative recall through the trainer and tabulate "
        "the test accuracy on the query positions (mean +- std over seeds) beside chance and the "
        "reference study's values (docs/mqar.md).",
        epilog="anchor arms: " + " ".join(ANCHOR_ARM_NAMES) + "\nexamples:\n"
        "  drmlab mqar                                   # L1/L4/L4u at d_state 64, kv 4 and 16, seeds 0,1\n"
        "  drmlab mqar --models L4_ds64 --kv 4 --steps 300\n"
        "  drmlab mqar --models GPT2,MAMBA,J --width 128 --kv 4,8,16\n"
        "  drmlab mqar --protocol distance --lengths 40,512,4096,32768   # recall after L - 40 filler tokens\n"
        "  drmlab mqar --protocol distance --ckpt runs/specialised --read-all\n"
        "  drmlab mqar --protocol distance --ckpt runs/specialised-p16 --pairs 16 --lengths 80,4096,32768\n"
        "  drmlab mqar --protocol distance --ckpt runs/specialised --lengths 40,4096 "
        "--controls memory_read_off,memory_write_off,keys_shuffled,queries_shuffled",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated registered models (NAME or NAME:ARM, e.g. LOOPED:B) and/or "
        f"anchor arms (default {DEFAULT_MODELS}; distance: {DISTANCE_MODELS})",
    )
    parser.add_argument(
        "--kv", default=DEFAULT_KVS, help=f"comma-separated numbers of key-value pairs (default {DEFAULT_KVS})"
    )
    common.add_seeds_argument(
        parser, None, f"comma-separated run seeds (default {DEFAULT_SEEDS}; distance: {DISTANCE_SEEDS})"
    )
    common.add_preset_argument(parser, help="model preset for the non-width dimensions (default tiny)")
    parser.add_argument(
        "--width",
        type=int,
        default=None,
        help="model width: d_model / n_embd / d_token = d_state "
        "(docs/mqar.md section 5); default: the preset's (128 for the anchor arms)",
    )
    parser.add_argument(
        "--arm-model",
        choices=ARM_MODELS,
        default="study",
        help="anchor arms: 'study' = untied head + torch default init (default); "
        "'registry' = LOOPED as registered (tied head, GPT-2 init)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimizer steps per run (default {DEFAULT_STEPS}; distance: {DISTANCE_STEPS})",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"sequences per step (default {DEFAULT_BATCH_SIZE}; distance: {DISTANCE_BATCH_SIZE})",
    )
    parser.add_argument("--vocab-kv", type=int, default=64, help="number of keys = number of values (default 64)")
    parser.add_argument("--queries", type=int, default=None, help="queries per sequence (default kv)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default 2*kv + queries + 4)")
    parser.add_argument(
        "--n-train", type=int, default=4096, help="training sequences (default 4096); 0 = a fresh batch every step"
    )
    parser.add_argument("--n-test", type=int, default=1024, help="test sequences (default 1024)")
    common.add_set_argument(
        parser, "a TrainConfig or model-config setting for every run (repeatable), e.g. lr=3e-4, d_state=16"
    )
    common.add_lr_grid_argument(
        parser,
        "sweep these rates per model and kv first (first seed, scored on held-out "
        "training sequences, never the test set), then train the seeds at the best one",
    )
    common.add_out_argument(parser, f"output folder (default {DEFAULT_OUT}; distance: {DISTANCE_OUT})", metavar=None)
    common.add_tensorboard_argument(parser, "each run's directory (OUT/runs/MODEL_kvK_sS)")
    add_distance_arguments(parser)
    common.add_runtime_arguments(parser)
    common.add_leave_held_argument(parser, default=None)
    parser.set_defaults(func=run, fixed_only_defaults={dest: parser.get_default(dest) for dest in FIXED_ONLY})
    return parser


def add_distance_arguments(parser: argparse.ArgumentParser) -> None:
    """--protocol and the flags of the distance protocol (docs/mqar.md section 8)."""
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="fixed",
        help="fixed: the kv-table probe above (default); distance: recall of 8 pairs (--pairs) after L - 40 "
        "filler tokens, trained on the 40-token control, read at --lengths; zoology: the "
        "Zoology MQAR protocol (Arora et al. 2024) at --widths x --seq-lens",
    )
    zoo = parser.add_argument_group("--protocol zoology")
    zoo.add_argument("--widths", default=None, help="model widths (default 64,128,256,512)")
    zoo.add_argument(
        "--seq-lens",
        default=None,
        help="sequence lengths, each with its pairs and batch size: "
        "64 (4 pairs), 128 (8), 256 (16), 512 (64) (default all four)",
    )
    zoo.add_argument("--epochs", type=int, default=None, help="epochs over the training set (default 64)")
    zoo.add_argument("--early-stop", type=float, default=None, help="stop a run at this test accuracy (default 0.99)")
    zoo.add_argument(
        "--probe-epochs",
        type=int,
        default=None,
        help="a CPU budget: train every rate for this many epochs (the start of the same run), then only the "
        "best one by test accuracy on to --epochs (default: every rate trains every epoch, as Zoology does)",
    )
    zoo.add_argument(
        "--fast",
        action="store_true",
        default=None,
        help="the fast setting for every run: bf16 autocast where this device multiplies bf16 natively, "
        "torch.compile with a persistent cache, the fused kernels (docs/architecture.md)",
    )
    zoo.add_argument(
        "--collect",
        action="store_true",
        default=None,
        help="train nothing: write the report (zoology.md, results.json) of the runs already finished in OUT",
    )
    zoo.add_argument(
        "--status",
        action="store_true",
        default=None,
        help="train nothing, write nothing: where the study in OUT stands (each run's state, epochs and test "
        "accuracy, who trains it) and the hours it has left; give the options the study runs with",
    )
    zoo.add_argument(
        "--restore",
        metavar="RESULTS_JSON",
        default=None,
        help="first put the finished runs of a committed results.json (e.g. docs/studies/zoology-cpu/results.json) "
        "into OUT, so the study continues from them (a run whose settings differ is trained again)",
    )
    group = parser.add_argument_group("--protocol distance")
    group.add_argument(
        "--pairs",
        type=int,
        default=None,
        metavar="P",
        help=f"key-value pairs per example, 1 to {DISTANCE_MAX_PAIRS} (the byte vocabulary's {DISTANCE_MAX_PAIRS} "
        f"key ids; default {DISTANCE_PAIRS}, or with --ckpt the count its run was specialised at): the control is 5 x P tokens (40, 80, 160 at 8, 16, 32), each "
        "length scores P queries per sequence, and the no-binding levels follow P (docs/mqar.md section 8.2)",
    )
    group.add_argument(
        "--lengths",
        default=None,
        help=f"example lengths L >= 5 x --pairs (default {DISTANCE_LENGTHS}, those above the control at another "
        "--pairs; the control is always read)",
    )
    group.add_argument(
        "--milestones",
        default=None,
        help="training steps at which the control accuracy is measured "
        f"(default: those of {DISTANCE_MILESTONES} below --steps; --steps always is one)",
    )
    group.add_argument("--lr", type=float, default=None, help=f"constant AdamW learning rate (default {DISTANCE_LR:g})")
    group.add_argument(
        "--n-eval",
        type=int,
        default=None,
        help=f"evaluation sequences per length, --pairs targets each (default {DISTANCE_N_EVAL})",
    )
    group.add_argument(
        "--eval-batch", type=int, default=None, help=f"sequences read together (default {DISTANCE_EVAL_BATCH})"
    )
    group.add_argument(
        "--eval-seed", type=int, default=None, help=f"seed of the evaluation sequences (default {DISTANCE_EVAL_SEED})"
    )
    group.add_argument(
        "--chunk",
        type=int,
        default=None,
        help=f"inputs up to this many tokens are one forward; longer "
        f"ones prefill this many and step the rest (default {DISTANCE_CHUNK})",
    )
    group.add_argument("--read-all", action="store_true", help="read the long lengths even when the control failed")
    group.add_argument(
        "--controls",
        default=None,
        metavar="NAME,...",
        help=f"also read every length under these recall controls (docs/mqar.md section 8.1): {RECALL_CONTROLS}. "
        "memory_read_off: the fast-weight memory adds nothing; memory_write_off: nothing is written into it; "
        "pairs_unwritten: nothing is written into it at the written pairs (read token by token); "
        "keys_shuffled: the written keys permuted among the pairs (a binder falls to chance); "
        "queries_shuffled: the queries asked in another order (a recaller keeps its accuracy). Each is "
        "reported beside the plain read with the first-query accuracy and the no-binding levels; a memory "
        "control on a model without the memory is n/a",
    )
    group.add_argument(
        "--ckpt",
        action="append",
        metavar="RUN_DIR",
        help="also evaluate this run directory's model (no training; repeatable); with --ckpt and no "
        "--models nothing is trained",
    )


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments.mqar import report
    from drmlab.experiments.mqar.study import MQARSpec, run_study

    if args.protocol == "distance":
        return run_distance(args)
    if args.protocol == "zoology":
        return run_zoology(args)
    zoology_only = [f for d, f in ZOOLOGY_ONLY.items() if getattr(args, d) is not None]
    if zoology_only:
        raise ValueError(f"{', '.join(zoology_only)}: only with --protocol zoology")
    fixed_defaults(args)
    runtime = common.runtime(args, log=common.log_to_stderr)
    spec = MQARSpec(
        models=common.split_list(args.models, "models"),
        kvs=common.parse_int_list(args.kv, "kv"),
        seeds=common.parse_seeds(args.seeds),
        preset=args.preset,
        width=args.width,
        steps=args.steps,
        batch_size=args.batch_size,
        vocab_kv=args.vocab_kv,
        queries=args.queries,
        seq_len=args.seq_len,
        n_train=args.n_train,
        n_test=args.n_test,
        arm_model=args.arm_model,
        settings=common.parse_assignments(args.assignments),
        lr_grid=args.lr_grid,
    )
    common.refuse_run_output(args.out, "--out")
    summary = run_study(spec, runtime, args.out)
    print(report.markdown(summary), end="")
    print(f"wrote {Path(args.out) / 'mqar.md'}, mqar.json, mqar.png")
    return 0


def fixed_defaults(args: argparse.Namespace) -> None:
    """The fixed protocol's defaults for the flags the two protocols share; distance flags are refused."""
    given = [
        flag
        for dest, flag in DISTANCE_ONLY.items()
        if getattr(args, dest) is not None and getattr(args, dest) is not False
    ]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --protocol distance")
    args.models = args.models or DEFAULT_MODELS
    args.seeds = args.seeds or DEFAULT_SEEDS
    args.steps = DEFAULT_STEPS if args.steps is None else args.steps
    args.batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    args.out = args.out or DEFAULT_OUT


def _specialised_pairs(ckpts: list[str]) -> int | None:
    """The pair count the runs in ``ckpts`` were specialised at (``drmlab specialise --pairs``, in each
    run's config.json), said in one line; None when none was specialised. Runs specialised at different
    counts are refused: give --pairs."""
    from drmlab.runs import read_json

    found = {}
    for ckpt in ckpts:
        path = Path(ckpt) / "config.json"
        settings = (read_json(path).get("specialise") or {}).get("settings") if path.is_file() else None
        if settings is not None:
            found[ckpt] = settings.get("pairs", DISTANCE_PAIRS)  # runs from before --pairs were at 8
    if len(set(found.values())) > 1:
        counts = ", ".join(f"{ckpt}: {pairs}" for ckpt, pairs in found.items())
        raise ValueError(f"--ckpt runs specialised at different pair counts ({counts}): give --pairs")
    if not found:
        return None
    pairs = next(iter(found.values()))
    print(f"pairs {pairs}: the pair count {', '.join(found)} was specialised at (--pairs to read at another)")
    return pairs


def run_distance(args: argparse.Namespace) -> int:
    """``--protocol distance``: a :class:`~drmlab.experiments.mqar.distance.DistanceSpec` for its ``run_study``."""
    from drmlab.experiments.mqar import distance_report
    from drmlab.experiments.mqar.distance import DistanceSpec, run_study

    given = [flag for dest, flag in FIXED_ONLY.items() if getattr(args, dest) != args.fixed_only_defaults[dest]]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --protocol fixed")
    zoology_only = [f for d, f in ZOOLOGY_ONLY.items() if getattr(args, d) is not None]
    if zoology_only:
        raise ValueError(f"{', '.join(zoology_only)}: only with --protocol zoology")
    runtime = common.runtime(args, log=common.log_to_stderr)
    models = (
        common.split_list(args.models, "models")
        if args.models
        else []
        if args.ckpt
        else common.split_list(DISTANCE_MODELS, "models")
    )
    given = {
        key: getattr(args, key)
        for key in ("steps", "batch_size", "lr", "n_eval", "eval_batch", "eval_seed", "chunk", "pairs")
    }
    if given["pairs"] is None and args.ckpt:
        given["pairs"] = _specialised_pairs(args.ckpt)
    spec = DistanceSpec(  # a flag not given takes the spec's default (the DISTANCE_* values above)
        models=models,
        seeds=common.parse_seeds(args.seeds or DISTANCE_SEEDS),
        ckpts=args.ckpt or (),
        lengths=common.parse_int_list(args.lengths, "lengths") if args.lengths else None,
        preset=args.preset,
        width=args.width,
        milestones=common.parse_int_list(args.milestones, "milestones") if args.milestones else None,
        read_all=args.read_all,
        controls=tuple(common.split_list(args.controls, "controls")) if args.controls else (),
        settings=common.parse_assignments(args.assignments),
        **{key: value for key, value in given.items() if value is not None},
    )
    out = Path(args.out or DISTANCE_OUT)
    common.refuse_run_output(out, "--out")
    summary = run_study(spec, runtime, out)
    print(distance_report.markdown(summary), end="")
    print(f"wrote {out / 'results.md'}, results.json, results.png")
    return 0


def run_zoology(args: argparse.Namespace) -> int:
    """``--protocol zoology`` (docs/mqar.md section 10): :func:`~drmlab.experiments.mqar.zoology.run_zoology_study`."""
    from drmlab.experiments.mqar import zoology

    refused = [
        flag
        for dest, flag in FIXED_ONLY.items()
        if dest not in ("n_train", "n_test", "lr_grid") and getattr(args, dest) != args.fixed_only_defaults[dest]
    ]
    refused += [flag for dest, flag in DISTANCE_ONLY.items() if getattr(args, dest) not in (None, False)]
    if args.steps is not None:
        refused.append("--steps (zoology trains --epochs)")
    if refused:
        raise ValueError(f"{', '.join(refused)}: not a setting of --protocol zoology")
    runtime = common.runtime(args, log=common.log_to_stderr)
    seeds = common.parse_seeds(args.seeds) if args.seeds else [zoology.RECIPE.seed]
    if len(seeds) != 1:
        raise ValueError("--protocol zoology runs one seed per (model, width, length, rate): give --seeds S")
    settings = common.parse_assignments(args.assignments)
    if args.fast:
        from drmlab.devices import resolve_device
        from drmlab.training.fast import fast_settings, use_persistent_compile_cache

        fast, note = fast_settings(resolve_device(runtime.device))
        if note is not None:
            runtime.log(note)
        settings = {**fast, **settings}
        use_persistent_compile_cache()
    given = {
        "epochs": args.epochs,
        "early_stop": args.early_stop,
        "probe_epochs": args.probe_epochs,
        "batch_size": args.batch_size,
        "n_train": None if args.n_train == args.fixed_only_defaults["n_train"] else args.n_train,
        "n_test": None if args.n_test == args.fixed_only_defaults["n_test"] else args.n_test,
        "lr_grid": args.lr_grid,
    }
    out = Path(args.out or ZOOLOGY_OUT)
    common.refuse_run_output(out, "--out")
    models = common.split_list(args.models, "models") if args.models else zoology.DEFAULT_MODELS
    widths = common.parse_int_list(args.widths, "widths") if args.widths else zoology.WIDTHS
    seq_lens = common.parse_int_list(args.seq_lens, "seq-lens") if args.seq_lens else None
    given = {key: value for key, value in given.items() if value is not None}
    if args.status:
        from drmlab.experiments.mqar import zoology_status

        if not (out / "runs").is_dir():
            raise ValueError(
                f"{out} holds no Zoology study (no runs/): start one with drmlab mqar --protocol zoology --out {out}"
            )
        study = zoology.plan_study(
            models, widths, seq_lens, preset=args.preset, seed=seeds[0], settings=settings, **given
        )
        print(zoology_status.format_zoology_status(study, out, zoology_status.zoology_status(study, out)))
        return 0
    if args.restore:
        restored = zoology.restore_runs(args.restore, out)
        runtime.log(f"restored {len(restored)} finished runs from {args.restore} into {out / 'runs'}")
    summary = zoology.run_zoology_study(
        models,
        widths,
        seq_lens,
        out=out,
        preset=args.preset,
        seed=seeds[0],
        settings=settings,
        device=runtime.device,
        quiet=runtime.quiet,
        log=runtime.log,
        collect_only=bool(args.collect),
        leave_held=bool(args.leave_held),
        **given,
    )
    if summary is None:  # --leave-held: the rest is another process's
        return 0
    print((out / "zoology.md").read_text(), end="")
    print(f"wrote {out / 'zoology.md'}, zoology.json, results.json")
    return 0
