"""Utilisation in the train rows (drmlab.training.utilisation): the FLOP count validated on a case with a
known answer, linear in the batch for every registered model, undone after counting; the peak cached."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from drmlab.models import build_model, list_models
from drmlab.models.output import ModelOutput
from drmlab.training import TrainConfig, train, utilisation
from drmlab.training.trainer import lm_loss_fn
from drmlab.training.utilisation import Utilisation, count_step_flops, gemm_peak_gflops


class Bigram(nn.Module):
    """Embedding -> one Linear: a step's matrix FLOPs are 6 T d V per sequence (forward 2 T d V; the
    backward's input gradient and weight gradient 2 T d V each; the embedding's backward is no product)."""

    def __init__(self, vocab=32, d=8):
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, d), nn.Linear(d, vocab)

    def forward(self, tokens, step=None):
        return ModelOutput(logits=self.out(self.emb(tokens)), aux={})


def _batch(vocab, rows, length, seed=0):
    tokens = torch.randint(0, vocab, (rows, length + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def test_the_count_is_the_known_answer_on_a_bigram_model():
    model, vocab, d, length = Bigram(32, 8), 32, 8, 12
    flops = count_step_flops(model, lm_loss_fn(), _batch(vocab, 3, length), 1, sequences=5)
    assert flops == 5 * 6 * length * d * vocab


def test_counting_leaves_no_gradient_buffer_or_rng_change():
    model = build_model("J", "micro", vocab_size=256, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    count_step_flops(model, lm_loss_fn(), _batch(256, 2, 16), 1, sequences=2)
    assert torch.equal(torch.rand(4), expected)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", list_models())
def test_a_registered_models_step_flops_are_linear_in_the_batch(name):
    """The trainer counts one sequence and multiplies: true only where a model's cost is linear in the batch."""
    model = build_model(name, "micro", vocab_size=256, seed=0)
    inputs, targets = _batch(256, 2, 16)
    one = count_step_flops(model, lm_loss_fn(), (inputs, targets), 3, sequences=1)
    counter = torch.utils.flop_counter.FlopCounterMode(display=False)
    with counter:
        loss, _ = lm_loss_fn()(model, (inputs, targets), 3)
        loss.backward()
    assert one > 0 and counter.get_total_flops() == 2 * one


def test_the_gemm_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(utilisation, "measure_gemm_gflops", lambda device, dtype: calls.append(dtype) or 123.0)
    first = gemm_peak_gflops(torch.device("cpu"), torch.float32)
    second = gemm_peak_gflops(torch.device("cpu"), torch.float32)
    assert first["gflops"] == second["gflops"] == 123.0 and not first["cached"] and second["cached"]
    assert calls == [torch.float32]
    gemm_peak_gflops(torch.device("cpu"), torch.bfloat16)  # another dtype: its own entry
    assert calls == [torch.float32, torch.bfloat16]
    (tmp_path / utilisation.CACHE_NAME).write_text("not json")  # a damaged cache is measured again
    assert gemm_peak_gflops(torch.device("cpu"), torch.float32)["cached"] is False


def test_the_measured_peak_is_a_rate_of_the_right_size():
    gflops = utilisation.measure_gemm_gflops(torch.device("cpu"), torch.float32, size=128)
    assert 0.01 < gflops < 1e5


def test_a_peak_measured_beside_other_work_is_not_understated(monkeypatch):
    """Another process on the same cores stretches the wall clock, not this process's CPU time: with a wall
    clock running three times too fast the measured peak stays near the unstretched one (a wall-clock
    measurement would fall to a third of it)."""
    size = 256
    quiet = utilisation.measure_gemm_gflops(torch.device("cpu"), torch.float32, size=size)
    real, origin = time.perf_counter, time.perf_counter()
    monkeypatch.setattr(time, "perf_counter", lambda: origin + 3 * (real() - origin))
    busy = utilisation.measure_gemm_gflops(torch.device("cpu"), torch.float32, size=size)
    assert busy > 0.5 * quiet


def test_a_peak_cached_before_the_cpu_time_rule_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(utilisation, "measure_gemm_gflops", lambda device, dtype: 150.0)
    gemm_peak_gflops(torch.device("cpu"), torch.float32)
    path = next(tmp_path.rglob(utilisation.CACHE_NAME))
    entries = json.loads(path.read_text())
    (key,) = entries
    path.write_text(json.dumps({key.removesuffix("|cpu-time"): 84.6}))  # an old entry, measured by the wall clock
    again = gemm_peak_gflops(torch.device("cpu"), torch.float32)
    assert again["gflops"] == 150.0 and again["cached"] is False


def test_rows_summary_and_config_carry_the_utilisation(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    data = rng.integers(0, 32, size=4000).astype(np.int64)
    cfg = TrainConfig(tokens=4 * 8 * 3, batch_size=4, seq_len=8, lr=1e-3, eval_every=0, eval_windows=0)
    summary = train(Bigram(32, 8), data, None, cfg, tmp_path / "run", quiet=True)
    rows = [r for r in summary["rows"] if r["kind"] == "train"]
    step_flops = 4 * 6 * 8 * 8 * 32
    runtime = json.loads((tmp_path / "run" / "config.json").read_text())["runtime"]
    assert runtime["utilisation"]["step_flops"] == step_flops
    peak = runtime["utilisation"]["gemm_peak_gflops"]
    for row in rows:
        gflops = step_flops / (cfg.tokens_per_step / row["tok_s"]) / 1e9
        assert row["gflops"] == pytest.approx(gflops, rel=1e-9) and row["util"] == pytest.approx(gflops / peak)
    assert summary["gflops"] > 0 and summary["util"] == pytest.approx(summary["gflops"] / peak)


def test_utilisation_entries():
    u = Utilisation(2_000_000_000, {"gflops": 100.0, "device": "x", "dtype": "torch.float32", "threads": 1})
    assert u.entries(0.5) == {"gflops": 4.0, "util": 0.04} and u.entries(0.0) == {}
