"""Learning-rate sweeps in the study protocols: the grid, the choice and its edge flag, the held-out
tuning slice, paired runs at each model's chosen rate, resuming, and two processes sharing a study."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate import protocol as ablate
from drmlab.experiments.spec import Runtime, StudySpec


def test_parse_lr_grid():
    assert lr_sweep.parse_lr_grid("4e-3, 5e-4,1e-3") == [5e-4, 1e-3, 4e-3]
    assert lr_sweep.parse_lr_grid([2e-3, 1e-3]) == [1e-3, 2e-3]
    for bad, text in [
        ("1e-3", "at least two"),
        ("1e-3,x", "comma-separated"),
        ("1e-3,1e-3", "twice"),
        ("1e-3,-1", "above 0"),
        ("1e-3,nan", "finite"),
        ([1e-3, True], "numbers"),
    ]:
        with pytest.raises(ValueError, match=text):
            lr_sweep.parse_lr_grid(bad)


def test_lr_label_is_exact():
    for lr in (5e-4, 1e-3, 2e-3, 4e-3, 1.0 / 3, 1e3):
        assert float(lr_sweep.lr_label(lr)) == lr
    assert lr_sweep.lr_label(5e-4) == "0.0005"


def test_choose_flags_the_edges_and_skips_diverged_rates():
    inside = lr_sweep.choose({1e-3: 2.1, 2e-3: 2.0, 4e-3: 2.2})
    assert inside == {"lr": 2e-3, "edge": False, "edge_side": None, "diverged": []}
    low = lr_sweep.choose({1e-3: 1.9, 2e-3: 2.0, 4e-3: None})
    assert low["lr"] == 1e-3 and low["edge"] and low["edge_side"] == "low" and low["diverged"] == [4e-3]
    high = lr_sweep.choose({1e-3: 2.1, 2e-3: 2.0, 4e-3: 1.95})
    assert high["edge_side"] == "high"
    assert lr_sweep.choose({1e-3: 2.0, 2e-3: 2.0})["lr"] == 1e-3  # a tie goes to the smaller rate
    assert lr_sweep.choose({1e-3: 0.5, 2e-3: 0.7}, lower_is_better=False)["lr"] == 2e-3
    assert lr_sweep.choose({1e-3: None, 2e-3: float("nan")}) == {
        "lr": None,
        "edge": False,
        "edge_side": None,
        "diverged": [1e-3, 2e-3],
    }


def test_tuning_split_holds_out_the_end_of_train():
    train = np.arange(1000)
    fit, heldout = lr_sweep.tuning_split(train, tokens=300)
    assert len(heldout) == 100 and (heldout == train[-100:]).all() and (fit == train[:-100]).all()  # 10% cap
    fit, heldout = lr_sweep.tuning_split(train, tokens=50)
    assert len(heldout) == 50 and len(fit) == 950
    with pytest.raises(ValueError, match="too small"):
        lr_sweep.tuning_split(np.arange(10))


def _run(corpus_file, tmp_path, out, *, log=None, wait_seconds=30.0, sweep_only=False, leave_held=False, **kw):
    options = dict(
        models=["SSM_CONTROL", "GPT2"],
        seeds=[1, 2],
        preset="micro",
        tokens="1k",
        train={"eval_tokens": "1k", "divergence_steps": 1},
        model_settings={"GPT2": {"n_layer": 1}},
        data=str(corpus_file),
        lr_grid="1e-3,3e-2,1e4",
        tune_tokens="512",
    )
    options.update(kw)
    runtime = Runtime(cache_dir=str(tmp_path / "cache"), log=log, wait_seconds=wait_seconds, leave_held=leave_held)
    return ablate.run_study(StudySpec(**options), runtime, out, sweep_only=sweep_only)


def test_sweep_then_paired_runs_at_the_chosen_rate(corpus_file, tmp_path, monkeypatch):
    out = tmp_path / "study"
    results = _run(corpus_file, tmp_path, out)
    sweeps = results["lr_sweep"]
    assert set(sweeps) == {"SSM_CONTROL", "GPT2"}
    for model, sweep in sweeps.items():
        assert sweep["complete"] and set(sweep["scores"]) == {"0.001", "0.03", "10000"}
        assert sweep["scores"]["10000"] is None and sweep["diverged"] == [1e4]  # lr 1e4 blows up
        assert sweep["lr"] == lr_sweep.choose({float(k): v for k, v in sweep["scores"].items()})["lr"]
        assert results["models"][model]["lr"] == sweep["lr"]
        tuning = json.loads((ablate.tuning_dir(out, model, 1e-3) / "config.json").read_text())
        assert tuning["train"]["lr"] == 1e-3 and tuning["train"]["tokens"] == 512 and tuning["train"]["seed"] == 1
        split = tuning["data"]["tuning_split"]
        assert (
            split["heldout_tokens"] > 0
            and split["train_tokens"] + split["heldout_tokens"] == tuning["data"]["train_tokens"]
        )
        for seed in (1, 2):  # the paired runs use the chosen rate and the study's budget
            config = json.loads((ablate.run_dir(out, model, seed) / "config.json").read_text())
            assert config["train"]["lr"] == sweep["lr"] and config["train"]["tokens"] == 1000
    # the tuning score is the rescoring of the held-out end of the training split, not of the validation split
    from drmlab.data import load_corpus
    from drmlab.evaluation import rescore
    from drmlab.runs import load_run_model

    corpus = load_corpus(source=str(corpus_file), cache_dir=str(tmp_path / "cache"))
    tuned = ablate.tuning_dir(out, "GPT2", sweeps["GPT2"]["lr"])
    model, config, _ = load_run_model(tuned)
    heldout = lr_sweep.tuning_split(corpus.train)[1]
    score = json.loads((tuned / "summary.json").read_text())["val_ce"]
    seq_len = config["train"]["seq_len"]
    assert rescore(model, heldout, seq_len, max_targets=1000)["ce"] == pytest.approx(score, abs=1e-6)
    assert rescore(model, corpus.val, seq_len, max_targets=1000)["ce"] != pytest.approx(score, abs=1e-3)
    text = (out / "results.md").read_text()
    assert "## Learning-rate sweep" in text and "diverged" in text and (out / "lr_sweep.png").stat().st_size > 0

    # a rerun trains nothing; a changed grid is refused
    from drmlab.training import trainer

    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("a finished study trained again"))
    again = _run(corpus_file, tmp_path, out)
    assert again["lr_sweep"] == sweeps
    with pytest.raises(ValueError, match="can change only before the first paired run"):
        _run(corpus_file, tmp_path, out, lr_grid="1e-3,2e-3")


def test_the_grid_may_grow_before_the_paired_runs_start(corpus_file, tmp_path, monkeypatch):
    from drmlab.training import trainer

    out = tmp_path / "study"
    real_train, calls = trainer.train, []

    def stop_at_paired_runs(*args, **kwargs):
        if "runs" in str(args[4] if len(args) > 4 else kwargs.get("out_dir")):
            raise KeyboardInterrupt
        calls.append(args[3].lr)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", stop_at_paired_runs)
    with pytest.raises(KeyboardInterrupt):
        _run(corpus_file, tmp_path, out, models=["GPT2"], lr_grid="1e-3,3e-2")
    assert calls == [1e-3, 3e-2]
    monkeypatch.setattr(trainer, "train", real_train)
    results = _run(corpus_file, tmp_path, out, models=["GPT2"], lr_grid="1e-3,3e-2,1e-1")  # only 1e-1 trains now
    assert set(results["lr_sweep"]["GPT2"]["scores"]) == {"0.001", "0.03", "0.1"} and results["complete"]
    assert json.loads((out / "study.json").read_text())["lr_grid"] == [1e-3, 3e-2, 1e-1]


def test_a_process_whose_grid_was_changed_by_another_stops(corpus_file, tmp_path, monkeypatch):
    """Two processes must never choose a model's rate from two different grids."""
    from drmlab.runs import read_json, write_json_atomic
    from drmlab.training import trainer

    out = tmp_path / "study"
    real_train = trainer.train

    def regrid_during_the_sweep(*args, **kwargs):
        summary = real_train(*args, **kwargs)
        record = read_json(out / "study.json")
        write_json_atomic(out / "study.json", dict(record, lr_grid=[1e-3, 3e-2, 1e-1]))  # "another process"
        return summary

    monkeypatch.setattr(trainer, "train", regrid_during_the_sweep)
    with pytest.raises(ValueError, match="another process changed the lr grid"):
        _run(corpus_file, tmp_path, out, models=["GPT2"], seeds=[1], lr_grid="1e-3,3e-2")
    assert not ablate.run_dir(out, "GPT2", 1).exists()


