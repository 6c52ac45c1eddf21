"""drmlab compare: the join of an ablation study and an MQAR study (numbers read, never recomputed)."""

from __future__ import annotations

import json

import pytest

from drmlab.cli import main
from drmlab.experiments.probes import compare


def _ablate(tmp_path, name, models):
    folder = tmp_path / name
    folder.mkdir()
    study = {
        "preset": "tiny",
        "seeds": [1, 2],
        "tokenizer": "bytes",
        "data_source": None,
        "train": {"tokens": 1000, "batch_size": 2, "seq_len": 8, "lr": 2e-3, "schedule": "constant"},
    }
    results = {
        "study": study,
        "models": {
            m: {"params": p, "bpb_mean": bpb, "bpb_std": 0.01, "ce_mean": bpb * 0.69, "n_seeds": 2}
            for m, (p, bpb) in models.items()
        },
    }
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def _mqar(tmp_path, cells):
    folder = tmp_path / "mqar"
    folder.mkdir()
    study = {
        "kvs": [4, 8],
        "vocab_kv": 64,
        "n_train": 4096,
        "n_test": 1024,
        "steps": 10,
        "batch_size": 64,
        "preset": "tiny",
        "width": None,
        "seeds": [1, 2],
        "train_overrides": {},
    }
    models = {
        m: {
            "cells": {
                "4": {
                    "acc_mean": acc,
                    "acc_std": 0.05,
                    "n_seeds": 2,
                    "train_acc_mean": 0.9,
                    "first_query_mean": acc + 0.01,
                    "first_query_std": 0.02,
                    "params": 1000,
                    "chance": 1 / 64,
                }
            }
        }
        for m, acc in cells.items()
    }
    levels = {"4": {"chance": 1 / 64, "context_guess": 0.26171875, "elimination_guess": 0.5283203125}}
    (folder / "mqar.json").write_text(
        json.dumps({"study": study, "chance": 1 / 64, "levels": levels, "models": models})
    )
    return folder


def test_join_orders_by_bits_per_byte_and_keeps_mqar_only_rows(tmp_path, capsys):
    a = _ablate(tmp_path, "a", {"J": (100, 2.9), "GPT2": (110, 3.5), "MAMBA": (105, 2.7)})
    m = _mqar(tmp_path, {"J": 0.25, "MAMBA": 0.5, "L4_ds64": 0.7})
    out = tmp_path / "out"
    assert main(["compare", "--ablate", str(a), "--mqar", str(m), "--out", str(out)]) == 0
    text = (out / "compare.md").read_text()
    assert text == capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[0][2:] for line in lines] == ["MAMBA", "J", "GPT2", "L4_ds64"]
    assert "| MAMBA | 105 | 2.7000 +- 0.0100 (2) | 50.0% +- 5.0 (2) | 51.0% +- 2.0 | 90.0% | 1,000 |" in text
    assert "| GPT2 | 110 | 3.5000 +- 0.0100 (2) | -- | -- | -- | -- |" in text
    assert "26.2% by answering with a random value" in text and "52.8%" in text
    assert "| L4_ds64 | -- | -- | 70.0% +- 5.0 (2) |" in text
    assert "chance 1.56%" in text and "a 1,000-token budget per run" in text
    assert (out / "compare.png").stat().st_size > 0


def test_bad_input_is_refused(tmp_path, capsys):
    a = _ablate(tmp_path, "a", {"J": (100, 2.9)})
    b = _ablate(tmp_path, "b", {"J": (100, 2.8)})
    m = _mqar(tmp_path, {"J": 0.25})
    with pytest.raises(ValueError, match="two ablation studies"):
        compare.join([compare.load_ablate(a), compare.load_ablate(b)], None, None)
    assert main(["compare", "--ablate", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no results.json" in capsys.readouterr().err
    assert main(["compare", "--mqar", str(m), "--kv", "16", "--out", str(tmp_path / "o")]) == 2
    assert "the MQAR study has kv 4, 8" in capsys.readouterr().err
    assert main(["compare", "--out", str(tmp_path / "o")]) == 2
