"""``drmlab train --procs``: the choice of processes, the command each runs, and a two-process run that trains
the run of one process (to round-off), stops on one signal with a checkpoint and resumes to the end of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from drmlab.cli import main
from drmlab.cli.processes import AUTO, AUTO_MIN_STEPS, child_argv, choose_procs, parse_procs
from drmlab.training import launcher

IDLE_TWO_CORES = dict(threads=None, on_cpu=True, launched=False, cores=2, others=0, batch_size=32, steps=600)


def test_auto_takes_one_process_per_idle_core_and_keeps_one_where_that_would_not_pay():
    two = choose_procs(AUTO, **IDLE_TWO_CORES)
    assert (two.procs, two.threads) == (2, 1) and "2 idle cores of 2" in two.note and "\n" not in two.note
    assert choose_procs(AUTO, **{**IDLE_TWO_CORES, "cores": 8, "others": 3}).procs == 4  # 5 idle: 4 splits 32
    assert choose_procs(AUTO, **{**IDLE_TWO_CORES, "cores": 8, "others": 0, "batch_size": 12}).procs == 6
    for why, change in {
        "busy machine": {"others": 1},
        "unknown load": {"others": None},
        "--threads chosen": {"threads": 2},
        "a GPU": {"on_cpu": False},
        "already a rank of torchrun": {"launched": True},
        "a short run": {"steps": AUTO_MIN_STEPS - 1},
        "a batch no idle count splits": {"batch_size": 7},
    }.items():
        one = choose_procs(AUTO, **{**IDLE_TWO_CORES, **change})
        assert (one.procs, one.note) == (1, None), why
    # a resume keeps the run's own count and threads, busy machine or not; a one-process run stays one
    kept = choose_procs(AUTO, **{**IDLE_TWO_CORES, "others": 5, "recorded": (2, 1)})
    assert (kept.procs, kept.threads) == (2, 1) and "a resume keeps them" in kept.note
    assert choose_procs(AUTO, **{**IDLE_TWO_CORES, "recorded": (1, 2)}).procs == 1


def test_an_explicit_count_is_obeyed_or_refused_in_one_line():
    assert choose_procs(3, **{**IDLE_TWO_CORES, "batch_size": 12, "others": 9}).procs == 3  # asked: busy or not
    assert choose_procs(2, **{**IDLE_TWO_CORES, "threads": 2}).threads == 2
    assert choose_procs(1, **IDLE_TWO_CORES).procs == 1
    refusals = {
        "does not split the micro-batch of 32 sequences evenly (--batch-size); process counts that do: 1, 2, 4": (
            3,
            {"cores": 4},
        ),
        "--procs trains on CPU cores; on GPUs launch one process per GPU": (2, {"on_cpu": False}),
        "leave it out under torchrun": (2, {"launched": True}),
    }
    for message, (count, change) in refusals.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            choose_procs(count, **{**IDLE_TWO_CORES, **change})
    assert parse_procs(None) == parse_procs("AUTO") == AUTO and parse_procs("4") == 4
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(ValueError, match="--procs must be a positive whole number"):
            parse_procs(bad)


def test_each_process_runs_the_command_without_procs_and_with_its_threads():
    argv = ["train", "--procs", "2", "--threads=4", "--model", "J", "--procs=3", "--threads", "2", "--quiet"]
    assert child_argv(argv, 1) == ["train", "--model", "J", "--quiet", "--threads", "1"]


def test_the_launcher_names_the_process_that_failed_and_stops_the_others(capsys, monkeypatch):
    monkeypatch.setattr(launcher, "FAILURE_GRACE_SECONDS", 0.5)
    fails = [sys.executable, "-c", "import os, sys, time\nif os.environ['RANK'] == '1':\n"
             "    sys.stderr.write('first\\nthe reason\\n'); sys.exit(3)\ntime.sleep(60)"]  # fmt: skip
    started = time.monotonic()
    assert launcher.launch(fails, 2, 1, poll_seconds=0.02) == 1
    assert time.monotonic() - started < 30  # process 0 waited in vain: stopped after the grace
    assert capsys.readouterr().err.strip() == "drmlab: error: process 1 of 2 exited with 3: the reason"
    ranks = [sys.executable, "-c", "import os, sys\nassert os.environ['WORLD_SIZE'] == '3'\n"
             "assert os.environ['OMP_NUM_THREADS'] == '2'\nsys.exit(int(os.environ['RANK']) == 0 and 5)"]  # fmt: skip
    assert launcher.launch(ranks, 3, 2, poll_seconds=0.02) == 5  # process 0 speaks for the run
    assert launcher.exit_code(-signal.SIGTERM) == 143


def _train_argv(corpus_text, out, *extra) -> list[str]:
    return ["train", "--model", "J", "--preset", "micro", "--data", str(corpus_text), "--tokens", "24k",
            "--eval-every", "8k", "--out", str(out), "--quiet", *extra]  # fmt: skip


def _rows(out, kind: str, field: str) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r[field] for r in rows if r.get("kind") == kind]


def _drmlab(argv: list[str], **popen) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("DRMLAB_PROCS", None)
    return subprocess.Popen([sys.executable, "-m", "drmlab", *argv], env=env, text=True, **popen)


@pytest.fixture(scope="module")
def corpus_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"  # paragraphs are the documents of a one-file corpus
    rng = np.random.default_rng(0)
    words = ["the", "state", "moves", "along", "a", "learned", "direction", "under", "metric", "of", "tokens"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 60)) for _ in range(600)))
    return path


@pytest.fixture(scope="module")
def two_process_run(corpus_text, tmp_path_factory):
    out = tmp_path_factory.mktemp("procs") / "two"
    proc = _drmlab(_train_argv(corpus_text, out, "--procs", "2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return out, stdout, stderr


def test_two_processes_train_the_run_of_one_process_to_round_off(two_process_run, corpus_text, tmp_path, capsys):
    out, stdout, stderr = two_process_run
    assert "training on 2 processes of 1 thread each, data-parallel (--procs)" in stderr
    assert stdout.count("val CE") == 1  # process 0 reports the run once
    one = tmp_path / "one"
    assert main([*_train_argv(corpus_text, one), "--threads", "1"]) == 0
    capsys.readouterr()
    summary, single = (json.loads((d / "summary.json").read_text()) for d in (out, one))
    config = json.loads((out / "config.json").read_text())
    assert summary["world_size"] == 2 and config["runtime"]["data_parallel"] == "ddp"
    assert config["runtime"]["threads"] == 1
    # the same batches and steps; only the order of the gradient sum differs (measured: 1e-7 on the loss)
    np.testing.assert_allclose(_rows(out, "train", "loss"), _rows(one, "train", "loss"), rtol=1e-5)
    np.testing.assert_allclose(_rows(out, "eval", "val_ce"), _rows(one, "eval", "val_ce"), rtol=1e-5)
    assert summary["val_ce"] == pytest.approx(single["val_ce"], rel=1e-5)
    assert summary["tokens"] == single["tokens"] and summary["steps"] == single["steps"]


def test_one_sigterm_to_the_launcher_checkpoints_every_process_and_the_resume_ends_as_if_never_stopped(
    two_process_run, corpus_text, tmp_path
):
    finished, _, _ = two_process_run
    out = tmp_path / "stopped"
    argv = _train_argv(corpus_text, out, "--procs", "2")
    proc = _drmlab(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (out / "metrics.jsonl").exists() or len(_rows(out, "train", "loss")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    assert "continue with: drmlab train --resume" in stderr and "process 1 of 2" not in stderr
    stopped_at = len(_rows(out, "train", "loss"))
    assert stopped_at < len(_rows(finished, "train", "loss"))  # stopped mid-run, not at the end
    resumed = _drmlab(
        ["train", "--resume", "--out", str(out), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-3000:]
    assert "training on 2 processes of 1 thread each, data-parallel (as the run was started" in stderr
    # the same two processes and threads: the resumed run ends bit for bit where the uninterrupted one did
    assert _rows(out, "train", "loss") == _rows(finished, "train", "loss")
    end, whole = (json.loads((d / "summary.json").read_text()) for d in (out, finished))
    assert end["val_ce"] == whole["val_ce"] and end["world_size"] == 2