def test_every_rate_diverging_leaves_the_model_without_runs(corpus_file, tmp_path):
    out = tmp_path / "study"
    lines = []
    results = _run(corpus_file, tmp_path, out, models=["GPT2"], lr_grid="1e4,1e5", log=lines.append)
    assert results["lr_sweep"]["GPT2"]["lr"] is None and results["runs"] == [] and not results["complete"]
    assert any("every rate of its sweep diverged" in line for line in lines)
    assert "none (every rate diverged)" in (out / "results.md").read_text()


def test_plan_errors():
    with pytest.raises(ValueError, match="not both"):
        ablate.plan_study(StudySpec(models=["J"], seeds=[1], preset="micro", train={"lr": 1e-3}, lr_grid="1e-3,2e-3"))
    with pytest.raises(ValueError, match="give lr_grid too"):
        ablate.plan_study(StudySpec(models=["J"], seeds=[1], preset="micro", tune_tokens="1k"))
    with pytest.raises(ValueError, match="at least two"):
        ablate.plan_study(StudySpec(models=["J"], seeds=[1], preset="micro", lr_grid="1e-3"))


def test_a_second_process_takes_what_the_first_does_not_hold(corpus_file, tmp_path):
    """A run locked by someone else is left to them; the study waits for it and then finishes."""
    from drmlab.runs import RunDir

    out = tmp_path / "study"
    held = RunDir(ablate.tuning_dir(out, "GPT2", 1e-3))
    held.create()
    lock = held.lock()  # another "process" is training this sweep run
    lines = []
    worker = threading.Thread(
        target=lambda: lines.append(
            _run(
                corpus_file,
                tmp_path,
                out,
                models=["SSM_CONTROL", "GPT2"],
                seeds=[1],
                lr_grid="1e-3,3e-2",
                log=lines.append,
                wait_seconds=0.05,
            )
        )
    )
    try:
        worker.start()
        ssm_run = ablate.run_dir(out, "SSM_CONTROL", 1)
        deadline = time.monotonic() + 120
        while RunDir(ssm_run).finished_summary() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # everything it could do is done; GPT2's paired run waits for the held sweep run
        assert RunDir(ssm_run).finished_summary() is not None
        assert RunDir(ablate.tuning_dir(out, "GPT2", 3e-2)).finished_summary() is not None
        assert not held.has_config() and not ablate.run_dir(out, "GPT2", 1).exists()
        assert any("held by another process" in str(line) for line in lines)
    finally:
        lock.release()
    worker.join(timeout=120)
    assert not worker.is_alive()
    results = lines[-1]
    assert results["complete"] and results["lr_sweep"]["GPT2"]["complete"]


