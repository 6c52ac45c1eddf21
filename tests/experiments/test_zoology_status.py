"""``drmlab mqar --protocol zoology --status`` (drmlab.experiments.mqar.zoology_status): each run's state
read from a study folder written by hand, and the hours left on a case worked by hand."""

from __future__ import annotations

import json

import pytest

from drmlab.experiments.mqar import zoology
from drmlab.experiments.mqar import zoology_status as status
from drmlab.runs import POINTER_FILE, RunLock, write_json_atomic

GRID = zoology.LR_GRID
PER_EPOCH = 196  # 100,000 examples in batches of 512 at length 64


@pytest.fixture
def study():
    return zoology.plan_study(["ATTENTION", "MAMBA"], [64], [64], epochs=4, probe_epochs=2)


def _epochs(step_s: float, eval_s: float, accs: list[float]) -> list[dict]:
    return [
        {
            "epoch": e,
            "step": e * PER_EPOCH,
            "loss": 1.0,
            "test_acc": a,
            "train_seconds": PER_EPOCH * step_s,
            "eval_seconds": eval_s,
        }
        for e, a in enumerate(accs, 1)
    ]


def _write(study, out, name, lr, status_, epochs, **extra):
    spec, why = zoology.run_spec(study, name, 64, 64, 4, lr)
    assert why is None
    folder = out / "runs" / zoology.run_name(name, 64, 64, lr)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"model": name, "width": 64, "seq_len": 64, "kv": 4, "lr": lr, "status": status_, "spec": spec}
    write_json_atomic(folder / "result.json", record | {"epochs": epochs, "epochs_run": len(epochs)} | extra)
    return folder


def test_states_and_hours_left_by_hand(study, tmp_path):
    out = tmp_path / "study"
    _write(study, out, "ATTENTION", GRID[0], "probed", _epochs(0.1, 2.0, [0.3, 0.5]))
    _write(study, out, "ATTENTION", GRID[1], "probed", _epochs(0.3, 4.0, [0.6, 0.9]))
    _write(study, out, "ATTENTION", GRID[2], "diverged", [])
    stopped = _write(study, out, "MAMBA", GRID[0], "training", _epochs(0.2, 1.0, [0.1]))
    (stopped / POINTER_FILE).write_text("{}")  # a checkpoint after epoch 1: the next run goes on from it
    (out / "locks").mkdir(parents=True)
    lock = RunLock(out / "locks" / f"{zoology.run_name('MAMBA', 64, 64, GRID[1])}.lock").acquire()
    try:
        rows = status.zoology_status(study, out)
        assert [(r.model, r.lr, r.state, r.epochs) for r in rows] == [
            ("ATTENTION", GRID[0], "probed", 2),
            ("ATTENTION", GRID[1], "probed", 2),
            ("ATTENTION", GRID[2], "diverged", 0),
            ("ATTENTION", GRID[3], "not begun", 0),
            ("MAMBA", GRID[0], "stopped", 1),
            ("MAMBA", GRID[1], "training", 0),
            ("MAMBA", GRID[2], "not begun", 0),
            ("MAMBA", GRID[3], "not begun", 0),
        ]
        assert rows[0].step_seconds == pytest.approx(0.1) and rows[1].eval_seconds == pytest.approx(4.0)
        text = status.format_zoology_status(study, out, rows)
        assert "training now, 0 epochs of 4 done, by process" in text
        assert "stopped after 1 epoch, test acc 10.00%; the same command goes on from there" in text
    finally:
        lock.release()
    hours, untimed = status.zoology_hours_left(study, rows)
    # ATTENTION: the 4th rate's probe (2 epochs at the cell's mean: 0.2 s/step, 3 s/evaluation), then the
    # best rate so far (the 2nd: 0.9) from epoch 2 to 4 at its own 0.3 s and 4 s
    attention = 2 * (PER_EPOCH * 0.2 + 3.0) + 2 * (PER_EPOCH * 0.3 + 4.0)
    # MAMBA: the stopped rate's 2nd probe epoch and the three others' 2 each, at the stopped one's timing,
    # then one rate's last 2 epochs (the probe not over, nothing scored at its end: the first rate stands in)
    mamba = (1 + 2 + 2 + 2 + 2) * (PER_EPOCH * 0.2 + 1.0)
    assert hours == pytest.approx((attention + mamba) / 3600) and untimed == []


