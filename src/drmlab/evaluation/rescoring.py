"""Deterministic rescoring of a model over a whole token stream.

The stream is cut into non-overlapping windows of ``seq_len`` targets starting at offsets 0,
seq_len, 2 seq_len, ...: window ``i`` feeds ``tokens[s : s + L]`` (a fresh model state, no
carried context) and scores ``tokens[s + 1 : s + L + 1]``. The targets are the first
``min(len - 1, max_targets)`` tokens after the first, so each is scored exactly once; the last
window may be shorter. Windows are batched ``batch_size`` at a time (the short one alone), in
eval mode, fp32 (a float64 model: float64), ``step=None``; the negative log-likelihoods are summed in
float64.

Reported: ``ce`` (nats per token, token-weighted), ``bpb`` (bits per byte of the scored text:
total nats / (ln 2 * bytes), comparable across tokenizers; for the bytes tokenizer CE / ln 2)
and ``ppl`` (exp(ce), per token). The same checkpoint gives the same numbers on every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F


def stream_windows(n_targets: int, seq_len: int) -> list[tuple[int, int]]:
    """``(start, length)`` of the non-overlapping windows of ``seq_len`` targets over ``n_targets``."""
    return [(s, min(seq_len, n_targets - s)) for s in range(0, n_targets, seq_len)]


def as_stream(tokens: np.ndarray | torch.Tensor, n_targets: int) -> torch.Tensor:
    """The first ``n_targets + 1`` tokens as a CPU int64 tensor (a memmap is copied once)."""
    if isinstance(tokens, torch.Tensor):
        return tokens[: n_targets + 1].long().cpu()
    return torch.from_numpy(np.array(tokens[: max(n_targets + 1, 0)], dtype=np.int64))


def window_logits(model, stream: torch.Tensor, windows, batch_size: int, device):
    """Yield ``(starts [b], rows [b, length + 1], logits [b, length, vocab])`` over ``windows`` (``(start,
    length)`` pairs: inputs ``stream[start : start + length]``, targets one further): windows of one
    length together, longest first, ``batch_size`` at a time, each from a fresh state (``step=None``,
    autocast off; float32 logits, float64 for a float64 model). The caller sets eval mode and no_grad."""
    groups: dict[int, list[int]] = {}
    for start, length in windows:
        groups.setdefault(int(length), []).append(int(start))
    for length in sorted(groups, reverse=True):
        starts = groups[length]
        for i in range(0, len(starts), batch_size):
            chunk = torch.tensor(starts[i : i + batch_size])
            index = chunk[:, None] + torch.arange(length + 1)[None, :]
            rows = stream[index].to(device)
            with torch.autocast(device_type=torch.device(device).type, enabled=False):
                logits = model(rows[:, :-1], step=None).logits
            yield chunk, rows, logits if logits.dtype == torch.float64 else logits.float()


@torch.no_grad()
def rescore(
    model: torch.nn.Module,
    tokens: np.ndarray | torch.Tensor,
    seq_len: int,
    *,
    batch_size: int = 8,
    max_targets: int | None = None,
    count_bytes: Callable[[int], int] | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict:
    """Score ``tokens`` with ``model``; return ce, bpb, ppl, targets, bytes, windows, seq_len.

    ``count_bytes(n)`` gives the UTF-8 bytes of the scored text ``tokens[1 : n + 1]``; the default
    (None) counts one byte per token, right for the bytes tokenizer.
    """
    if seq_len <= 0 or batch_size <= 0:
        raise ValueError("seq_len and batch_size must be positive")
    if device is None:
        device = next(iter(model.parameters())).device
    n_targets = len(tokens) - 1
    if max_targets is not None:
        n_targets = min(n_targets, int(max_targets))
    stream = as_stream(tokens, n_targets)
    if n_targets <= 0:
        raise ValueError(f"nothing to score: the stream has {len(stream)} tokens")
    windows = stream_windows(n_targets, seq_len)
    was_training = model.training
    model.eval()
    total = 0.0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_targets, unit="tok", desc="rescoring", leave=False)
    try:
        for _, rows, logits in window_logits(model, stream, windows, batch_size, device):
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum")
            total += float(nll.double())
            if bar is not None:
                bar.update(rows[:, 1:].numel())
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    n_bytes = int(count_bytes(n_targets)) if count_bytes is not None else n_targets
    ce = total / n_targets
    return {
        "ce": ce,
        "bpb": total / (math.log(2) * n_bytes),
        "ppl": math.exp(min(ce, 700.0)),
        "targets": n_targets,
        "bytes": n_bytes,
        "windows": len(windows),
        "seq_len": seq_len,
        "total_nats": total,
    }


def byte_counter(tokens: np.ndarray, tokenizer=None, total_bytes: int | None = None) -> Callable[[int], int] | None:
    """A ``count_bytes`` for :func:`rescore` over ``tokens`` encoded with ``tokenizer``.

    The bytes tokenizer (or none): one byte per token. Otherwise the scored tokens are decoded
    and their UTF-8 length counted; when the whole stream is scored and ``total_bytes`` (the
    stream's byte count) is known, the bytes of the first, unscored, token are subtracted from it.
    Decoding a slice can split a multi-byte character at its ends (a few bytes of error at most).
    """
    name = getattr(tokenizer, "name", "bytes") if tokenizer is not None else "bytes"
    if name == "bytes":
        return None

    def count(n_targets: int) -> int:
        if total_bytes is not None and n_targets == len(tokens) - 1:
            first = len(tokenizer.decode([int(tokens[0])]).encode("utf-8"))
            return int(total_bytes) - first
        ids = [int(t) for t in np.asarray(tokens[1 : n_targets + 1])]
        return len(tokenizer.decode(ids).encode("utf-8"))

    return count


def rescorer(
    tokens: np.ndarray,
    seq_len: int,
    *,
    batch_size: int = 8,
    max_targets: int | None = None,
    count_bytes: Callable[[int], int] | None = None,
) -> Callable[[torch.nn.Module, torch.device, bool], dict]:
    """The final evaluation of a training run, ``evaluate(model, device, progress)``: :func:`rescore`
    of ``tokens`` with these settings (what :func:`drmlab.training.train` takes as ``evaluate``)."""

    def evaluate(model: torch.nn.Module, device: torch.device, progress: bool = False) -> dict:
        return rescore(
            model,
            tokens,
            seq_len,
            batch_size=batch_size,
            max_targets=max_targets,
            count_bytes=count_bytes,
            device=device,
            progress=progress,
        )

    return evaluate