def test_leave_held_exits_once_the_rest_is_held_and_the_holder_finishes_it(corpus_file, tmp_path):
    """--leave-held: the process does everything not held, then returns None at once (no waiting, no
    report) while GPT2's paired run still waits on the held sweep run; the study then finishes as usual."""
    from drmlab.runs import RunDir

    out = tmp_path / "study"
    held = RunDir(ablate.tuning_dir(out, "GPT2", 1e-3))
    held.create()
    lock = held.lock()
    lines = []
    options = dict(models=["SSM_CONTROL", "GPT2"], seeds=[1], lr_grid="1e-3,3e-2", log=lines.append)
    try:
        t0 = time.monotonic()
        left = _run(corpus_file, tmp_path, out, wait_seconds=600, leave_held=True, **options)
        assert left is None and time.monotonic() - t0 < 300  # it did not wait the 600 s
        assert RunDir(ablate.run_dir(out, "SSM_CONTROL", 1)).finished_summary() is not None
        assert RunDir(ablate.tuning_dir(out, "GPT2", 3e-2)).finished_summary() is not None
        assert not ablate.run_dir(out, "GPT2", 1).exists() and not (out / "results.json").exists()
        assert "2 runs left, each held by another process or waiting on runs one holds" in lines[-1]
    finally:
        lock.release()
    results = _run(corpus_file, tmp_path, out, wait_seconds=0.05, leave_held=True, **options)
    assert results["complete"] and results["lr_sweep"]["GPT2"]["complete"]


