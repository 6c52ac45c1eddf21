"""Scoring a token stream target by target: in windows each from a fresh state, or with the decoding state
carried through each document (the long-context evaluation, docs/guide.md "Long-context evaluation").

Target ``j`` is ``stream[j + 1]``, predicted after the input ``stream[j]``. A *segment* ``(start, length)``
is a stretch read from a fresh state: inputs ``stream[start : start + length]``, targets ``start ..
start + length - 1``. :func:`segments` cuts the targets at the reset offsets (the corpus's document
starts, ``drmlab.data.documents``: a document begins at its leading "\\n\\n"), so no state crosses a
document boundary; without offsets the whole stream is one segment.

:func:`score_carried` scores each segment with one state carried from its first token to its last -- the
function the model computes over the whole segment, whatever its length. A segment of at most ``chunk``
inputs is one parallel forward; such segments share a batch, longest first, up to ``lanes`` rows and
``max_tokens`` padded tokens, each row padded at its end with a filler token (the forward is causal, so
the logits before the filler do not depend on it: the registry-wide causality test). A longer one runs
its first ``chunk`` inputs through ``model(tokens, return_state=True)`` (the prefill of
:mod:`drmlab.generation`: the state that stepping those tokens reaches) and continues with ``model.step``,
token by token, carrying the state; up to ``lanes`` long segments step side by side, one per batch row,
the longest together (a row whose segment ended steps the filler, whose scores are dropped). Rows never
mix, so lanes are exact: each row is its own sequence from a fresh state. The registry-wide tests check
that stepping equals the forward (``tests/models/test_step_equivalence.py``) and that the prefilled state
equals the stepped one (``tests/generation``); ``tests/evaluation/test_carried.py`` checks this module
against one forward over each segment and against stepping every token.

:func:`score_windows` scores explicit windows, each from a fresh state, windows of one length together
(the windows of ``drmlab eval --by-position``); ``visible`` feeds only the first ``visible`` inputs of
each window (a learned position table), the rest of it is left unscored. (A model whose state grows with
every token is scored with the state carried through windows that :func:`split_windows` cuts from each
segment: each window is then a segment of its own.)

Both return :class:`TargetScores`: per target its negative log-likelihood (float64), its position (inputs
read since the fresh state, less one: 0 for the first prediction) and its group (window or segment).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from drmlab.evaluation.rescoring import window_logits

FILLER = 0  # the token a finished lane steps on (any id of every vocabulary); its scores are dropped


@dataclass
class TargetScores:
    """Per target ``j`` of the stream (arrays of length ``n_targets``): ``nll`` (float64, NaN where not
    scored), ``position`` (inputs read since the state was fresh, less one; -1 where not scored) and
    ``group`` (the index of the window or segment it was scored in; -1 where not scored)."""

    nll: np.ndarray
    position: np.ndarray
    group: np.ndarray

    @classmethod
    def empty(cls, n_targets: int) -> TargetScores:
        return cls(
            np.full(n_targets, np.nan), np.full(n_targets, -1, dtype=np.int64), np.full(n_targets, -1, dtype=np.int64)
        )

    @property
    def scored(self) -> np.ndarray:
        return self.position >= 0

    @property
    def count(self) -> int:
        return int(self.scored.sum())

    @property
    def total_nats(self) -> float:
        return float(self.nll[self.scored].sum())

    def put(self, first: int, nll: torch.Tensor, start_position: int, group: int) -> None:
        """Record ``nll`` [n] for targets ``first .. first + n - 1``, at positions from ``start_position``."""
        n = int(nll.shape[0])
        self.nll[first : first + n] = nll.detach().double().cpu().numpy()
        self.position[first : first + n] = np.arange(start_position, start_position + n)
        self.group[first : first + n] = group


def segments(n_targets: int, starts=None) -> list[tuple[int, int]]:
    """``(start, length)`` of each stretch scored from a fresh state, covering targets ``0 .. n_targets -
    1`` once: cut at the offsets ``starts`` (0 and those at or past ``n_targets`` ignored); None: one."""
    if n_targets <= 0:
        raise ValueError(f"nothing to score: {n_targets} targets")
    cuts = sorted({0} | {int(s) for s in (starts if starts is not None else ()) if 0 < int(s) < n_targets})
    return [(a, b - a) for a, b in zip(cuts, cuts[1:] + [n_targets])]


def split_windows(spans: list[tuple[int, int]], window: int) -> list[tuple[int, int]]:
    """Each ``(start, length)`` span cut into consecutive windows of at most ``window`` inputs."""
    if window < 1:
        raise ValueError(f"a window must hold at least one token, got {window}")
    return [(s + k, min(window, n - k)) for s, n in spans for k in range(0, n, window)]


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-target negative log-likelihood of logits [..., vocab] (float32, float64 for a float64 model)."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view(
        targets.shape
    )


def _progress(total: int, enabled: bool, what: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="tok" if "windows" in what else "step", desc=what, leave=False)


class _EvalMode:
    """Eval mode and no gradients inside; the model's mode restored after."""

    def __init__(self, model):
        self.model, self.grad = model, torch.no_grad()

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        self.grad.__enter__()

    def __exit__(self, *exc):
        self.grad.__exit__(*exc)
        self.model.train(self.was_training)


