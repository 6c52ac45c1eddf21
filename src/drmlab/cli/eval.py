"""``drmlab eval``: rescore a run's checkpoint on the validation stream and write ``DIR/eval.json``.

The model is rebuilt from the run's ``config.json`` (name, preset, overrides, vocabulary) and its
weights loaded from ``model.safetensors``. By default the data, tokenizer, window length, batch
size and token cap are the run's own, so the numbers equal the ``val_*`` entries of its
``summary.json`` (same device); flags change them. ``--by-position`` and ``--carry-state`` are the
long-context evaluation (:mod:`drmlab.cli.eval_context`), written to files of their own beside
eval.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from drmlab.cli import common, machine
from drmlab.cli.common import load_corpus_for

EPILOG = """\
examples:
  drmlab eval --ckpt runs/J-tiny-seed0                 # the run's own validation stream
  drmlab eval --ckpt runs/J-tiny-seed0 --data ~/text/ --eval-tokens all
  drmlab eval --ckpt runs/J-tiny-seed0 --by-position --seq-len 4096   # loss by position, 16x its window
  drmlab eval --ckpt runs/J-tiny-seed0 --carry-state   # each document read whole, the state carried

reported: CE in nats per token (token-weighted mean over every scored target), bits per byte of
the scored text (total nats / (ln 2 x bytes): comparable across tokenizers) and perplexity
(exp CE, per token). Windows are non-overlapping, each starts from a fresh state; fp32, eval mode.

long context (docs/guide.md, "Long-context evaluation"):
  --by-position   windows of --seq-len (default 16x the run's window), each from a fresh state; CE per
                  bucket of positions [0,1), [1,2), [2,4), [4,8), ... with a 95% band over windows;
                  positions past a learned position table (GPT2, LOOPED) are "n/a" with the reason.
                  Written to eval-by-position.json and .png beside eval.json.
  --carry-state   the stream as one sequence per document: the state is carried from token to token
                  (a parallel forward over the first --seq-len tokens, by default the whole document
                  where a quarter of the free memory holds it, then model.step) and reset at each
                  document start (at its leading blank line; --no-reset carries it through the stream). A model whose state grows with every token (attention:
                  GPT2, LLAMA, LOOPED, RESOLVENT*) is scored in windows of the longest it holds
                  instead, said in one line. Written to eval-carried.json (with --by-position:
                  eval-carried-by-position.json, positions counted from each document's start).
  A --seq-len the machine's memory cannot hold is refused in one line naming the largest that fits.
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
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="window length (default: the run's seq_len; with --by-position 16x it; with --carry-state the "
        "tokens of each document's first parallel forward, the rest stepped (default: the longest document, "
        "within a quarter of the free memory), or an attention model's longest window)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="windows per forward (default: the run's eval_batch_size; with --carry-state, documents side by "
        "side: 32); lowered to what memory holds",
    )
    parser.add_argument(
        "--eval-tokens",
        default=None,
        metavar="N",
        help="score only the first N targets; 'all' for the whole stream (default: the run's cap)",
    )
    parser.add_argument(
        "--by-position",
        action="store_true",
        help="CE per log-spaced bucket of positions with a 95%% band (eval-by-position.json and .png)",
    )
    parser.add_argument(
        "--carry-state",
        action="store_true",
        help="score each document whole, the state carried token to token (eval-carried.json)",
    )
    parser.add_argument(
        "--no-reset",
        action="store_true",
        help="with --carry-state: carry the state across document boundaries too (one sequence, one lane: slow)",
    )
    common.add_runtime_arguments(parser, quiet=False)
    parser.add_argument(
        "--output", default=None, metavar="FILE", help="where to write the JSON (default DIR/eval.json)"
    )
    common.add_quiet_argument(parser, "no progress bar")
    parser.set_defaults(func=run)
    return parser


def output_name(args: argparse.Namespace) -> str:
    """eval.json, eval-carried.json, eval-by-position.json or eval-carried-by-position.json."""
    carried = "-carried" if args.carry_state else ""
    by_position = "-by-position" if args.by_position else ""
    return f"eval{carried}{by_position}.json"


def run(args: argparse.Namespace) -> int:
    from drmlab.evaluation import byte_counter, rescore
    from drmlab.models import count_parameters
    from drmlab.runs import RunDir, write_json_atomic
    from drmlab.training.config import parse_tokens

    if args.no_reset and not args.carry_state:
        raise ValueError("--no-reset goes with --carry-state (it carries the state across documents)")
    if args.seq_len is not None and args.seq_len < 1:
        raise ValueError(f"--seq-len must be a positive number of tokens, got {args.seq_len}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    run = RunDir(args.ckpt)
    default_output = run.path / output_name(args)
    common.refuse_run_output(args.output, "--output", default_output, allow=[default_output])
    machine.apply_threads(args)
    common.accept_edited_config(args, args.ckpt)
    common.say_recovered_checkpoint(args.ckpt)
    model, config, state = run.load_model(args.device)
    train_cfg = config["train"]
    data = args.data if args.data is not None else config.get("data_source")
    tokenizer = args.tokenizer or config.get("tokenizer") or "bytes"
    if tokenizer != config.get("tokenizer", tokenizer):
        raise ValueError(f"the run was trained with the {config.get('tokenizer')} tokenizer, not {tokenizer}")
    resets = args.carry_state and not args.no_reset
    corpus = load_corpus_for(data, tokenizer, args.cache_dir, need_doc_starts=resets)
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
    meta = corpus.meta if isinstance(corpus.meta, dict) else {}
    total_bytes = meta.get("val_bytes" if args.split == "val" else "train_bytes")
    count_bytes = byte_counter(stream, corpus.tokenizer, total_bytes)
    saved_meta = config.get("data") or {}
    saved_hash, hash_now = saved_meta.get("content_sha256"), meta.get("content_sha256")
    same_data = None if saved_hash is None or hash_now is None else saved_hash == hash_now
    header = {
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
    }
    output = Path(args.output) if args.output else default_output
    name = f"{config['model']} {config['preset']} seed {train_cfg['seed']} (step {header['step']}), {args.split} split"
    if args.carry_state or args.by_position:
        from drmlab.cli import eval_context

        starts = (corpus.doc_starts or {}).get(args.split) if resets else None
        eval_context.run(args, model, train_cfg, stream, cap, count_bytes, starts, header, meta, output, name)
    else:
        seq_len = args.seq_len or int(train_cfg["seq_len"])
        batch = args.batch_size or int(train_cfg.get("eval_batch_size", 8))
        longest = min(seq_len, len(stream) - 1 if cap is None else min(len(stream) - 1, int(cap)))
        if longest > int(train_cfg["seq_len"]):  # the run's own window fits: it trained at it
            from drmlab.cli.eval_context import fitting_batch

            batch = fitting_batch(model, longest, batch, args.device)
        t0 = time.perf_counter()
        result = rescore(
            model,
            stream,
            seq_len,
            batch_size=batch,
            max_targets=cap,
            count_bytes=count_bytes,
            progress=not args.quiet and sys.stderr.isatty(),
        )
        report = {**result, **header, "seconds": time.perf_counter() - t0, "data": meta}
        write_json_atomic(output, report)
        print(
            f"{name}: CE {result['ce']:.4f} nats/token, {result['bpb']:.4f} bits/byte, perplexity "
            f"{result['ppl']:.3f} over {result['targets']:,} tokens ({result['windows']:,} windows of {seq_len})"
        )
    if same_data is False:
        print("note: this data differs from the run's training corpus", file=sys.stderr)
    print(f"written to {output}")
    return 0
