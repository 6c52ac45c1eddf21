"""``drmlab specialise``: the memory specialisation recipes (docs/mqar.md section 9): ``distill``, a
trained J_NO_DIRECTION run into ASM_CM, or ``interleaved`` (upstream's PMCS-64), any run as it is;
:func:`drmlab.experiments.specialise.specialise`, printed as a table of the stage evaluations and the
language CE before and after.
"""

from __future__ import annotations

import argparse
import sys

from drmlab.cli import common, machine
from drmlab.cli.common import load_corpus_for, log_to_stderr

# drmlab.experiments.specialise.DEFAULT_CURRICULUM, spelled here so --help needs no torch (a test compares them)
DEFAULT_CURRICULUM = "40:1000,80:500,160:500,320:300,512:200,1024:100,4096:25"
DEFAULT_PAIRS, MAX_PAIRS = 8, 32  # the distance task's PAIRS and MAX_PAIRS (a test compares them)

EPILOG = """\
examples:
  drmlab specialise --base runs/base-jnd --out runs/base-jnd-asm-cm
  drmlab specialise --base runs/base-jnd --out runs/asm-cm-quick --steps-scale 0.25 --eval-tokens 128k
  drmlab mqar --protocol distance --ckpt runs/base-jnd-asm-cm --lengths 40,512,4096   # read it further
  drmlab eval --ckpt runs/base-jnd-asm-cm
  drmlab specialise --recipe interleaved --base runs/vr-s --out runs/vr-s-mqar   # upstream's PMCS-64 recipe
  drmlab specialise --base runs/base-jnd --out runs/asm-cm-p16-fw32 --pairs 16 --fast-weight-dim 32

each step: with probability 0.8 a language batch (one window of 128 tokens of the training split; CE
plus 0.5 T^2 KL(teacher || student) at T = 2), else an MQAR batch at the stage's length (4 examples
below 512, 2 below 1024, then 1; CE on the --pairs queries, 8 by default). AdamW, weight decay 0.01,
the backbone at --backbone-lr and fast_weight_memory.* at --memory-lr, constant, clip 1.0. After each stage every
curriculum length up to it is read; a stage passes at >= 80% on each, and each read records the
decoding state's bytes per sequence (printed under the table).

--pairs P (1-32, the byte vocabulary's 32 key ids; default 8): the MQAR task's pair count
(docs/mqar.md section 8.2); its control is 5 x P tokens. The default curriculum's stages shorter than
that are lifted to it and merged, their steps added (16 pairs: 80:1500,160:500,...; 32 pairs:
160:2000,320:300,...); a --curriculum stage shorter than 5 x P is refused. --fast-weight-dim D: the
width of the new memory (ASM_CM's fast_weight_dim; default the preset's: 8 at micro, 64 at tiny and
small), for a J_NO_DIRECTION base under distill; an ASM_CM base keeps its own. Both are recorded in
specialise.json (settings) and config.json (fast_weight_dim among the overrides); continuing a run
under another value is refused.

--fast: the teacher's and the student's training forwards in bf16 autocast where the device multiplies
bf16 natively, with the selective memory's products in bf16 too (as drmlab train --fast); --bf16 forces
the autocast and leaves the memory's products in float32 (as --fast did before it put them in bf16:
docs/drm.md A.4.7). The losses, the stage reads and the rescoring stay float32, and the fast-weight
memory's state and recurrence stay float32 inside the autocast. No torch.compile here: the curriculum
changes the batch shapes at every stage. Recorded in specialise.json (settings.bf16, settings.bf16_memory_products);
continuing a run with another setting is refused.

--recipe interleaved (upstream's PMCS-64 memory specialisation): the base's own model, every stage's
steps counted as MQAR batches taken in order, one plain language step (4 windows of 256, CE, no teacher)
after every 4th; every parameter at --lr (default 3e-4), weight decay 0.01, constant, clip 1.0 (the
default curriculum then makes 2,625 MQAR batches and 656 language steps). Files in --out: an ordinary run
directory (config.json naming ASM_CM, checkpoint, metrics.jsonl, summary.json) plus specialise.json
(the stage results, the language CE before and after). Started again, a killed run continues from its
last checkpoint; a finished one is refused unless --overwrite.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "specialise",
        help="specialise a J_NO_DIRECTION run into ASM_CM (fast-weight memory) with the distance curriculum",
        description="Copy a J_NO_DIRECTION run into ASM_CM (the new memory at its no-op init), then train it on "
        "the recall-over-distance curriculum mixed with language batches distilled from the frozen "
        "base; report recall per length with Wilson intervals and the language CE before and after.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--base",
        required=True,
        metavar="RUN_DIR",
        help="a J_NO_DIRECTION run directory (or an ASM_CM one, to continue specialising it); any run "
        "under --recipe interleaved",
    )
    common.add_accept_edited_config_argument(parser)
    parser.add_argument(
        "--recipe",
        choices=("distill", "interleaved"),
        default="distill",
        help="distill (default: ASM_CM, coin-mixed language batches distilled from the base, two rates) or "
        "interleaved (upstream's PMCS-64: the base's model, a language step after every 4th MQAR batch, one rate)",
    )
    common.add_out_argument(parser, "the specialised run directory", required=True, metavar="RUN_DIR")
    parser.add_argument(
        "--curriculum",
        default=None,
        metavar="L:STEPS,...",
        help=f"stages of length:optimizer steps (MQAR batches under --recipe interleaved), lengths increasing, "
        f"each >= 5 x --pairs (default {DEFAULT_CURRICULUM}, its stages below 5 x --pairs merged into one at it)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        metavar="P",
        help=f"key-value pairs per MQAR example, 1 to {MAX_PAIRS} (the byte vocabulary's {MAX_PAIRS} key ids; "
        f"default {DEFAULT_PAIRS}): the control is 5 x P tokens (docs/mqar.md section 8.2)",
    )
    parser.add_argument(
        "--fast-weight-dim",
        type=int,
        default=None,
        metavar="D",
        help="width of the student's new fast-weight memory (ASM_CM's fast_weight_dim; default the preset's: "
        "8 at micro, 64 at tiny and small); a J_NO_DIRECTION base under --recipe distill only",
    )
    parser.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every stage's steps by X (rounded, at least 1), e.g. 0.25 for a CPU budget",
    )
    common.add_seed_argument(
        parser,
        "seed of the coin, language windows and MQAR examples (seed, seed+1, seed+2; default: the base run's seed)",
    )
    parser.add_argument(
        "--backbone-lr",
        type=float,
        default=None,
        help="distill: learning rate of every parameter but the memory's (default 1e-5)",
    )
    parser.add_argument(
        "--memory-lr", type=float, default=None, help="distill: learning rate of fast_weight_memory.* (default 1e-4)"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="interleaved: the learning rate of every parameter (default 3e-4)"
    )
    parser.add_argument(
        "--eval-sequences",
        type=int,
        default=None,
        metavar="N",
        help="sequences read per length after each stage (default: 32 batches of the length's MQAR "
        "batch size: 128 below 512, 64 below 1024, then 32)",
    )
    parser.add_argument(
        "--eval-tokens",
        default=None,
        metavar="N",
        help="cap on the validation tokens rescored before and after, or all (default: the base run's)",
    )
    parser.add_argument(
        "--bf16", action="store_true", default=None, help="the training forwards (teacher and student) in bf16 autocast"
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        default=None,
        help="the fast setting here: bf16 autocast where this device multiplies bf16 natively, the selective memory's "
        "products in bf16 too (else float32, said in one line), and the fused kernels; no torch.compile (the "
        "curriculum changes the batch shapes stage by stage)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=100,
        metavar="STEPS",
        help="steps between checkpoints besides each stage's end (default 100; 0: stage ends only)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in --out (config, metrics, checkpoints, summary, specialise.json) and start again",
    )
    common.add_data_arguments(parser, run="the base run's")
    common.add_runtime_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.experiments import specialise as recipe
    from drmlab.training.config import parse_tokens
    from drmlab.training.trainer import NonFiniteLossError, TrainingInterrupted

    common.refuse_run_output(args.out, "--out")
    common.accept_edited_config(args, args.base)
    common.say_recovered_checkpoint(args.base)
    machine.apply_threads(args)
    bf16 = fast_bf16(args)
    memory_products = fast_memory_products(args, bf16)
    pairs = args.pairs
    curriculum = (
        recipe.default_curriculum(pairs) if args.curriculum is None else recipe.parse_curriculum(args.curriculum, pairs)
    )
    stages = recipe.scale_curriculum(curriculum, args.steps_scale, pairs)
    # the rates, the pairs, the memory width and the base run are checked before the corpus is read
    recipe.recipe_settings(
        args.recipe,
        stages,
        0,
        args.lr,
        args.backbone_lr,
        args.memory_lr,
        args.eval_sequences,
        pairs,
        args.fast_weight_dim,
        bf16,
        memory_products,
    )
    base_config = recipe.check_base(args.base, args.recipe)
    recipe.student_overrides(base_config, args.recipe, args.fast_weight_dim)
    base_tokenizer = base_config.get("tokenizer") or "bytes"
    if args.tokenizer is not None and args.tokenizer != base_tokenizer:
        raise ValueError(f"--tokenizer {args.tokenizer}: the base run was trained with the {base_tokenizer} tokenizer")
    if args.eval_tokens is None:
        eval_tokens = (base_config.get("train") or {}).get("eval_tokens")
    elif str(args.eval_tokens).lower() == "all":
        eval_tokens = None
    else:
        eval_tokens = parse_tokens(args.eval_tokens)
    data = args.data if args.data is not None else base_config.get("data_source")
    corpus = load_corpus_for(data, base_tokenizer, args.cache_dir)
    log = None if args.quiet else log_to_stderr
    try:
        result = recipe.specialise(
            args.base,
            args.out,
            corpus,
            curriculum=stages,
            seed=args.seed,
            recipe=args.recipe,
            backbone_lr=args.backbone_lr,
            memory_lr=args.memory_lr,
            lr=args.lr,
            eval_sequences=args.eval_sequences,
            eval_tokens=eval_tokens,
            pairs=pairs,
            fast_weight_dim=args.fast_weight_dim,
            bf16=bf16,
            bf16_memory_products=memory_products,
            device=args.device,
            checkpoint_every=args.checkpoint_every,
            overwrite=args.overwrite,
            log=log,
            data_source=data,
        )
    except NonFiniteLossError as exc:
        print(f"drmlab specialise: error: {exc}", file=sys.stderr)
        return 1
    except TrainingInterrupted as exc:
        print(f"drmlab specialise: {exc}\n  continue with the same command", file=sys.stderr)
        return 128 + exc.signal
    print(format_result(result))
    print(f"results in {args.out}/: specialise.json, summary.json, config.json, metrics.jsonl, checkpoints/")
    return 0


def fast_memory_products(args: argparse.Namespace, bf16: bool) -> bool:
    """Whether the selective memory's products join the bf16 autocast: under --fast wherever it chose bf16
    (as ``drmlab train --fast``, docs/drm.md A.4.7); --bf16 alone keeps them in float32."""
    return bool(bf16 and args.fast)


def fast_bf16(args: argparse.Namespace) -> bool:
    """Whether the training forwards run in bf16: --bf16, or --fast where the device multiplies bf16 natively
    (:func:`drmlab.training.fast.bf16_unavailable`; elsewhere one line says it specialises in float32)."""
    if args.bf16 or not args.fast:
        return bool(args.bf16)
    from drmlab.devices import resolve_device
    from drmlab.training.fast import bf16_unavailable

    why = bf16_unavailable(resolve_device(args.device))
    if why is not None:
        print(f"drmlab: --fast: {why}: specialising in float32 with the fused kernels", file=sys.stderr)
    return why is None


def format_result(result: dict) -> str:
    """The stage evaluations as a table (accuracy [Wilson 95%] per length), the decoding state's bytes
    per sequence at each length read and the verdicts."""
    stages = result["stages"]
    settings = (result.get("spec") or {}).get("settings") or {}
    lengths = sorted({int(L) for st in stages for L in st["lengths"]})
    lines = [
        "| after stage | steps | " + " | ".join(f"L = {L}" for L in lengths) + " | pass |",
        "|---:|---:|" + "---|" * len(lengths) + "---|",
    ]
    for st in stages:
        cells = []
        for L in lengths:
            r = st["lengths"].get(str(L))
            cells.append(
                "" if r is None else f"{100 * r['acc']:.1f}% [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]"
            )
        lines.append(
            f"| {st['length']} | {st['first_step']}-{st['last_step']} | "
            + " | ".join(cells)
            + f" | {'yes' if st['pass'] else 'no'} |"
        )
    state = {int(L): r["state_bytes"] for st in stages for L, r in st["lengths"].items() if "state_bytes" in r}
    if state:
        width = settings.get("fast_weight_dim")
        lines.append(
            f"task: {settings.get('pairs', DEFAULT_PAIRS)} pairs; decoding state per sequence"
            + (f" (fast_weight_dim {width})" if width else "")
            + ": "
            + ", ".join(f"L = {L}: {state[L]:,} B" for L in sorted(state))
        )
    language = result["language"]
    lines.append(
        f"language CE (validation, {result['after']['targets']:,} tokens): before {language['before']:.4f}, "
        f"after {language['after']:.4f}, regression {language['regression']:+.4f} "
        f"(limit {language['limit']}: {'pass' if language['pass'] else 'fail'})"
    )
    verdict = "PASS" if result["passed"] else "FAIL: " + "; ".join(result["reasons"])
    lines.append(f"specialisation: {verdict}")
    return "\n".join(lines)
