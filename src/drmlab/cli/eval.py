"""``drmlab eval``: rescore a run's checkpoint on the validation stream and write ``DIR/eval.json``.

The model is rebuilt from the run's ``config.json`` (name, preset, overrides, vocabulary) and its
weights loaded from ``model.safetensors``. By default the data, tokenizer, window length, batch
size and token cap are the run's own, so the numbers equal the ``val_*`` entries of its
``summary.json`` (same device); flags change them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from drmlab.cli import common
from drmlab.cli.common import load_corpus_for

EPILOG = """\
examples:
  drmlab eval --ckpt runs/J-tiny-seed0                 # the run's own validation stream
  drmlab eval --ckpt runs/J-tiny-seed0 --data ~/text/ --eval-tokens all

reported: CE in nats per token (token-weighted mean over every scored target), bits per byte of
the scored text (total nats / (ln 2 x bytes): comparable across tokenizers) and perplexity
(exp CE, per token). Windows are non-overlapping, each starts from a fresh state; fp32, eval mode.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "eval",
        help="rescore a trained checkpoint on the whole validation stream (CE, bits/byte, perplexity)",
        description="Deterministically rescore a run's checkpoint over the continuous validation stream "
        "in non-overlapping windows, print the numbers and write them to DIR/eval.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, metavar="DIR", help="a run directory written by drmlab train")
    common.add_accept_edited_config_argument(parser)
    common.add_data_arguments(parser, run="the run's")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="which split to score (default val)")
    parser.add_argument("--seq-len", type=int, default=None, help="window length (default: the run's seq_len)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="windows per forward (default: the run's eval_batch_size)"
    )
    parser.add_argument(
        "--eval-tokens",
        default=None,
        metavar="N",
        help="score only the first N targets; 'all' for the whole stream (default: the run's cap)",
    )
    common.add_runtime_arguments(parser, quiet=False)
    parser.add_argument(
        "--output", default=None, metavar="FILE", help="where to write the JSON (default DIR/eval.json)"
    )
    common.add_quiet_argument(parser, "no progress bar")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from drmlab.evaluation import byte_counter, rescore
    from drmlab.models import count_parameters
    from drmlab.runs import RunDir, write_json_atomic
    from drmlab.training.config import parse_tokens

    run = RunDir(args.ckpt)
    common.refuse_run_output(args.output, "--output", run.eval_path, allow=[run.eval_path])
    common.apply_threads(args)
    common.accept_edited_config(args, args.ckpt)
    common.say_recovered_checkpoint(args.ckpt)
    model, config, state = run.load_model(args.device)
    train_cfg = config["train"]
    data = args.data if args.data is not None else config.get("data_source")
    tokenizer = args.tokenizer or config.get("tokenizer") or "bytes"
    if tokenizer != config.get("tokenizer", tokenizer):
        raise ValueError(f"the run was trained with the {config.get('tokenizer')} tokenizer, not {tokenizer}")
    corpus = load_corpus_for(data, tokenizer, args.cache_dir)
    if corpus.vocab_size != config.get("vocab_size", corpus.vocab_size):
        raise ValueError(
            f"the corpus vocabulary ({corpus.vocab_size}) differs from the run's ({config.get('vocab_size')})"
        )
    stream = corpus.val if args.split == "val" else corpus.train
    if args.eval_tokens is None:
        cap = train_cfg.get("eval_tokens")
    elif str(args.eval_tokens).lower() == "all":
        cap = None
    else:
        cap = parse_tokens(args.eval_tokens)
    seq_len = args.seq_len or int(train_cfg["seq_len"])
    batch = args.batch_size or int(train_cfg.get("eval_batch_size", 8))
    meta = corpus.meta if isinstance(corpus.meta, dict) else {}
    total_bytes = meta.get("val_bytes" if args.split == "val" else "train_bytes")
    t0 = time.perf_counter()
    result = rescore(
        model,
        stream,
        seq_len,
        batch_size=batch,
        max_targets=cap,
        count_bytes=byte_counter(stream, corpus.tokenizer, total_bytes),
        progress=not args.quiet and sys.stderr.isatty(),
    )
    seconds = time.perf_counter() - t0
    saved_meta = config.get("data") or {}
    saved_hash, hash_now = saved_meta.get("content_sha256"), meta.get("content_sha256")
    same_data = None if saved_hash is None or hash_now is None else saved_hash == hash_now
    report = {
        **result,
        "split": args.split,
        "model": config["model"],
        "preset": config["preset"],
        "seed": train_cfg["seed"],
        "step": int(state["step"]),
        "tokens_trained": int(state.get("tokens", 0)),
        "params": count_parameters(model),
        "data_source": data,
        "tokenizer": corpus.tokenizer.name,
        "data_matches_run": same_data,
        "seconds": seconds,
        "data": meta,
    }
    output = Path(args.output) if args.output else run.eval_path
    write_json_atomic(output, report)
    print(
        f"{config['model']} {config['preset']} seed {train_cfg['seed']} (step {report['step']}), {args.split} split: "
        f"CE {result['ce']:.4f} nats/token, {result['bpb']:.4f} bits/byte, perplexity {result['ppl']:.3f} "
        f"over {result['targets']:,} tokens ({result['windows']:,} windows of {seq_len})"
    )
    if same_data is False:
        print("note: this data differs from the run's training corpus", file=sys.stderr)
    print(f"written to {output}")
    return 0
