"""``drmlab eval --by-position`` / ``--carry-state``: the long-context evaluation of a run's checkpoint
(:mod:`drmlab.evaluation.long_context`), its window and batch checked against the machine's memory first,
written as ``eval-by-position.json`` (+ ``.png``), ``eval-carried.json`` or ``eval-carried-by-position.json``
(+ ``.png``) beside eval.json, with a few lines on stdout.

The memory check (:mod:`drmlab.evaluation.memory`: a measured forward at three short lengths, extrapolated)
lowers the batch to what fits; a window that does not fit even alone is refused in one line naming the
largest that does. An out-of-memory error that gets past the estimate is one line too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_CHUNK = 2048  # tokens of a document's first parallel forward with --carry-state, where memory is unknown
AUTO_MEMORY_SHARE = 4  # without --seq-len, --carry-state's parallel forwards take at most 1/4 of the memory free
DEFAULT_LANES = 32  # documents stepped side by side with --carry-state
BY_POSITION_FACTOR = 16  # --by-position's default window: this many training windows
GIB = 2**30


def memory_budget(model, device: str | None):
    """(the fitted :class:`~drmlab.evaluation.memory.MemoryModel` or None, the bytes available or None)."""
    from drmlab.cli.machine import available_memory_bytes
    from drmlab.evaluation.memory import fit_memory
    from drmlab.models.decode_state import position_limit

    free = available_memory_bytes(device)
    if free is None:
        return None, None
    return fit_memory(model, next(iter(model.parameters())).device, position_limit(model)), free


def fitting_batch(model, length: int, batch: int, device: str | None, budget=None) -> int:
    """The largest batch, at most ``batch``, whose windows of ``length`` tokens fit the memory available
    (``budget``: :func:`memory_budget`'s answer, measured here when None); a window that does not fit
    alone is refused (ValueError, one line naming the largest --seq-len that fits)."""
    memory, free = budget if budget is not None else memory_budget(model, device)
    if free is None or memory is None:
        return batch
    fits = memory.largest_batch(length, free, batch)
    if fits >= 1:
        return fits
    name = getattr(model, "model_name", type(model).__name__)
    raise ValueError(
        f"--seq-len {length:,} does not fit in memory: one window of it needs about "
        f"{memory.bytes(1, length) / GIB:,.1f} GiB for {name} ({memory.describe()}) and "
        f"{free / GIB:,.1f} GiB is available; the largest --seq-len that fits is {memory.largest_length(1, free):,}"
    )


def _out_of_memory(exc: RuntimeError) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def _print_buckets(report: dict) -> None:
    print("  positions        tokens        CE   95% band")
    for row in report["buckets"]:
        span = f"[{row['lo']:,}, {row['hi']:,})"
        if row["ce"] == "n/a":
            print(f"  {span:<16} {'':>6}       n/a")
        elif row["ce"] is None:
            print(f"  {span:<16} {0:>6}         -")
        else:
            band = "" if row["low"] is None else f"[{row['low']:.4f}, {row['high']:.4f}]"
            print(f"  {span:<16} {row['tokens']:>6,}  {row['ce']:8.4f}   {band}")
    reasons = {row.get("reason") for row in report["buckets"] if row["ce"] == "n/a"}
    for reason in sorted(r for r in reasons if r):
        print(f"  n/a: {reason}")


def _settings(args, model, train_window: int, eval_batch: int, n_targets: int, longest: int) -> dict:
    """The window and batch of this evaluation, checked against the memory available (for the longest
    window the stream holds: a --seq-len past the stream, or past the longest document, costs no more)."""
    from drmlab.evaluation.long_context import attention_window
    from drmlab.models.decode_state import carries_fixed_state, position_limit

    budget = memory_budget(model, args.device)
    limit = position_limit(model)
    if not args.carry_state:
        length = args.seq_len or BY_POSITION_FACTOR * train_window
        fed = min(length, n_targets, limit or length)
        return {"seq_len": length, "batch": fitting_batch(model, fed, args.batch_size or eval_batch, None, budget)}
    if carries_fixed_state(model):
        lanes = args.batch_size or DEFAULT_LANES
        memory, free = budget
        if args.seq_len is not None or memory is None:
            chunk = min(args.seq_len or DEFAULT_CHUNK, longest)
            lanes = fitting_batch(model, chunk, lanes, None, budget)
            return {"chunk": chunk, "lanes": lanes, "max_tokens": lanes * chunk, "window": chunk}
        # speed settings: documents whole, padded side by side, in forwards that take a share of the memory
        tokens = max(1, memory.largest_length(1, free // AUTO_MEMORY_SHARE))
        return {"chunk": min(longest, tokens), "lanes": lanes, "max_tokens": tokens, "window": min(longest, tokens)}
    window = args.seq_len or attention_window(model, train_window)
    if limit is not None and window > limit:
        raise ValueError(
            f"--seq-len {window} exceeds {getattr(model, 'model_name', 'the model')}'s learned position table "
            f"({limit} rows): with --carry-state it is scored in windows of at most {limit}"
        )
    batch = fitting_batch(model, min(window, n_targets), args.batch_size or eval_batch, None, budget)
    return {"chunk": window, "lanes": batch, "window": window}


def run(
    args: argparse.Namespace,
    model,
    train_cfg: dict,
    stream,
    cap: int | None,
    count_bytes,
    doc_starts,
    header: dict,
    meta: dict,
    output: Path,
    name: str,
) -> None:
    """Score, write ``output`` (and its figure with --by-position), print the numbers."""
    import math

    from drmlab.evaluation.carried import segments
    from drmlab.evaluation.long_context import by_position_report, carried_report
    from drmlab.runs import write_json_atomic

    n_targets = len(stream) - 1 if cap is None else min(len(stream) - 1, int(cap))
    if n_targets <= 0:
        raise ValueError(f"nothing to score: the stream has {len(stream)} tokens")
    train_window = int(train_cfg["seq_len"])
    longest = max(n for _, n in segments(n_targets, doc_starts if args.carry_state else None))
    settings = _settings(args, model, train_window, int(train_cfg.get("eval_batch_size", 8)), n_targets, longest)
    progress = not args.quiet and sys.stderr.isatty()
    resets = args.carry_state and not args.no_reset
    if resets and doc_starts is None:
        print("note: this corpus records no document starts: the state is carried across documents", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        if args.carry_state:
            report, scores = carried_report(
                model,
                stream,
                n_targets=n_targets,
                doc_starts=doc_starts,
                chunk=settings["chunk"],
                lanes=settings["lanes"],
                max_tokens=settings.get("max_tokens"),
                window=settings["window"],
                by_positions=args.by_position,
                progress=progress,
            )
        else:
            report, scores = by_position_report(
                model, stream, settings["seq_len"], n_targets=n_targets, batch_size=settings["batch"], progress=progress
            )
            report["batch_size"] = settings["batch"]
    except RuntimeError as exc:
        if not _out_of_memory(exc):
            raise
        raise ValueError(
            f"out of memory while scoring ({str(exc).splitlines()[0][:160]}); lower --seq-len or --batch-size"
        ) from None
    seconds = time.perf_counter() - t0
    if scores.count == n_targets:
        n_bytes = int(count_bytes(n_targets)) if count_bytes is not None else n_targets
        report["bpb"], report["bytes"] = report["total_nats"] / (math.log(2) * n_bytes), n_bytes
    report = {**report, "train_seq_len": train_window, **header, "seconds": seconds, "data": meta}
    write_json_atomic(output, report)
    bpb = f", {report['bpb']:.4f} bits/byte" if "bpb" in report else ""
    if args.carry_state:
        how = (
            f"{report['segments']:,} {'documents' if report['resets'] == 'documents' else 'sequence'}, state carried"
            if report["context"] == "carried"
            else f"{report['windows']:,} windows of {report['window']}"
        )
        if report.get("note"):
            print(report["note"])
    else:
        limit = report["position_limit"]
        seen = f", only the first {limit} positions of each read" if limit is not None else ""
        how = f"{report['windows']:,} windows of {report['seq_len']:,}{seen}"
    print(
        f"{name}: CE {report['ce']:.4f} nats/token{bpb}, perplexity {report['ppl']:.3f} over "
        f"{report['targets']:,} tokens ({how}; {seconds:.1f} s)"
    )
    if args.by_position:
        _print_buckets(report)
        _draw(report, output.with_suffix(".png"), name)


def _draw(report: dict, path: Path, name: str) -> None:
    from drmlab.cli.common import log_to_stderr
    from drmlab.experiments.plotting import draw_or_log
    from drmlab.experiments.position_figure import draw_by_position

    if draw_or_log(lambda: draw_by_position(report, path, f"{name}: loss by position"), log_to_stderr, path.name):
        print(f"figure: {path}")
