"""Scoring with the state carried (drmlab.evaluation.carried): for every model of the registry that carries
a fixed-size state, the carried scores equal one forward over each document and stepping every token;
no state crosses a document reset; attention models are scored in windows within documents; and which
models carry a state follows the rule (their decoding state's bytes do not grow)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from drmlab.evaluation.carried import score_carried, score_windows, segments, split_windows
from drmlab.evaluation.long_context import carried_report
from drmlab.models import build_model, list_models
from drmlab.models.decode_state import carries_fixed_state, position_limit, state_nbytes

MODELS = {name: build_model(name, preset="micro", seed=3) for name in list_models()}
RECURRENT = [name for name, model in MODELS.items() if carries_fixed_state(model)]
ATTENTION = [name for name in MODELS if name not in RECURRENT]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}  # relative to the largest |nll|: round-off only


def _stream(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _forward_nll(model, stream: torch.Tensor, spans) -> np.ndarray:
    """Per target: one forward over each span's inputs from a fresh state."""
    out = np.full(sum(n for _, n in spans), np.nan)
    for s, n in spans:
        logits = model(stream[None, s : s + n]).logits[0]
        out[s : s + n] = F.cross_entropy(logits, stream[s + 1 : s + n + 1], reduction="none").double().numpy()
    return out


@torch.no_grad()
def _stepped_nll(model, stream: torch.Tensor, spans) -> np.ndarray:
    """Per target: ``model.step`` token by token through each span from ``init_state`` (the exact path)."""
    out = np.full(sum(n for _, n in spans), np.nan)
    for s, n in spans:
        state = model.init_state(1)
        for t in range(s, s + n):
            logits, state = model.step(stream[t : t + 1], state)
            out[t] = float(F.cross_entropy(logits, stream[t + 1 : t + 2]))
    return out


def _close(a: np.ndarray, b: np.ndarray, dtype) -> None:
    assert not np.isnan(a).any() and not np.isnan(b).any()
    assert np.abs(a - b).max() <= TOL[dtype] * max(1.0, np.abs(b).max())


def test_the_registry_has_both_kinds():
    assert {"J", "MAMBA", "SSM_CONTROL"} <= set(RECURRENT)
    assert {"GPT2", "LLAMA"} <= set(ATTENTION)


@pytest.mark.parametrize("name", list_models())
@torch.no_grad()
def test_which_models_carry_a_state_follows_their_state_bytes(name):
    """Carried: no position table and a bounded state (a DRM block's buffers fill and empty every block): no
    more bytes over tokens 40-79 than over tokens 0-39 (a position table: its two halves). Otherwise the
    state grows (a key/value cache)."""
    model = MODELS[name].eval()
    half = min(40, (position_limit(model) or 80) // 2)
    sizes = []
    state = model.init_state(1)
    for token in _stream(2 * half):
        _, state = model.step(token[None], state)
        sizes.append(state_nbytes(state))
    bounded = max(sizes[half:]) <= max(sizes[:half])
    assert carries_fixed_state(model) == (position_limit(model) is None and bounded)


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_carried_scores_equal_one_forward_and_the_step_path(name, dtype):
    """Documents longer than the parallel chunk are prefilled and stepped, side by side in lanes; shorter ones
    share padded forwards. Each equals one forward over the concatenation of its windows and stepping every
    token."""
    model = copy.deepcopy(MODELS[name]).to(dtype).eval()
    stream = _stream(90)
    n = len(stream) - 1
    for starts in (None, [21, 26, 60]):  # the whole stream as one sequence; documents of 21, 5, 34 and 29 tokens
        spans = segments(n, starts)
        forward = _forward_nll(model, stream, spans)
        stepped = _stepped_nll(model, stream, spans) if dtype == torch.float64 else forward
        # chunk 8: the long ones prefilled and stepped; chunk 40: every document whole, padded 3 to a forward
        for chunk, lanes in ((8, 2), (40, 3)):
            carried = score_carried(model, stream, spans, n_targets=n, chunk=chunk, lanes=lanes)
            assert carried.count == n and (carried.position >= 0).all()
            _close(carried.nll, forward, dtype)
            _close(carried.nll, stepped, dtype)


@pytest.mark.parametrize("name", ["J", "MAMBA", "SSM_CONTROL"])
def test_no_state_crosses_a_reset(name):
    """Scoring document B after document A with a reset gives exactly the scores of B alone; without the
    reset they differ (A's state reaches B)."""
    model = MODELS[name].eval()
    stream = _stream(70, seed=5)
    n, cut = len(stream) - 1, 33
    after = score_carried(model, stream, segments(n, [cut]), n_targets=n, chunk=6, lanes=1)
    alone = score_carried(model, stream[cut:], segments(n - cut), n_targets=n - cut, chunk=6, lanes=1)
    assert np.array_equal(after.nll[cut:], alone.nll)
    assert np.array_equal(after.position[cut:], np.arange(n - cut))
    carried_over = score_carried(model, stream, segments(n), n_targets=n, chunk=6, lanes=1)
    assert not np.allclose(carried_over.nll[cut:], alone.nll)


@pytest.mark.parametrize("name", ["GPT2", "LLAMA"])
def test_attention_models_are_scored_in_windows_within_documents(name):
    model = MODELS[name].eval()
    stream = _stream(120, seed=6)
    n, cut = len(stream) - 1, 50
    window = position_limit(model) or model.config.max_seq_len
    report, scores = carried_report(model, stream, n_targets=n, doc_starts=[0, cut], chunk=8, lanes=3, window=window)
    assert report["context"] == "windows" and report["window"] == window and name in report["note"]
    assert report["targets"] == scores.count == n
    assert report["windows"] == len(split_windows(segments(n, [cut]), window))
    alone = score_windows(model, stream[cut:], split_windows([(0, n - cut)], window), n_targets=n - cut)
    assert np.allclose(scores.nll[cut:], alone.nll, rtol=0, atol=1e-5)
    assert scores.position.max() == window - 1  # no window reads past the longest the model holds


def test_segments_cover_every_target_once():
    spans = segments(100, np.array([0, 10, 10, 55, 100, 250], dtype=np.uint64))
    assert spans == [(0, 10), (10, 45), (55, 45)]
    assert segments(7) == [(0, 7)]
    assert split_windows([(0, 10), (10, 3)], 4) == [(0, 4), (4, 4), (8, 2), (10, 3)]
    with pytest.raises(ValueError):
        segments(0)
