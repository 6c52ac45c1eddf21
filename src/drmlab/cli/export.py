"""``drmlab export``: a run directory as a Hugging Face model directory (:mod:`drmlab.integrations.hf_export`;
docs/integrations.md section 1.2)."""

from __future__ import annotations

import argparse

from drmlab.cli import common

EPILOG = """\
examples:
  drmlab export --ckpt runs/J-tiny-seed0 --out hf/J-tiny
  python -c "import drmlab.hf, transformers as t; t.AutoModelForCausalLM.from_pretrained('hf/J-tiny')"

The export holds config.json (registry name, preset, vocabulary, seed, overrides: the model is rebuilt by
drmlab's registry), model.safetensors (the checkpoint's weights, tied ones once), the tokenizer files
(bytes: tokenizer.json with id = UTF-8 byte value; gpt2: tokenizer.json and the GPT-2 files) and
drmlab_run.json (the run, step and checkpoint sha256). Loading it needs `import drmlab.hf` first, which
registers the drmlab model types with transformers. See docs/integrations.md.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory (config, safetensors, tokenizer)",
        description="Convert a drmlab run directory into a Hugging Face model directory that "
        "AutoModelForCausalLM.from_pretrained loads (after `import drmlab.hf`), with bit-identical logits.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, metavar="RUN_DIR", help="a run directory written by drmlab train")
    common.add_accept_edited_config_argument(parser)
    common.add_out_argument(parser, "the folder to write (must not exist or be empty)", required=True, metavar="HF_DIR")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier drmlab export in --out")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        from drmlab.integrations.hf_export import export_run
    except ImportError as exc:
        raise ImportError(f"drmlab export needs Hugging Face transformers: pip install 'drmlab[hf]' ({exc})") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one summary line instead of transformers' shard-writing bars

    common.accept_edited_config(args, args.ckpt)
    common.say_recovered_checkpoint(args.ckpt)
    summary = export_run(args.ckpt, args.out, overwrite=args.overwrite)
    print(
        f"{summary['model']} {summary['preset']} (step {summary['step']}) exported as {summary['model_type']} "
        f"to {summary['out']}: {', '.join(summary['files'])}"
    )
    print(summary["tokenizer"])
    return 0
