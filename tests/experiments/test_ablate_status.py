"""``drmlab ablate --status``: where a study stands, read from its folder without writing to it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drmlab.cli import main
from drmlab.experiments.ablate.protocol import Job
from drmlab.experiments.ablate.status import _evals_to_come, hours_left, study_status
from drmlab.runs import LOCK_FILE, RunDir, lock_holder


@pytest.fixture(scope="module")
def study(tmp_path_factory, corpus_file, cache_dir):
    """A micro study of GPT2 (one layer): a sweep of two rates, seed 1 finished, seed 2 stopped after one step."""
    from drmlab.training import trainer

    out = tmp_path_factory.mktemp("status") / "study"
    argv = ["ablate", "--models", "GPT2", "--seeds", "1,2", "--preset", "micro", "--tokens", "1k"]
    argv += ["--lr-grid", "1e-3,2e-3", "--tune-tokens", "512", "--out", str(out), "--data", str(corpus_file)]
    argv += ["--cache-dir", str(cache_dir), "--eval-tokens", "1k", "--quiet", "--set", "GPT2.n_layer=1"]
    real_train, calls = trainer.train, []

    def stop_the_fourth(*args, **kwargs):  # the sweep's two runs, seed 1, then seed 2 stopped after a step
        calls.append(1)
        if len(calls) == 4:
            real_train(*args, **dict(kwargs, stop_after_step=1))
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "train", stop_the_fourth)
        assert main(argv) == 130
    return out


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_each_run_is_done_stopped_or_training_and_nothing_is_written(study, capsys):
    before = _files(study)
    assert main(["ablate", "--status", "--out", str(study)]) == 0
    text = capsys.readouterr().out
    assert _files(study) == before  # a look, not a write
    assert text.splitlines()[0] == f"{study}: 4 runs (2 sweep, 2 paired); 3 done, 1 stopped"
    rows = study_status(study)
    assert [r.state for r in rows] == ["done", "done", "done", "stopped"]
    stopped = rows[-1]
    trained = [m for m in RunDir(study / "runs" / "GPT2-seed2").read_metrics() if m.get("kind") == "train"]
    assert stopped.tokens == trained[-1]["tokens"] and 0 < stopped.tokens < stopped.budget == 1024
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines()[1:-1]}
    share = f"{100 * stopped.tokens / 1024:.0f}%"
    assert (
        f"stopped, its checkpoint at {stopped.tokens:,} of 1,024 tokens ({share}); the next drmlab ablate "
        "resumes it from there"
    ) == lines["[4/4] GPT2 seed 2"].split("  ")[-1]
    assert lines["[1/4] sweep GPT2 lr 0.001"].endswith(
        f"done: CE {rows[0].val_ce:.4f}, {rows[0].tokens_per_s:,.0f} tok/s"
    )

    # held by a live process: this one, through the run's own lock
    lock = RunDir(study / "runs" / "GPT2-seed2").lock()
    try:
        held = study_status(study)[-1]
        assert held.state == "training" and f"process {os.getpid()} on " in held.holder
    finally:
        lock.release()
    assert study_status(study)[-1].state == "stopped"


def test_a_run_killed_past_its_checkpoint_resumes_from_the_checkpoint_and_says_so(study, tmp_path):
    """A process killed without a signal (a machine's end) logged steps after its last checkpoint: the status
    counts from the checkpoint, where a resume goes on, and says how far the lost steps had gone."""
    import json
    import shutil

    copy = tmp_path / "study"
    shutil.copytree(study, copy)
    run = RunDir(copy / "runs" / "GPT2-seed2")
    kept = study_status(copy)[-1].tokens
    assert kept == run.read_pointer()["step"] * 256  # micro: 8 windows of 32 tokens a step
    trained = [m for m in run.read_metrics() if m.get("kind") == "train"]
    later = dict(trained[-1], step=trained[-1]["step"] + 1, tokens=trained[-1]["tokens"] + 256)
    with open(run.metrics_path, "a") as out:
        out.write(json.dumps(later) + "\n")
    stopped = study_status(copy)[-1]
    assert stopped.state == "stopped" and stopped.tokens == kept and stopped.trained_to == kept + 256
    detail = [line for line in _status_lines(copy) if "GPT2 seed 2" in line][0]
    assert f"its checkpoint at {kept:,} of 1,024 tokens" in detail
    assert detail.endswith(f"(it trained to {kept + 256:,} after that checkpoint: those steps are trained again)")
    train, *_ = hours_left(study_status(copy))
    assert train == pytest.approx(hours_left(study_status(study))[0])  # the time left counts the lost steps


def _status_lines(out: Path) -> list[str]:
    from drmlab.experiments.ablate.status import format_status

    return format_status(out, study_status(out)).splitlines()


def test_the_hours_left_are_the_tokens_and_evaluations_left_at_the_models_own_pace(study):
    rows = study_status(study)
    first, stopped = rows[2], rows[3]  # seed 1, the only finished paired run; seed 2, stopped part-way
    (final_eval,) = first.eval_seconds  # no milestones in this study: the final evaluation only
    assert stopped.evals_to_come == 1 and first.evals_to_come == 0
    train, evaluate, no_rate, no_eval = hours_left(rows)
    assert no_rate == no_eval == []
    assert train == pytest.approx((1024 - stopped.tokens) / first.tokens_per_s / 3600)
    assert evaluate == pytest.approx(final_eval / 3600)


def test_a_paired_run_still_has_the_milestones_above_its_tokens_and_its_final_evaluation():
    record = {"train": {"milestones": [1_000_000, 2_000_000]}}
    assert _evals_to_come(record, Job("run", "J", 1), 0) == 3
    assert _evals_to_come(record, Job("run", "J", 1), 1_007_616) == 2  # past the first milestone
    assert _evals_to_come(record, Job("tune", "J", 1e-3), 0) == 1  # a sweep run is scored once, at its end


def test_a_folder_without_a_study_is_one_line(tmp_path, capsys):
    assert main(["ablate", "--status", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no study (study.json is missing)" in err
    assert not (tmp_path / "none").exists()


def test_lock_holder_names_a_live_holder_and_nothing_else(tmp_path):
    path = tmp_path / "run" / LOCK_FILE
    assert lock_holder(path) is None  # no lock file
    lock = RunDir(tmp_path / "run").lock()
    assert f"process {os.getpid()}" in lock_holder(path)
    lock.release()
    assert lock_holder(path) is None  # the file stays, its lock is gone


def test_a_held_run_past_its_budget_is_in_its_final_evaluation():
    from drmlab.experiments.ablate.status import RunStatus, _detail

    job = Job("run", "J", 1)
    assert _detail(RunStatus(job, "training", 1024, 1024, holder="process 7")).startswith(
        "trained, its final evaluation running now"
    )
    assert _detail(RunStatus(job, "training", 1024, 512, holder="process 7")).startswith(
        "training now, 512 of 1,024 tokens (50%)"
    )
