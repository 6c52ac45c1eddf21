"""Loss by position (drmlab.evaluation.positions, long_context.by_position_report): the buckets tile the
positions, their token counts add up to the targets scored, the band is the normal interval over
windows, positions past a learned position table are "n/a" with the reason, and the memory estimate's
largest window is the one its own rule accepts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drmlab.evaluation.carried import TargetScores
from drmlab.evaluation.long_context import by_position_report
from drmlab.evaluation.memory import MemoryModel, fit_memory
from drmlab.evaluation.positions import Z95, bucket_edges, by_position
from drmlab.models import build_model


@pytest.mark.parametrize("length", [1, 2, 3, 31, 32, 33, 512, 1000])
def test_buckets_tile_the_positions_and_double(length):
    edges = bucket_edges(length)
    assert edges[0] == (0, 1) and edges[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(edges, edges[1:]))  # contiguous
    assert all(hi == 2 * lo for lo, hi in edges[1:-1])  # each doubles; the last is cut at the length


def _scores(nll: np.ndarray, window: int) -> TargetScores:
    n = len(nll)
    return TargetScores(nll, np.arange(n) % window, np.arange(n) // window)


def test_the_band_is_the_normal_interval_over_per_window_means():
    rng = np.random.default_rng(0)
    window, windows = 16, 40
    nll = rng.gamma(2.0, 1.5, window * windows)
    rows = by_position(_scores(nll, window), window)
    per_window = nll.reshape(windows, window)
    for row in rows:
        means = per_window[:, row["lo"] : row["hi"]].mean(axis=1)  # equal counts: the ratio estimator's case
        half = Z95 * means.std(ddof=1) / math.sqrt(windows)
        assert row["ce"] == pytest.approx(means.mean(), rel=1e-12)
        assert (row["low"], row["high"]) == pytest.approx((means.mean() - half, means.mean() + half), rel=1e-9)
        assert row["groups"] == windows and row["tokens"] == windows * (row["hi"] - row["lo"])
    one = by_position(_scores(nll[:window], window), window)  # one window: no band
    assert all(r["low"] is None and r["high"] is None for r in one)


@pytest.mark.parametrize("name", ["SSM_CONTROL", "LLAMA", "GPT2"])
def test_bucket_counts_add_up_to_the_targets_scored(name):
    model = build_model(name, preset="micro", seed=0).eval()
    stream = torch.randint(0, 256, (700,), generator=torch.Generator().manual_seed(2))
    seq_len = 100  # past every micro model's training window (32); GPT2's table has 32 rows
    report, scores = by_position_report(model, stream, seq_len, n_targets=len(stream) - 1, batch_size=3)
    counted = sum(r["tokens"] for r in report["buckets"])
    assert counted == report["targets"] == scores.count
    assert report["ce"] == pytest.approx(scores.total_nats / scores.count)
    weighted = sum(r["ce"] * r["tokens"] for r in report["buckets"] if r["tokens"])
    assert weighted / counted == pytest.approx(report["ce"], rel=1e-9)
    if name == "GPT2":
        limit = model.config.n_positions
        assert report["position_limit"] == limit and scores.count < len(stream) - 1
        assert scores.position.max() == limit - 1
        na = [r for r in report["buckets"] if r["ce"] == "n/a"]
        assert na and all(
            r["lo"] >= limit and "position table" in r["reason"] and str(limit) in r["reason"] for r in na
        )
    else:
        assert report["position_limit"] is None and scores.count == len(stream) - 1  # LLAMA runs past its window
        assert all(isinstance(r["ce"], float) for r in report["buckets"])


def test_the_largest_window_is_the_one_the_estimate_accepts():
    memory = MemoryModel(a=4e6, b=3e3, c=2.0, lengths=(1, 2, 3))
    for budget in (10**7, 10**8, 10**9):
        largest = memory.largest_length(1, budget)
        assert memory.bytes(1, largest) <= budget < memory.bytes(1, largest + 1)
        assert memory.largest_batch(largest, budget, 8) >= 1 and memory.largest_batch(largest + 1, budget, 8) == 0
    linear = MemoryModel(a=0.0, b=100.0, c=0.0, lengths=(1, 2, 3))
    assert (
        linear.bytes(1, linear.largest_length(1, 10**6)) <= 10**6 < linear.bytes(1, linear.largest_length(1, 10**6) + 1)
    )


def test_the_memory_fit_measures_a_real_forward():
    # SSM_CONTROL: the fit is the same code for every model, and J's long probe forwards take 10 s at micro
    model = build_model("SSM_CONTROL", preset="micro", seed=0)
    memory = fit_memory(model, "cpu")
    assert memory is not None and memory.b > 0  # activations grow with the window
    assert memory.bytes(2, 1000) > memory.bytes(1, 1000) > memory.bytes(1, 100)
