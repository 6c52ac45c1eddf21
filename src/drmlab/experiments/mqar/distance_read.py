"""Reading the distance MQAR task (docs/mqar.md section 8): scoring a model at one length.

A sequence of at most ``chunk`` input tokens is one parallel forward (:func:`read_scored`). A longer
one runs its first ``chunk`` tokens through ``model(tokens, return_state=True)`` (the prefill of
:mod:`drmlab.generation`) and then steps the rest one token at a time with ``model.step``, carrying
the decoding state and keeping only the logits of the scored positions, so memory does not grow with
L for a model whose state does not. A model with a learned position table, or whose decoding state
grows with every token (a key/value cache), is read only up to its context: longer lengths are
reported "n/a (context N)" (:func:`context_limit`). :func:`read_length` scores ``n_eval`` evaluation
examples of one length, plainly or under a recall control (:mod:`drmlab.experiments.mqar.controls`), with
the task's pair count (``pairs``, default 8).
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from drmlab.experiments.mqar import controls
from drmlab.experiments.mqar.distance_gates import wilson_interval
from drmlab.experiments.mqar.distance_task import (
    PAIRS,
    check_length,
    check_pairs,
    evaluation_tokens,
    scored_positions,
    split_tokens,
)
from drmlab.models.decode_state import (  # noqa: F401 (re-exported: the distance study's own names)
    context_limit,
    decode_state_grows,
    state_nbytes,
)

DEFAULT_EVAL_BATCH = 128
DEFAULT_EVAL_SEED = 0
DEFAULT_CHUNK = 512


@torch.no_grad()
def read_scored(model: nn.Module, inputs: torch.Tensor, positions, chunk: int) -> tuple[torch.Tensor, object]:
    """(logits [B, len(positions), vocab] at the input ``positions``, the decoding state after the last
    input): one forward with ``return_state=True`` when the inputs have at most ``chunk`` tokens;
    otherwise the first ``chunk`` so, then ``model.step`` over the rest."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    positions = [int(p) for p in positions]
    length = inputs.shape[1]
    out = model(inputs[:, :chunk].long(), return_state=True)
    if length <= chunk:
        return out.logits[:, positions], out.state
    kept = {p: out.logits[:, p] for p in positions if p < chunk}
    state, wanted = out.state, set(positions)
    del out
    for t in range(chunk, length):
        logits, state = model.step(inputs[:, t].long(), state)
        if t in wanted:
            kept[t] = logits
    return torch.stack([kept[p] for p in positions], dim=1), state


@torch.no_grad()
def read_length(
    model: nn.Module,
    length: int,
    n_eval: int,
    *,
    eval_seed: int = DEFAULT_EVAL_SEED,
    eval_batch: int = DEFAULT_EVAL_BATCH,
    chunk: int = DEFAULT_CHUNK,
    context: int | None = None,
    control: str | None = None,
    pairs: int = PAIRS,
) -> dict:
    """Score ``n_eval`` evaluation examples of ``length`` with ``pairs`` pairs each (``n_eval`` x
    ``pairs`` targets): correct, total, accuracy, its Wilson 95%
    interval, the same for the first query of each sequence (``first_*``), per-query accuracy, the
    decoding state's bytes per sequence, tokens/s, seconds (and peak CUDA memory). A length whose
    inputs exceed ``context`` is not read: ``status`` "n/a". ``control``: one of the recall controls
    of :mod:`drmlab.experiments.mqar.controls` (section 8.1) read instead of the plain examples; with
    ``keys_shuffled`` also the hits on the values the queried keys are now bound to (``bound_*``) and
    ``binder_level``, the share of targets equal to that bound value (a perfect binder's accuracy)."""
    check_length(length, check_pairs(pairs))
    record = {"length": length, "n_eval": n_eval, "eval_seed": eval_seed}
    if control is not None:
        record["control"] = controls.parse_controls([control])[0]
    if context is not None and length - 1 > context:
        return dict(record, status="n/a", context=context)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    positions = scored_positions(length, pairs)
    by_query = torch.zeros(pairs, dtype=torch.long)
    bound_hits = binder_hits = 0
    state_bytes = 0
    t0 = time.perf_counter()
    try:
        with controls.memory_switched(model, control):
            for start in range(0, n_eval, eval_batch):
                rows = range(start, min(start + eval_batch, n_eval))
                tokens, bound = evaluation_tokens(eval_seed, length, rows, pairs), None
                if control is not None:
                    tokens, bound = controls.control_tokens(control, tokens, eval_seed, rows, pairs)
                inputs, targets = split_tokens(tokens, pairs)
                if control == "pairs_unwritten":
                    logits, state = controls.read_pairs_unwritten(model, inputs.to(device), positions, pairs)
                else:
                    logits, state = read_scored(model, inputs.to(device), positions, chunk)
                pred = logits.argmax(dim=-1).cpu()
                by_query += (pred == targets[:, positions]).sum(0)
                if bound is not None:
                    bound_hits += int((pred == bound).sum())
                    binder_hits += int((bound == targets[:, positions]).sum())
                state_bytes = max(state_bytes, state_nbytes(state) // len(rows))
    finally:
        model.train(was_training)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    correct, total = int(by_query.sum()), n_eval * pairs
    first = int(by_query[0])
    record.update(
        status="read",
        correct=correct,
        total=total,
        acc=correct / total,
        ci95=list(wilson_interval(correct, total)),
        first_correct=first,
        first_total=n_eval,
        first_acc=first / n_eval,
        first_ci95=list(wilson_interval(first, n_eval)),
        by_query=(by_query.double() / n_eval).tolist(),
        state_bytes=state_bytes,
        mode=(
            f"prefill {2 * pairs} + steps"
            if control == "pairs_unwritten"
            else "parallel"
            if length - 1 <= chunk
            else f"prefill {chunk} + steps"
        ),
        chunk=chunk,
        seconds=seconds,
        tokens_per_s=n_eval * (length - 1) / seconds if seconds > 0 else None,
    )
    if control == "keys_shuffled":
        record.update(
            bound_correct=bound_hits,
            bound_acc=bound_hits / total,
            bound_ci95=list(wilson_interval(bound_hits, total)),
            binder_level=binder_hits / total,
        )
    if cuda:
        record["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return record
