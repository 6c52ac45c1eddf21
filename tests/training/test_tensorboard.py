"""TensorBoard event files (drmlab.training.tensorboard): they hold exactly the rows of metrics.jsonl,
DRM diagnostics included, across crashes and resumes with and without --tensorboard; the flag reaches
the trainer from train, ablate and mqar; a missing package is one line before any data is read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from drmlab.cli import main
from drmlab.training.tensorboard import MISSING_MESSAGE, row_scalars

MICRO_STEP = 8 * 32  # tokens per step at preset micro (batch 8 x seq_len 32)


def _train_argv(corpus_file: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--model",
        "J",
        "--preset",
        "micro",
        "--tokens",
        str(6 * MICRO_STEP),
        "--eval-every",
        str(2 * MICRO_STEP),
        "--eval-tokens",
        "512",
        "--data",
        str(corpus_file),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "run"),
        "--quiet",
        *extra,
    ]


def _crash_at(monkeypatch, step: int) -> None:
    """The next run's batches raise at ``step`` (a crash after the rows of the steps before it)."""
    from drmlab.training import trainer
    from drmlab.training.batches import LMWindows

    class Crashing(LMWindows):
        def batch(self, seed, at, micro, rank=0, world_size=1):
            if at == step:
                raise RuntimeError(f"crash at step {at}")
            return super().batch(seed, at, micro, rank, world_size)

    monkeypatch.setattr(trainer, "LMWindows", Crashing)


