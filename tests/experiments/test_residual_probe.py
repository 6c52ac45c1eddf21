"""The init-time residual-stream probe: rows, the proofs' signature on LOOPED arms, other models, CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from drmlab.cli.residual_probe import add_parser
from drmlab.experiments.probes.residual import residual_stream, residual_stream_profile, summarize
from drmlab.models import build_model


def _tokens(batch=2, length=24, seed=0):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_rows_match_a_manual_computation():
    m = build_model("LOOPED", "micro", arm="E3").double()
    tokens = _tokens()
    rows = residual_stream_profile(m, tokens)
    assert len(rows) == m.config.applications + 1 == 13
    assert [r["block"] for r in rows[1:]] == list(m.application_blocks) == [0] * 4 + [1] * 4 + [2] * 4
    with torch.no_grad():
        stream = m.residual_stream(tokens)
        assert torch.allclose(m.head(stream[-1]), m(tokens).logits)
    d = m.config.d_model
    k = 6
    upd, prev = stream[k] - stream[k - 1], stream[k - 1] - stream[k - 2]
    assert rows[k]["norm"] == pytest.approx(float(stream[k].norm(dim=-1).mean()) / math.sqrt(d), rel=1e-12)
    assert rows[k]["update_norm"] == pytest.approx(float(upd.norm(dim=-1).mean()) / math.sqrt(d), rel=1e-12)
    cos = (upd * prev).sum(-1) / (upd.norm(dim=-1) * prev.norm(dim=-1))
    assert rows[k]["cos_prev"] == pytest.approx(float(cos.mean()), rel=1e-10)
    assert rows[k]["cos_same_block"] == rows[k]["cos_prev"]  # layer loop: the previous update is the same block's
    assert rows[5]["cos_same_block"] is None and rows[0]["update_norm"] is None
    s = summarize(rows)
    assert s["applications"] == 12 and s["norm_ratio"] == pytest.approx(rows[-1]["norm"] / rows[0]["norm"])


def test_model_loop_pairs_updates_of_the_same_stored_block():
    rows = residual_stream_profile(build_model("LOOPED", "micro", arm="D"), _tokens())
    assert [r["block"] for r in rows[1:]] == list(range(6)) * 2
    assert all(r["cos_same_block"] is None for r in rows[1:7])
    assert all(-1 <= r["cos_same_block"] <= 1 for r in rows[7:])


def test_the_proofs_signature_at_init():
    """Shared weights at ε = 1: correlated updates (cos ≈ 1) and a growing stream; ε = 1/N keeps it flat."""
    tokens = _tokens(length=32)
    unscaled = summarize(residual_stream_profile(build_model("LOOPED", "tiny", arm="I12u"), tokens))
    scaled = summarize(residual_stream_profile(build_model("LOOPED", "tiny", arm="I12"), tokens))
    assert unscaled["mean_cos_same_block"] > 0.8 and scaled["mean_cos_same_block"] > 0.8
    assert unscaled["norm_ratio"] > 3 * scaled["norm_ratio"]
    assert scaled["norm_ratio"] < 1.5


def test_hook_fallback_on_gpt2():
    gpt = build_model("GPT2", "micro")
    stream, blocks = residual_stream(gpt, _tokens())
    assert len(stream) == gpt.config.n_layer + 1 and blocks == list(range(gpt.config.n_layer))
    rows = residual_stream_profile(gpt, _tokens())
    assert len(rows) == 3 and rows[2]["cos_prev"] is not None and rows[2]["cos_same_block"] is None


def test_models_without_a_residual_stack_are_refused():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 8)
            self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

        def forward(self, tokens):
            e = self.emb(tokens)
            return self.heads[0](e) + self.heads[1](e)  # not chained

    with pytest.raises(ValueError, match="no depth-wise residual stack"):
        residual_stream_profile(Flat(), _tokens())


def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = tmp_path / "probe.json"
    args = parser.parse_args(
        [
            "residual-probe",
            "--model",
            "LOOPED",
            "--preset",
            "micro",
            "--set",
            "arm=HE",
            "--set",
            "eps=0.25",
            "--batch",
            "1",
            "--length",
            "8",
            "--json",
            str(out),
        ]
    )
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert report["overrides"] == {"arm": "HE", "eps": 0.25} and len(report["rows"]) == 13
    assert "final/initial norm" in capsys.readouterr().out
    bad = parser.parse_args(["residual-probe", "--preset", "micro", "--set", "n_loops=2"])
    with pytest.raises(ValueError, match="n_loop"):
        bad.func(bad)
