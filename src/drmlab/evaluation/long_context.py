"""The long-context evaluation's two reports (``drmlab eval --by-position`` and ``--carry-state``;
docs/guide.md "Long-context evaluation").

* :func:`by_position_report`: windows of ``seq_len`` tokens, each from a fresh state, cut from the stream
  as ``drmlab eval`` cuts them (blindly, across documents); cross-entropy per log-spaced bucket of
  positions with a 95% band over windows (:mod:`drmlab.evaluation.positions`). A model with a learned
  position table reads only its first rows of each window: the positions past it are "n/a".
* :func:`carried_report`: the stream scored with the state carried (:mod:`drmlab.evaluation.carried`),
  reset at each document start unless ``doc_starts`` is None, for a model that carries a fixed-size
  state (:func:`drmlab.models.decode_state.carries_fixed_state`); a model whose state grows with every
  token (attention's key/value cache) is scored in windows of the longest it holds instead, each from a
  fresh state, cut at the same resets, and the report says so (``context: "windows"``, ``note``).
"""

from __future__ import annotations

import math

import numpy as np

from drmlab.evaluation.carried import TargetScores, score_carried, score_windows, segments, split_windows
from drmlab.evaluation.positions import BAND_RULE, BUCKET_RULE, by_position
from drmlab.evaluation.rescoring import as_stream, stream_windows
from drmlab.models.decode_state import carries_fixed_state, position_limit


def model_name(model) -> str:
    return getattr(model, "model_name", None) or type(model).__name__


def limit_reason(model) -> str | None:
    """Why positions past a learned position table are not scored, or None without one."""
    limit = position_limit(model)
    if limit is None:
        return None
    return f"{model_name(model)} has a learned position table of {limit} rows: it cannot read position {limit} or later"


def totals(scores: TargetScores) -> dict:
    """ce (nats per scored target), ppl, targets (scored), total_nats."""
    count, nats = scores.count, scores.total_nats
    ce = nats / count if count else float("nan")
    return {"ce": ce, "ppl": math.exp(min(ce, 700.0)), "targets": count, "total_nats": nats}


def by_position_report(
    model, tokens, seq_len: int, *, n_targets: int, batch_size: int, device=None, progress: bool = False
) -> tuple[dict, TargetScores]:
    """Windows of ``seq_len`` from a fresh state, scored per target; the report and the scores."""
    stream = as_stream(tokens, n_targets)
    windows = stream_windows(n_targets, seq_len)
    limit = position_limit(model)
    visible = limit if limit is not None and limit < seq_len else None
    scores = score_windows(
        model,
        stream,
        windows,
        n_targets=n_targets,
        batch_size=batch_size,
        visible=visible,
        device=device,
        progress=progress,
    )
    reason = limit_reason(model) if visible is not None else None
    report = {
        "mode": "windows",
        "seq_len": seq_len,
        "windows": len(windows),
        "targets_in_windows": n_targets,
        **totals(scores),
        "position_limit": visible,
        "position_limit_reason": reason,
        "bucket_rule": BUCKET_RULE,
        "band": BAND_RULE,
        "buckets": by_position(scores, seq_len, visible, reason),
    }
    return report, scores


def attention_window(model, train_window: int) -> int:
    """The longest window a model without a fixed-size state holds: its position table's rows, else the
    training window (its key/value cache grows with every token past it)."""
    limit = position_limit(model)
    return limit if limit is not None else int(train_window)


def carried_report(
    model,
    tokens,
    *,
    n_targets: int,
    doc_starts=None,
    chunk: int,
    lanes: int,
    window: int,
    max_tokens: int | None = None,
    by_positions: bool = False,
    device=None,
    progress: bool = False,
) -> tuple[dict, TargetScores]:
    """The stream with the state carried (reset at ``doc_starts``; None: never; ``chunk``, ``lanes`` and
    ``max_tokens``: :func:`~drmlab.evaluation.carried.score_carried`'s), or, for a model without a
    fixed-size state, in windows of ``window`` cut at the same resets, ``lanes`` at a time; the report and
    the scores."""
    stream = as_stream(tokens, n_targets)
    spans = segments(n_targets, None if doc_starts is None else np.asarray(doc_starts))
    longest = max(n for _, n in spans)
    resets = "documents" if doc_starts is not None else "none"
    if carries_fixed_state(model):
        scores = score_carried(
            model,
            stream,
            spans,
            n_targets=n_targets,
            chunk=chunk,
            lanes=lanes,
            max_tokens=max_tokens,
            device=device,
            progress=progress,
        )
        budget = max_tokens if max_tokens is not None else lanes * chunk
        context = {"context": "carried", "chunk": chunk, "lanes": lanes, "max_tokens": budget, "note": None}
        reach = longest
    else:
        windows = split_windows(spans, window)  # each at most `window`: whole "documents" of score_carried
        scores = score_carried(
            model,
            stream,
            windows,
            n_targets=n_targets,
            chunk=window,
            lanes=lanes,
            max_tokens=max_tokens,
            device=device,
            progress=progress,
        )
        where = "within each document" if doc_starts is not None else "across the stream"
        note = (
            f"{model_name(model)} has no fixed-size state (its key/value cache grows with every token): scored in "
            f"windows of {window} tokens (the longest it holds), each from a fresh state, {where}"
        )
        context = {"context": "windows", "window": window, "windows": len(windows), "note": note}
        reach = min(window, longest)
    report = {
        **context,
        "resets": resets,
        "segments": len(spans),
        "longest_segment": longest,
        **totals(scores),
    }
    if by_positions:
        report.update(bucket_rule=BUCKET_RULE, band=BAND_RULE, buckets=by_position(scores, reach))
    return report, scores