def test_mqar_sweeps_each_model_on_held_out_training_sequences(tmp_path):
    from drmlab.experiments.mqar import study as mqar
    from drmlab.experiments.mqar.task import train_set

    options = dict(
        preset="micro",
        width=16,
        steps=3,
        batch_size=8,
        n_train=40,
        n_test=16,
        lr_grid="1e-3,3e-2,1e4",
        settings={"divergence_steps": 1},
    )
    spec = mqar.MQARSpec(models=["GPT2"], kvs=[2], seeds=[0, 1], **options)
    summary = mqar.run_study(spec, Runtime(), tmp_path / "mq")
    sweep = summary["lr_sweep"]["GPT2 kv=2"]
    assert sweep["scores"]["10000"] is None and sweep["diverged"] == [1e4]
    assert (
        sweep["lr"] == lr_sweep.choose({float(k): v for k, v in sweep["scores"].items()}, lower_is_better=False)["lr"]
    )
    assert [r["lr"] for r in summary["runs"]] == [sweep["lr"], sweep["lr"]]
    assert summary["models"]["GPT2"]["cells"]["2"]["lr"] == sweep["lr"]
    # the sweep's held-out sequences are the last tenth of the first seed's training set, never its test set
    task = mqar.plan_study(spec.replace(seeds=[0], lr_grid=None)).task(2)
    (fit_x, _), (held_x, _) = mqar.tuning_sets(task, 0)
    x, _ = train_set(task, 0)
    assert len(held_x) == 4 and (held_x == x[-4:]).all() and (fit_x == x[:-4]).all()
    tuned = json.loads((tmp_path / "mq" / "tuning" / "GPT2_kv2_lr0.001" / "result.json").read_text())
    assert tuned["test_queries"] == 4 * task.n_queries and tuned["spec"]["tuning"] is True
    assert "## Learning-rate sweep" in (tmp_path / "mq" / "mqar.md").read_text()
    with pytest.raises(ValueError, match="not both"):
        mqar.plan_study(mqar.MQARSpec(models=["GPT2"], kvs=[2], seeds=[0], settings={"lr": 1e-3}, lr_grid="1e-3,2e-3"))


def test_sweep_only_stops_before_the_paired_runs_and_the_same_study_goes_on(corpus_file, tmp_path, monkeypatch):
    out = tmp_path / "study"
    results = _run(corpus_file, tmp_path, out, models=["GPT2"], lr_grid="1e-3,3e-2", sweep_only=True)
    assert results["lr_sweep"]["GPT2"]["complete"] and not results["models"] and not (out / "runs").exists()
    text = (out / "results.md").read_text()
    assert "No paired run has finished yet" in text and "## Learning-rate sweep" in text and "curves.png" not in text
    chosen = results["lr_sweep"]["GPT2"]["lr"]
    from drmlab.training import trainer

    real_train, calls = trainer.train, []
    monkeypatch.setattr(trainer, "train", lambda *a, **k: calls.append(a[3].lr) or real_train(*a, **k))
    again = _run(corpus_file, tmp_path, out, models=["GPT2"], lr_grid="1e-3,3e-2")  # the sweep is not retrained
    assert calls == [chosen, chosen] and again["complete"] and again["models"]["GPT2"]["lr"] == chosen
    with pytest.raises(ValueError, match="sweep_only needs an lr grid"):
        _run(corpus_file, tmp_path, tmp_path / "other", lr_grid=None, tune_tokens=None, sweep_only=True)
    assert not (tmp_path / "other").exists()  # refused before anything is written