def _events(run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def _expected(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The scalars metrics.jsonl's rows should give: train rows' loss, ce, lr, grad_norm, tok_s, gflops, util;
    eval rows' val_ce and each diagnostic; float32, as TensorBoard stores them."""
    expected: dict[str, list] = {}
    for row in rows:
        if row["kind"] == "train":
            fields = {f"train/{k}": row[k] for k in ("loss", "ce", "lr", "grad_norm", "tok_s", "gflops", "util")}
        elif row["kind"] == "eval":
            fields = {
                "eval/val_ce": row["val_ce"],
                **{f"eval/diagnostics/{k}": v for k, v in row.get("diagnostics", {}).items()},
            }
        else:
            continue
        for tag, value in fields.items():
            expected.setdefault(tag, []).append((row["step"], float(np.float32(value))))
    return expected


def test_event_files_equal_metrics_across_crashes_and_resumes(corpus_file, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"

    # 1: with --tensorboard, crash at step 4 (checkpoint at step 2, rows of steps 1-3 written)
    _crash_at(monkeypatch, 4)
    with pytest.raises(RuntimeError, match="crash at step 4"):
        main(_train_argv(corpus_file, tmp_path, "--tensorboard"))
    events = _events(run)
    assert [s for s, _ in events["train/loss"]] == [1, 2, 3]
    assert [s for s, _ in events["eval/val_ce"]] == [0, 2]

    # 2: resumed without --tensorboard, crash at step 6 (checkpoint at 4, rows up to step 5)
    _crash_at(monkeypatch, 6)
    with pytest.raises(RuntimeError, match="crash at step 6"):
        main(_train_argv(corpus_file, tmp_path, "--resume"))
    monkeypatch.undo()

    # 3: resumed with --tensorboard to the end: the events are metrics.jsonl's rows, each step once
    assert main(_train_argv(corpus_file, tmp_path, "--resume", "--tensorboard")) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if r["kind"] == "resume"] == [2, 4]
    events = _events(run)
    expected = _expected(rows)
    assert set(events) == set(expected)
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tok_s",
        "train/gflops",
        "train/util",
        "eval/val_ce",
        "eval/diagnostics/dimD_mean",
        "eval/diagnostics/gate_q50",
        "eval/diagnostics/metric_energy_mean",
    } <= set(events)
    for tag, points in expected.items():
        assert events[tag] == points, tag
    assert len(list((run / "tensorboard").iterdir())) == 1  # one event file: the replayed history and the new rows

    # The diagnostics of the last evaluation are the geometry report of the final weights on the first
    # sampled validation windows.
    from drmlab.data import load_corpus
    from drmlab.models.drm.diagnostics import geometry_report
    from drmlab.runs import load_run_model
    from drmlab.training.batches import eval_sample
    from drmlab.training.diagnostics import WINDOWS

    model, config, _ = load_run_model(run)
    train_cfg = config["train"]
    val = load_corpus(source=str(corpus_file), tokenizer="bytes", cache_dir=str(tmp_path / "cache")).val
    windows = eval_sample(val, train_cfg["eval_windows"], train_cfg["seq_len"])[:WINDOWS]
    report = geometry_report(model, windows[:, :-1])
    last = rows[-1]
    assert last["kind"] == "eval" and last["step"] == 6
    assert last["diagnostics"]["dimD_mean"] == report["dimD_mean"]
    assert last["diagnostics"]["metric_energy_mean"] == report["metric_energy_mean"]
    assert last["diagnostics"]["gate_q50"] == report["gate_quantiles_10_50_90"][1]


def test_row_scalars_are_the_measurements_of_a_row():
    row = {
        "kind": "eval",
        "step": 4,
        "tokens": 1024,
        "elapsed": 3.0,
        "val_windows": 8,
        "val_ce": 2.5,
        "diagnostics": {"dimD_mean": 1.5, "note": "text", "bad": float("nan")},
        "finished": True,
    }
    assert row_scalars(row) == [("eval/val_ce", 2.5), ("eval/diagnostics/dimD_mean", 1.5)]
    assert row_scalars({"kind": "resume", "step": 4, "changed": {}, "threads": 2}) == []


@pytest.mark.parametrize("verb", ["train", "ablate", "mqar"])
def test_missing_package_is_one_line_before_any_data(verb, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    missing_data = str(tmp_path / "no-such-corpus.txt")  # loading it first would be a different error
    argv = {
        "train": ["train", "--preset", "micro", "--data", missing_data],
        "ablate": ["ablate", "--preset", "micro", "--data", missing_data],
        "mqar": ["mqar", "--preset", "micro"],
    }[verb]
    assert main(argv + ["--out", str(tmp_path / "out"), "--tensorboard"]) == 2
    assert capsys.readouterr().err == f"drmlab {verb}: error: {MISSING_MESSAGE}\n"
    assert not (tmp_path / "out").exists()


def test_missing_package_stops_train_before_it_starts(tmp_path, monkeypatch):
    from drmlab.models import build_model
    from drmlab.training import TrainConfig, train
    from drmlab.training.tensorboard import TensorBoardMissing

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    tokens = np.arange(4096) % 200
    with pytest.raises(TensorBoardMissing, match="pip install 'drmlab\\[tensorboard\\]'"):
        train(
            build_model("SSM_CONTROL", "micro", vocab_size=256),
            tokens,
            None,
            TrainConfig(tokens=256, batch_size=8, seq_len=32),
            tmp_path / "run",
            tensorboard=True,
        )
    assert not (tmp_path / "run").exists()


def test_ablate_and_mqar_hand_the_flag_to_the_trainer(corpus_file, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from drmlab.training import trainer

    class Captured(Exception):
        pass

    def capture(*args, **kwargs):
        raise Captured(kwargs.get("tensorboard"))

    monkeypatch.setattr(trainer, "train", capture)
    for argv in (
        [
            "ablate",
            "--models",
            "SSM_CONTROL",
            "--seeds",
            "1",
            "--preset",
            "micro",
            "--tokens",
            "256",
            "--data",
            str(corpus_file),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        [
            "mqar",
            "--models",
            "SSM_CONTROL",
            "--kv",
            "2",
            "--seeds",
            "0",
            "--preset",
            "micro",
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--n-train",
            "8",
            "--n-test",
            "8",
        ],
    ):
        for flag, expected in (([], False), (["--tensorboard"], True)):
            with pytest.raises(Captured) as caught:
                main(argv + ["--out", str(tmp_path / argv[0]), "--quiet"] + flag)
            assert caught.value.args == (expected,), argv[0]