def _device(model, device):
    return torch.device(device) if device is not None else next(iter(model.parameters())).device


def score_windows(
    model,
    stream: torch.Tensor,
    windows: list[tuple[int, int]],
    *,
    n_targets: int,
    batch_size: int = 8,
    visible: int | None = None,
    device=None,
    progress: bool = False,
) -> TargetScores:
    """Score each ``(start, length)`` window from a fresh state (group: the window's index); with ``visible``,
    only its first ``visible`` inputs (the others stay unscored)."""
    device = _device(model, device)
    scores = TargetScores.empty(n_targets)
    index = {start: i for i, (start, _) in enumerate(windows)}
    fed = [(s, min(n, visible) if visible is not None else n) for s, n in windows]
    bar = _progress(sum(n for _, n in fed), progress, "scoring windows")
    with _EvalMode(model):
        for starts, rows, logits in window_logits(model, stream, fed, batch_size, device):
            nll = _nll(logits, rows[:, 1:])
            for row, start in enumerate(starts.tolist()):
                scores.put(start, nll[row], 0, index[start])
            if bar is not None:
                bar.update(nll.numel())
    if bar is not None:
        bar.close()
    return scores


def _padded_rows(stream: torch.Tensor, batch, length: int) -> torch.Tensor:
    """Rows ``stream[s : s + n + 1]`` of each ``(s, n)``, padded with the filler to ``length + 1`` tokens."""
    rows = torch.full((len(batch), length + 1), FILLER, dtype=torch.long)
    for r, (s, n) in enumerate(batch):
        rows[r, : n + 1] = stream[s : s + n + 1]
    return rows


def _batches(spans, lanes: int, max_tokens: int, length=lambda sn: sn[1]):
    """``spans`` longest first, in batches of at most ``lanes`` rows whose padded tokens (rows times the
    first row's ``length``) stay within ``max_tokens`` (one row at least)."""
    spans = sorted(spans, key=lambda sn: (-sn[1], sn[0]))
    i = 0
    while i < len(spans):
        rows = max(1, min(lanes, max_tokens // max(1, length(spans[i]))))
        yield spans[i : i + rows]
        i += rows


def score_carried(
    model,
    stream: torch.Tensor,
    spans: list[tuple[int, int]],
    *,
    n_targets: int,
    chunk: int = 2048,
    lanes: int = 8,
    max_tokens: int | None = None,
    device=None,
    progress: bool = False,
) -> TargetScores:
    """Score each ``(start, length)`` segment with its state carried from its first input to its last
    (module docstring); group: the segment's index in ``spans``. ``max_tokens``: the most padded tokens
    of one forward (default ``lanes * chunk``)."""
    if chunk < 1 or lanes < 1:
        raise ValueError(f"chunk and lanes must be positive, got {chunk} and {lanes}")
    device = _device(model, device)
    budget = max_tokens if max_tokens is not None else lanes * chunk
    scores = TargetScores.empty(n_targets)
    group = {start: i for i, (start, _) in enumerate(spans)}
    short = [(s, n) for s, n in spans if n <= chunk]
    long = [(s, n) for s, n in spans if n > chunk]
    long_batches = list(_batches(long, lanes, budget, length=lambda sn: chunk))
    bar = _progress(sum(b[0][1] - chunk for b in long_batches), progress, "stepping with the state carried")
    with _EvalMode(model), torch.autocast(device_type=device.type, enabled=False):
        for batch in _batches(short, lanes, budget):
            rows = _padded_rows(stream, batch, batch[0][1]).to(device)
            nll = _nll(model(rows[:, :-1]).logits, rows[:, 1:])
            for r, (s, n) in enumerate(batch):
                scores.put(s, nll[r, :n], 0, group[s])
        for batch in long_batches:
            _step_lanes(model, stream, batch, chunk, device, scores, [group[s] for s, _ in batch], bar)
    if bar is not None:
        bar.close()
    return scores


def _step_lanes(model, stream, batch, chunk, device, scores: TargetScores, groups, bar) -> None:
    """One batch of long segments, one per row: a parallel forward over the first ``chunk`` inputs that
    returns the state, then ``model.step`` over the rest, each row's scores kept up to its own end."""
    longest = batch[0][1]
    rows = _padded_rows(stream, batch, longest).to(device)
    out = model(rows[:, :chunk], return_state=True)
    head = _nll(out.logits, rows[:, 1 : chunk + 1])
    state = out.state
    del out
    tail = []
    for t in range(chunk, longest):
        logits, state = model.step(rows[:, t], state)
        tail.append(_nll(logits, rows[:, t + 1]))
        if bar is not None:
            bar.update(1)
    nll = torch.cat([head, torch.stack(tail, dim=1)], dim=1) if tail else head
    for r, (s, n) in enumerate(batch):
        scores.put(s, nll[r, :n], 0, groups[r])
