"""Moving a study to another machine (``drmlab ablate --restore``): a study restored from its collected
results.json collects to the same numbers, trains nothing it had finished, and trains what it had not."""

from __future__ import annotations

import json
import shutil

import pytest

from drmlab.cli import main
from drmlab.experiments.ablate import protocol as ablate
from drmlab.experiments.ablate.restore import restore_study
from drmlab.experiments.spec import Runtime, StudySpec


def _spec(corpus_file, seeds=(1, 2)) -> StudySpec:
    return StudySpec(
        models=["SSM_CONTROL", "GPT2"],
        seeds=list(seeds),
        preset="micro",
        tokens="1k",
        train={"eval_tokens": "1k", "divergence_steps": 1, "eval_every": 256, "milestones": [512]},
        model_settings={"GPT2": {"n_layer": 1}},
        data=str(corpus_file),
        lr_grid="1e-3,3e-2,1e4",  # 1e4 diverges: a restored sweep keeps it diverged
        tune_tokens="512",
    )


def _numbers(results: dict) -> dict:
    """The numbers of a study's results, as its results.json holds them (JSON's keys and lists)."""
    return json.loads(json.dumps({k: results[k] for k in ("study", "models", "runs", "gate", "complete", "lr_sweep")}))


@pytest.fixture(scope="module")
def finished(corpus_file, tmp_path_factory):
    """A finished study and its collected record, as the first machine leaves them."""
    out = tmp_path_factory.mktemp("first") / "study"
    runtime = Runtime(cache_dir=str(out.parent / "cache"))
    results = ablate.run_study(_spec(corpus_file), runtime, out)
    assert results["complete"] and all(r["milestones"] and r["curves"]["eval"]["val_ce"] for r in results["runs"])
    # each run's wall time: its steps, its milestone and final evaluations
    assert all(r["wall_seconds"] > r["train_seconds"] > 0 for r in results["runs"])
    # and each evaluation's seconds: the milestone's (512 tokens), then the final one's
    assert all(len(r["eval_seconds"]) == 2 and min(r["eval_seconds"]) > 0 for r in results["runs"])
    return out, json.loads((out / "results.json").read_text())


def test_a_restored_study_collects_to_the_record_and_trains_nothing(corpus_file, finished, tmp_path, monkeypatch):
    _, record = finished
    out = tmp_path / "moved"
    counts = restore_study(record, out)
    assert counts == {"restored": 4 + 2 * 3, "kept": 0, "left": 0}  # 4 paired runs, 2 models x 3 rates
    assert _numbers(ablate.collect_results(out)) == _numbers(record)
    assert not list(out.rglob("checkpoints"))  # a restored run has nothing to resume from

    from drmlab.training import trainer

    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("a restored run trained again"))
    lines = []
    again = ablate.run_study(_spec(corpus_file), Runtime(cache_dir=str(tmp_path / "cache"), log=lines.append), out)
    assert _numbers(again) == _numbers(record)
    assert restore_study(record, out) == {"restored": 0, "kept": 4 + 2 * 2, "left": 2}  # the diverged: left


def test_a_restored_study_times_its_evaluations_still_to_come(corpus_file, finished, tmp_path):
    """--status after --restore counts the evaluations left at the first machine's evaluation times."""
    from drmlab.experiments.ablate.status import eval_seconds, study_status

    _, record = finished
    out = tmp_path / "moved"
    restore_study(dict(record, runs=[r for r in record["runs"] if r["seed"] == 1]), out)
    rows = study_status(out)
    restored = {(r.job.model, r.job.value): r.eval_seconds for r in rows if r.state == "done" and not r.job.tuning}
    assert restored == {(r["model"], 1): tuple(r["eval_seconds"]) for r in record["runs"] if r["seed"] == 1}
    timed = eval_seconds(rows)
    for model in ("SSM_CONTROL", "GPT2"):  # each model's mean over its restored evaluations
        mine = [s for r in record["runs"] if r["model"] == model and r["seed"] == 1 for s in r["eval_seconds"]]
        assert timed[(model, False)] == pytest.approx(sum(mine) / len(mine))


def test_what_the_record_had_not_finished_trains_on_the_new_machine(corpus_file, finished, tmp_path):
    _, record = finished
    partial = dict(record, runs=[r for r in record["runs"] if r["seed"] == 1])  # seed 2 not finished there
    out = tmp_path / "moved"
    assert restore_study(partial, out)["restored"] == 2 + 2 * 3
    results = ablate.run_study(_spec(corpus_file), Runtime(cache_dir=str(tmp_path / "cache")), out)
    assert results["complete"]
    restored = {(r["model"], r["seed"]) for r in results["runs"] if r["seed"] == 1}
    assert {(r["model"], r["seed"]): r["val_ce"] for r in results["runs"]} == {
        (r["model"], r["seed"]): r["val_ce"] for r in record["runs"]
    }  # the batches and inits are the seed's: seed 2 trained here gives the first machine's numbers
    assert restored == {("SSM_CONTROL", 1), ("GPT2", 1)}
    assert (ablate.run_dir(out, "GPT2", 2) / "checkpoints").is_dir()


def test_cli_restore_errors_are_one_line(corpus_file, finished, tmp_path, capsys):
    first, record = finished
    base = ["ablate", "--models", "SSM_CONTROL,GPT2", "--preset", "micro", "--out", str(tmp_path / "s")]
    assert main([*base, "--restore", str(tmp_path / "missing.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert "missing.json" in err and "does not exist" in err and len(err.splitlines()) == 1
    not_a_study = tmp_path / "other.json"
    not_a_study.write_text(json.dumps({"title": "a benchmark", "presets": []}))
    assert main([*base, "--restore", str(not_a_study)]) != 0
    err = capsys.readouterr().err.strip()
    assert "not the results.json of an ablation study" in err and len(err.splitlines()) == 1
    other = tmp_path / "other-study"
    shutil.copytree(first, other, ignore=shutil.ignore_patterns("runs", "tuning"))
    changed = dict(record, study=dict(record["study"], seeds=[7]))
    with pytest.raises(
        ValueError, match=r"records a different study than the results \(seeds differ\).*without --restore"
    ):
        restore_study(changed, other)
