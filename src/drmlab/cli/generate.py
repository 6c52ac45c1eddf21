"""``drmlab generate``: continue a prompt with a trained checkpoint, streaming the text."""

from __future__ import annotations

import argparse
import sys

from drmlab.cli import common, machine

EPILOG = """\
examples:
  drmlab generate --ckpt runs/J-tiny-seed0 --prompt "def main(" --max-tokens 300
  drmlab generate --ckpt runs/J-tiny-seed0 --prompt "import " --temperature 0.7 --top-k 40 --seed 3

The prompt runs through the model's parallel forward (prefill); the continuation is decoded one
token at a time, by a DRM model's fused C step where it applies (equal to the exact step to round-off,
docs/drm.md section A.4.5), else by the model's exact step. The same seed gives the same text.
--no-fused-step decodes by the exact step always; --fused-step insists on the fused one (an error where
it cannot apply, with the reason).
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate",
        help="sample a continuation of a prompt from a trained checkpoint",
        description="Load a run directory written by `drmlab train`, encode the prompt with the run's "
        "tokenizer and sample a continuation, printing it as tokens arrive.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, metavar="DIR", help="a run directory written by drmlab train")
    common.add_accept_edited_config_argument(parser)
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-tokens", type=int, default=200, help="tokens to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the smallest set with mass p")
    common.add_seed_argument(parser, "sampling seed (default 0)", default=0)
    common.add_runtime_arguments(parser, device_default="cpu", device_help="cpu (default), cuda, auto", quiet=False)
    parser.add_argument(
        "--fused-step",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DRM models: decode by the fused C step (equal to the exact step to round-off, not bit for bit). "
        "Default: where it applies; --fused-step: an error where it cannot, with the reason; --no-fused-step: "
        "the exact step always",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.data import get_tokenizer
    from drmlab.generation import generate
    from drmlab.generation.sampling import check_sampling
    from drmlab.runs import load_run_model

    check_sampling(args.temperature, args.top_k, args.top_p, flags=True)  # before the model is loaded
    if args.max_tokens < 0:
        raise ValueError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    machine.apply_threads(args)
    common.accept_edited_config(args, args.ckpt)
    common.say_recovered_checkpoint(args.ckpt)
    model, config, _ = load_run_model(args.ckpt, device=args.device)
    tokenizer = get_tokenizer(config.get("tokenizer") or "bytes")
    if args.fused_step:
        why = model.fused_step_unsupported() if hasattr(model, "fused_step_unsupported") else "not a DRM model"
        if why is not None:
            raise ValueError(f"--fused-step: {why}; decode without --fused-step")
    sys.stdout.write(args.prompt)
    sys.stdout.flush()

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = generate(
        model,
        tokenizer,
        args.prompt,
        max_new_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        on_text=show,
        fused_step=args.fused_step,
    )
    print(
        f"\n\n[{len(result.new_tokens)} tokens at {result.tokens_per_s:,.1f} tok/s; "
        f"prompt of {len(result.prompt_tokens)} tokens prefilled in {result.prefill_s:.3f} s]",
        file=sys.stderr,
    )
    return 0
