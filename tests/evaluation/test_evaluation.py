"""Deterministic rescoring, and the train/eval commands end to end."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from drmlab.evaluation import byte_counter, rescore
from drmlab.models.output import ModelOutput


class PrefixLM(nn.Module):
    def __init__(self, vocab=256, d=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = nn.Parameter(torch.randn(vocab, d, generator=g))
        self.out = nn.Parameter(torch.randn(d, vocab, generator=g))

    def forward(self, tokens, step=None):
        h = torch.cumsum(self.emb[tokens], 1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
        return ModelOutput(logits=h @ self.out)


@torch.no_grad()
def _by_hand(model, stream, seq_len, n_targets):
    total = 0.0
    for s in range(0, n_targets, seq_len):
        length = min(seq_len, n_targets - s)
        window = torch.as_tensor(stream[s : s + length + 1], dtype=torch.long)[None]
        logp = torch.log_softmax(model(window[:, :-1]).logits.double(), -1)
        total -= float(logp[0, torch.arange(length), window[0, 1:]].sum())
    return total / n_targets


def test_rescoring_covers_the_stream_once_and_is_deterministic():
    stream = np.random.default_rng(0).integers(0, 256, 1000).astype(np.uint8)
    model = PrefixLM()
    a = rescore(model, stream, 64, batch_size=3)
    b = rescore(model, stream, 64, batch_size=3)
    assert a == b
    assert a["targets"] == 999 and a["windows"] == math.ceil(999 / 64) and a["bytes"] == 999
    assert a["ce"] == pytest.approx(_by_hand(model, stream, 64, 999), rel=1e-6)
    assert a["bpb"] == pytest.approx(a["ce"] / math.log(2)) and a["ppl"] == pytest.approx(math.exp(a["ce"]))
    assert rescore(model, stream, 64, batch_size=16)["ce"] == pytest.approx(a["ce"], rel=1e-6)
    capped = rescore(model, stream, 64, max_targets=200)
    assert capped["targets"] == 200 and capped["ce"] == pytest.approx(_by_hand(model, stream, 64, 200), rel=1e-6)
    assert model.training  # mode restored


def test_bits_per_byte_uses_the_bytes_of_the_scored_text():
    class Fake:
        name = "fake"

        def decode(self, ids):
            return "".join("é" if i % 2 else "a" for i in ids)  # 2 bytes or 1

    stream = np.arange(101) % 4
    counter = byte_counter(stream, Fake())
    assert counter(100) == sum(2 if i % 2 else 1 for i in stream[1:101])
    assert byte_counter(stream, Fake(), total_bytes=1000)(100) == 1000 - 1  # whole stream: total minus first token
    assert byte_counter(stream, None) is None
    result = rescore(PrefixLM(vocab=4), stream, 16, count_bytes=counter)
    assert result["bpb"] == pytest.approx(result["total_nats"] / (math.log(2) * counter(100)))


# ---------------------------------------------------------------- commands end to end


@pytest.fixture(scope="module")
def text_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = ("textwrap.py", "string.py", "bisect.py", "colorsys.py", "keyword.py", "numbers.py")
    path = root / "corpus.txt"  # one file: split into paragraph documents
    path.write_text("\n\n".join((stdlib / name).read_text() for name in names))
    return path


def _cli(argv, capsys):
    from drmlab.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_train_then_eval_commands(text_source, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cache = tmp_path / "cache"
    base = ["--data", str(text_source), "--cache-dir", str(cache), "--quiet"]
    code, out, err = _cli(
        [
            "train",
            "--model",
            "GPT2",
            "--preset",
            "micro",
            "--tokens",
            "2k",
            "--out",
            str(run_dir),
            "--seed",
            "2",
            "--set",
            "n_layer=1",
            "--set",
            "schedule=cosine",
            *base,
        ],
        capsys,
    )
    assert code == 0, err
    assert str(run_dir) in out
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("val_ce", "val_bpb", "tokens", "params", "tokens_per_s"):
        assert summary[key] is not None, key
    assert summary["tokens"] == 2048 and summary["seed"] == 2
    config = json.loads((run_dir / "config.json").read_text())
    assert config["overrides"] == {"n_layer": 1} and config["train"]["schedule"] == "cosine"
    assert config["model_config"]["n_layer"] == 1 and config["data"]["content_sha256"]
    assert (run_dir / "checkpoint.json").is_file() and (run_dir / "metrics.jsonl").is_file()

    code, out, err = _cli(["eval", "--ckpt", str(run_dir), "--cache-dir", str(cache), "--quiet"], capsys)
    assert code == 0, err
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["ce"] == summary["val_ce"] and report["bpb"] == summary["val_bpb"]  # the same numbers
    assert report["step"] == summary["steps"] and report["data_matches_run"]
    assert "nats/token" in out and "bits/byte" in out

    # under the cosine schedule the budget shapes the learning rate: a larger budget is refused, the run kept
    code, out, err = _cli(
        ["train", "--resume", "--out", str(run_dir), "--tokens", "3k", "--cache-dir", str(cache), "--quiet"], capsys
    )
    assert code == 2 and "tokens: 2000 in the run, 3000 now" in err and "cosine" in err
    assert json.loads((run_dir / "summary.json").read_text()) == summary

    # a constant-schedule run resumes with a larger budget and records the change
    const_dir = tmp_path / "const"
    code, out, err = _cli(
        [
            "train",
            "--model",
            "GPT2",
            "--preset",
            "micro",
            "--tokens",
            "2k",
            "--out",
            str(const_dir),
            "--set",
            "n_layer=1",
            *base,
        ],
        capsys,
    )
    assert code == 0, err
    code, out, err = _cli(
        ["train", "--resume", "--out", str(const_dir), "--tokens", "3k", "--cache-dir", str(cache), "--quiet"], capsys
    )
    assert code == 0, err
    summary2 = json.loads((const_dir / "summary.json").read_text())
    assert summary2["tokens"] == 3072 and summary2["steps"] == 12
    resumes = [
        r for r in map(json.loads, (const_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "resume"
    ]
    assert [r["changed"] for r in resumes] == [{"tokens": [2000, 3000]}]


def test_set_typo_is_an_error_with_a_suggestion(text_source, tmp_path, capsys):
    argv = [
        "train",
        "--model",
        "GPT2",
        "--preset",
        "micro",
        "--out",
        str(tmp_path / "r"),
        "--data",
        str(text_source),
        "--cache-dir",
        str(tmp_path / "c"),
        "--quiet",
    ]
    code, out, err = _cli(argv + ["--set", "n_embed=32"], capsys)
    assert code == 2 and "did you mean 'n_embd'" in err
    code, out, err = _cli(argv + ["--set", "warmup_fractio=0.1"], capsys)
    assert code == 2 and "did you mean 'warmup_fraction'" in err
    code, out, err = _cli(["eval", "--ckpt", str(tmp_path / "missing")], capsys)
    assert code == 2 and "not a run directory" in err


def test_help_texts(capsys):
    from drmlab.cli import main

    for verb, words in (
        ("train", ["examples:", "presets", "--set KEY=VALUE"]),
        ("eval", ["examples:", "bits per byte"]),
        ("ablate", ["examples:", "promotion gate"]),
    ):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        text = capsys.readouterr().out
        for word in words:
            assert word in text, (verb, word)
