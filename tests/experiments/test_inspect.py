"""drmlab inspect (drmlab.experiments.probes.inspect, drmlab.cli.inspect): every registered model at preset
micro, model settings, and a trained run loaded back from its run directory."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from drmlab.cli import main
from drmlab.experiments.probes.inspect import inspect_registered, inspect_run, sample_tokens
from drmlab.models import build_model, list_models
from drmlab.presets import PRESET_DEFAULTS
from drmlab.training import train
from drmlab.training.config import TrainConfig
from drmlab.training.run_info import DataInfo, RunInfo

MICRO_WINDOW = PRESET_DEFAULTS["micro"]["seq_len"]


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_inspects_at_micro(name):
    report = inspect_registered(name, "micro")
    assert report["model"] == name and report["preset"] == "micro"
    assert report["tokens"] == 2 * MICRO_WINDOW  # the preset's window: every position table covers it
    assert report["params"] == sum(p.numel() for p in build_model(name, "micro").parameters())
    assert report["ce_uniform_nats"] == pytest.approx(math.log(256))
    # an untrained model guesses near uniformly: its CE on real text sits near ln 256
    assert abs(report["ce_untrained_nats"] - math.log(256)) < 1.0, report["ce_untrained_nats"]
    assert ("geometry" in report) == hasattr(build_model(name, "micro"), "states")


def test_the_report_is_the_cross_entropy_of_the_built_model():
    report = inspect_registered("MAMBA", "micro", seed=4)
    model = build_model("MAMBA", "micro", seed=4).eval()
    tokens = sample_tokens(2, MICRO_WINDOW)
    assert tokens.shape == (2, MICRO_WINDOW + 1)
    assert bytes(tokens.flatten().tolist()) == Path(argparse.__file__).read_bytes()[: 2 * (MICRO_WINDOW + 1)]
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    assert report["ce_untrained_nats"] == F.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1)).item()


def test_model_settings_and_lengths(tmp_path, capsys):
    default = inspect_registered("LOOPED", "micro")
    arm = inspect_registered("LOOPED", "micro", arm="I12u")
    assert arm["overrides"] == {"arm": "I12u"} and arm["params"] < default["params"]
    # a window longer than GPT2's position table is refused with the setting to raise, which --set can
    assert main(["inspect", "--model", "GPT2", "--preset", "micro", "--length", "40"]) == 2
    err = capsys.readouterr().err
    assert "n_positions=32" in err and err.count("\n") == 1
    out = tmp_path / "gpt2.json"
    assert (
        main(
            [
                "inspect",
                "--model",
                "GPT2",
                "--preset",
                "micro",
                "--length",
                "40",
                "--set",
                "n_positions=40",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["tokens"] == 80 and report["overrides"] == {"n_positions": 40}
    assert "ce_untrained_nats" in capsys.readouterr().out
    assert main(["inspect", "--model", "LOOPED", "--preset", "micro", "--set", "n_loops=2"]) == 2
    assert "n_loop" in capsys.readouterr().err


def _train_micro_run(run_dir: Path, name: str, seed: int):
    stream = np.frombuffer(Path(np.__file__).read_bytes(), dtype=np.uint8).astype(np.uint16)
    model = build_model(name, "micro", vocab_size=256, seed=seed)
    cfg = TrainConfig(
        tokens=2 * 4 * MICRO_WINDOW, batch_size=4, seq_len=MICRO_WINDOW, seed=seed, eval_every=0, eval_windows=0
    )
    train(
        model,
        stream,
        None,
        cfg,
        run_dir,
        quiet=True,
        run_info=RunInfo(name, "micro", data=DataInfo(256, "bytes", None, None)),
    )
    return model.eval()


def test_a_trained_run_is_inspected_from_its_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    trained = _train_micro_run(run_dir, "GPT2", seed=3)
    report = inspect_run(run_dir)
    assert (report["model"], report["preset"], report["step"], report["seed"]) == ("GPT2", "micro", 2, 3)
    assert report["tokens_trained"] == 2 * 4 * MICRO_WINDOW and report["tokens"] == 2 * MICRO_WINDOW
    tokens = sample_tokens(2, MICRO_WINDOW)
    with torch.no_grad():
        logits = trained(tokens[:, :-1]).logits
    # the checkpoint reloads into the same function the trainer left in memory
    assert report["ce_trained_nats"] == F.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1)).item()
    assert report["ce_trained_nats"] != inspect_registered("GPT2", "micro", seed=3)["ce_untrained_nats"]

    out = tmp_path / "run.json"
    assert main(["inspect", "--ckpt", str(run_dir), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["ce_trained_nats"] == report["ce_trained_nats"]
    assert "step: 2" in capsys.readouterr().out
    assert main(["inspect", "--ckpt", str(run_dir), "--model", "J"]) == 2
    assert "drop --model" in capsys.readouterr().err
    assert main(["inspect", "--ckpt", str(tmp_path / "missing")]) == 2