def test_cli_sweep_only_needs_a_grid(capsys):
    from drmlab.cli import main

    assert main(["ablate", "--models", "GPT2", "--sweep-only"]) == 2
    assert "--sweep-only needs --lr-grid" in capsys.readouterr().err


def test_each_model_at_a_rate_given_per_model(corpus_file, tmp_path, capsys):
    """``rates`` (drmlab ablate --lr-from RESULTS_JSON): the paired runs of each model at its own given rate,
    no sweep; recorded in study.json, so a rerun with other rates is refused."""
    out = tmp_path / "study"
    rates = {"SSM_CONTROL": 2e-3, "GPT2": 5e-4}
    results = _run(corpus_file, tmp_path, out, seeds=[1], lr_grid=None, tune_tokens=None, rates=rates)
    for model, lr in rates.items():
        config = json.loads((ablate.run_dir(out, model, 1) / "config.json").read_text())
        assert config["train"]["lr"] == lr and results["models"][model]["lr"] == lr
    assert json.loads((out / "study.json").read_text())["rates"] == rates and not (out / "tuning").exists()
    with pytest.raises(ValueError, match="rates: "):
        _run(corpus_file, tmp_path, out, seeds=[1], lr_grid=None, tune_tokens=None, rates=dict(rates, GPT2=1e-3))
    with pytest.raises(ValueError, match="none now"):
        _run(corpus_file, tmp_path, out, seeds=[1], lr_grid=None, tune_tokens=None, train={"eval_tokens": "1k"})
    for bad, text in [
        ({"SSM_CONTROL": 1e-3}, "none for GPT2"),
        ({**rates, "MAMBA": 1e-3}, "MAMBA not among the models"),
        ({**rates, "GPT2": float("nan")}, "GPT2's rate must be a finite number above 0"),
    ]:
        with pytest.raises(ValueError, match=text):
            ablate.plan_study(StudySpec(models=["SSM_CONTROL", "GPT2"], preset="micro", rates=bad))
    with pytest.raises(ValueError, match="give one of"):
        ablate.plan_study(StudySpec(models=["GPT2"], preset="micro", rates={"GPT2": 1e-3}, lr_grid="1e-3,2e-3"))

    # the CLI reads the rates another study chose; a model that study did not train is one line
    from drmlab.cli import main

    base = ["ablate", "--preset", "micro", "--seeds", "1", "--tokens", "1k", "--data", str(corpus_file)]
    base += ["--set", "eval_tokens=1k", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    again = tmp_path / "again"
    cli = [*base, "--models", "SSM_CONTROL,GPT2", "--set", "GPT2.n_layer=1", "--lr-from", str(out / "results.json")]
    cli += ["--out", str(again)]
    assert main(cli) == 0
    assert json.loads((again / "study.json").read_text())["rates"] == rates
    capsys.readouterr()
    assert main([*base, "--models", "MAMBA", "--lr-from", str(out / "results.json"), "--out", str(tmp_path / "m")]) != 0
    err = capsys.readouterr().err.strip()
    assert "no chosen rate for MAMBA" in err and len(err.splitlines()) == 1
    # rates chosen under the reference recipe do not carry over to the field's: refused, naming both
    field = [*cli[:-1], str(tmp_path / "field"), "--recipe", "field"]
    assert main(field) == 2
    err = capsys.readouterr().err.strip()
    assert "chosen under recipe 'reference', this study trains under 'field'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "field").exists()
