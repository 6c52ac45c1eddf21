"""``drmlab lm-eval``: lm-evaluation-harness tasks on a run directory or an export
(:func:`drmlab.integrations.lm_eval_adapter.evaluate`, the harness model ``drmlab``; docs/integrations.md
section 2)."""

from __future__ import annotations

import argparse
import json
import sys

from drmlab.cli import common, machine

EPILOG = """\
examples:
  drmlab lm-eval --ckpt runs/J-tiny-seed0 --tasks lambada_openai,wikitext --limit 200
  drmlab lm-eval --ckpt hf/J-tiny --tasks my_task --include-path my_tasks/ --output results.json

Each request is scored alone by the drmlab model: families without a position table (DRM, MAMBA,
RESOLVENT, LOOPED without learned positions) carry their state over the whole text, never a truncated
window; GPT2 and LOOPED with learned positions see at most their table's length. Rolling log-likelihoods
(perplexity tasks) follow the prefix "\\n\\n" (drmlab's document separator; --prefix changes it).
Tasks whose data is on the Hugging Face Hub need the network once (then the cache). The harness's own
command line works too: python -m drmlab.integrations.lm_eval_adapter --model drmlab --model_args
pretrained=DIR --tasks ... (its `lm_eval` command alone cannot see the model: the harness reads no
plugins). See docs/integrations.md.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lm-eval",
        help="run lm-evaluation-harness tasks on a run directory or a Hugging Face export",
        description="Evaluate a drmlab checkpoint (run directory or export) on lm-evaluation-harness tasks "
        "through the harness model 'drmlab'; prints the harness's table.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, metavar="DIR", help="a run directory or a drmlab export")
    parser.add_argument("--tasks", required=True, help="comma-separated harness task names")
    parser.add_argument(
        "--include-path", action="append", default=None, metavar="DIR", help="a folder of task YAML files (repeatable)"
    )
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's)")
    parser.add_argument(
        "--limit", type=float, default=None, help="documents per task (a fraction below 1 is a share of them)"
    )
    parser.add_argument(
        "--prefix", default="\n\n", help="what the first token of a scored text follows (default \\n\\n)"
    )
    parser.add_argument(
        "--max-parallel",
        type=int,
        default=2048,
        help="tokens of one parallel forward; the rest of a longer text is stepped (default 2048)",
    )
    common.add_seed_argument(parser, "seed of sampling and few-shot choice (default 1234)", default=1234)
    common.add_runtime_arguments(parser, device_default="cpu", device_help="cpu (default), cuda, auto", quiet=False)
    parser.add_argument("--output", default=None, metavar="FILE", help="also write the results as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    tasks = common.split_list(args.tasks, "tasks")
    common.refuse_run_output(args.output, "--output")
    try:
        from lm_eval.utils import make_table

        from drmlab.integrations.lm_eval_adapter import evaluate
    except ImportError as exc:
        raise ImportError(f"drmlab lm-eval needs lm-evaluation-harness: pip install 'drmlab[eval]' ({exc})") from None
    machine.apply_threads(args)
    try:  # loading an export: no transformers progress bars between the harness's lines
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    from drmlab.devices import resolve_device

    device = str(resolve_device(args.device))  # an unavailable --device is refused here, in one line
    common.say_recovered_checkpoint(args.ckpt)
    results = evaluate(
        args.ckpt,
        tasks,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        device=device,
        seed=args.seed,
        model_args={"prefix": args.prefix, "max_parallel": args.max_parallel},
    )
    print(make_table(results))
    if args.output:
        from drmlab.runs import write_json_atomic

        write_json_atomic(
            args.output,
            json.loads(
                json.dumps(
                    {k: results[k] for k in ("results", "configs", "versions", "n-shot", "config") if k in results},
                    default=str,
                )
            ),
        )
        print(f"written to {args.output}", file=sys.stderr)
    return 0