def test_a_cell_past_its_probe_counts_only_its_chosen_rate(study, tmp_path):
    out = tmp_path / "study"
    _write(study, out, "ATTENTION", GRID[0], "probed", _epochs(0.1, 2.0, [0.3, 0.5]))
    _write(study, out, "ATTENTION", GRID[1], "probed", _epochs(0.1, 2.0, [0.6, 0.9]))
    _write(study, out, "ATTENTION", GRID[2], "probed", _epochs(0.1, 2.0, [0.6, 0.95]))
    _write(study, out, "ATTENTION", GRID[3], "done", _epochs(0.1, 2.0, [0.995]), early_stopped=True)
    rows = status.zoology_status(study, out)
    hours, untimed = status.zoology_hours_left(study, rows)
    # the early stop at 0.995 within the probe wins the cell and is done: nothing left of ATTENTION
    assert untimed == ["MAMBA w64 L64"] and hours == 0
    _write(study, out, "ATTENTION", GRID[3], "probed", _epochs(0.1, 2.0, [0.2, 0.4]))
    hours, _ = status.zoology_hours_left(study, status.zoology_status(study, out))
    assert hours == pytest.approx(2 * (PER_EPOCH * 0.1 + 2.0) / 3600)  # the 3rd rate (0.95) goes on to 4


def test_a_result_of_other_settings_is_named(study, tmp_path):
    out = tmp_path / "study"
    folder = _write(study, out, "ATTENTION", GRID[0], "done", _epochs(0.1, 2.0, [0.5] * 4))
    record = json.loads((folder / "result.json").read_text())
    record["spec"]["epochs"] = 64
    (folder / "result.json").write_text(json.dumps(record))
    (row, *_) = status.zoology_status(study, out)
    assert row.state == "other settings"


def test_cli_status_writes_nothing_and_refuses_an_empty_folder(study, tmp_path, capsys):
    from drmlab.cli import main

    out = tmp_path / "study"
    _write(study, out, "ATTENTION", GRID[0], "probed", _epochs(0.1, 2.0, [0.3, 0.5]))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    argv = ["mqar", "--protocol", "zoology", "--models", "ATTENTION,MAMBA", "--widths", "64", "--seq-lens", "64"]
    argv += ["--epochs", "4", "--probe-epochs", "2", "--out", str(out), "--status"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "8 runs; 1 probed, 7 not begun" in printed and "probed after 2 epochs, test acc 50.00%" in printed
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert main([*argv[:-3], "--out", str(tmp_path / "nothing"), "--status"]) == 2
    err = capsys.readouterr().err
    assert "holds no Zoology study" in err and err.count("\n") == 1


def test_a_result_written_before_a_train_setting_existed_is_still_the_same_run(study, tmp_path):
    """A committed run stays reusable when TrainConfig grows: a setting missing from its spec takes its
    default; a setting it recorded with another value still makes it a run of other settings."""
    from drmlab.experiments.mqar.zoology_probe import finished_for, same_spec

    spec, _ = zoology.run_spec(study, "ATTENTION", 64, 64, 4, GRID[0])
    older = json.loads(json.dumps(spec))
    added = [k for k, v in spec["train"].items() if v is None][0]  # a setting whose default is None
    del older["train"][added]
    saved = {"spec": older, "status": "done"}
    assert older != spec and same_spec(saved, spec) and finished_for(saved, spec, 4)
    older["train"]["weight_decay"] = 0.5
    assert not same_spec(saved, spec) and not finished_for(saved, spec, 4)
    assert not same_spec(None, spec)
