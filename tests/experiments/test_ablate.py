"""The paired ablation protocol: the gate, same batches across models, outputs, resuming."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from drmlab.experiments.stats import gate, mean_std


def test_gate_follows_the_reference_rule():
    base = {1: 1.806133, 2: 1.814285, 3: 1.799135}  # SSM_CONTROL, section 8.2
    j = {1: 1.761031, 2: 1.764080, 3: 1.756632}
    g = gate(j, base)
    assert g["promoted"] and g["wins"] == 3 and g["gain"] == pytest.approx(0.045937, abs=1e-6)
    assert mean_std(list(j.values()))[1] == pytest.approx(0.003057, abs=1e-6)  # population std
    assert not gate(base, j)["promoted"]
    small = gate({1: 1.0, 2: 1.0, 3: 1.0}, {1: 1.004, 2: 1.004, 3: 1.004})
    assert not small["promoted"] and "mean gain" in small["reasons"][0]
    two_wins = gate({1: 1.0, 2: 1.0, 3: 1.06}, {1: 1.1, 2: 1.1, 3: 1.05})
    assert two_wins["wins"] == 2 and two_wins["promoted"]
    one_win = gate({1: 0.5, 2: 1.2, 3: 1.2}, {1: 1.1, 2: 1.1, 3: 1.1})
    assert not one_win["promoted"] and any("wins 1 of 3" in r for r in one_win["reasons"])
    noisy = gate({1: 0.9, 2: 1.0, 3: 0.95}, {1: 1.1, 2: 1.1, 3: 1.1})
    assert not noisy["promoted"] and any("std" in r for r in noisy["reasons"])
    assert not gate({1: 0.5, 2: 0.5}, {1: 1.0, 2: 1.0})["promoted"]  # needs 3 seeds


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(
        "\n\n".join((stdlib / n).read_text() for n in ("textwrap.py", "bisect.py", "colorsys.py", "keyword.py"))
    )
    return path


def test_study_runs_resumes_and_writes_results(corpus_file, tmp_path, monkeypatch, capsys):
    from drmlab.cli import main

    out = tmp_path / "study"
    argv = [
        "ablate",
        "--models",
        "GPT2,J",
        "--seeds",
        "1,2,3",
        "--preset",
        "micro",
        "--tokens",
        "1k",
        "--out",
        str(out),
        "--data",
        str(corpus_file),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--eval-tokens",
        "2k",
        "--quiet",
        "--set",
        "GPT2.n_layer=1",
        "--set",
        "eval_every=512",
    ]

    # Interrupt the third run half-way: its checkpoint stays, the study stops.
    from drmlab.training import trainer

    calls = []
    real_train = trainer.train

    def flaky_train(*args, **kwargs):
        calls.append(kwargs.get("resume"))
        if len(calls) == 3:
            real_train(*args, **dict(kwargs, stop_after_step=2))
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", flaky_train)
    assert main(argv) == 130  # an interrupt ends the command with 130 and one line, no traceback
    assert "interrupted" in capsys.readouterr().err
    first_summary = (out / "runs" / "GPT2-seed1" / "summary.json").stat().st_mtime_ns
    monkeypatch.setattr(trainer, "train", real_train)
    calls.clear()

    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("skipped") == 2 and "GPT2 seed 2: resuming" in err
    assert (out / "runs" / "GPT2-seed1" / "summary.json").stat().st_mtime_ns == first_summary

    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and len(results["runs"]) == 6
    for name in ("results.md", "results.csv", "curves.png", "seeds.png"):
        assert (out / name).is_file(), name
    assert set(results["models"]) == {"GPT2", "J"}
    assert results["models"]["GPT2"]["n_seeds"] == 3
    assert {(g["candidate"], g["baseline"]) for g in results["gate"]} == {("GPT2", "J"), ("J", "GPT2")}
    md = (out / "results.md").read_text()
    assert "Promotion gate" in md and "+-" in md
    assert len((out / "results.csv").read_text().strip().splitlines()) == 7

    # The same batches for every model of a seed: the configs differ only in the model.
    configs = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/config.json")}
    assert configs["GPT2-seed1"]["train"] == configs["J-seed1"]["train"]
    assert configs["GPT2-seed1"]["overrides"] == {"n_layer": 1} and configs["J-seed1"]["overrides"] == {}
    # The resumed run equals an uninterrupted one (bit-exact resume): compare with a fresh study of that run.
    fresh = tmp_path / "fresh"
    single = list(argv)
    single[single.index("GPT2,J")] = "GPT2"
    single[single.index("1,2,3")] = "2"
    single[single.index(str(out))] = str(fresh)
    assert main(single) == 0
    again = json.loads((fresh / "results.json").read_text())["runs"][0]
    resumed = next(r for r in results["runs"] if r["model"] == "GPT2" and r["seed"] == 2)
    assert again["val_ce"] == resumed["val_ce"]

    # A rerun with another budget is refused.
    bad = list(argv)
    bad[bad.index("1k")] = "2k"
    assert main(bad) == 2
    assert "other settings" in capsys.readouterr().err
    # ... and so is a setting for a model whose runs have started without it
    assert main([*argv, "--set", "J.d_state=16"]) == 2
    assert "J settings: none in the study, {'d_state': 16} now (its runs have started)" in capsys.readouterr().err
    # ... and a study run before --fast put the memory's products in bf16 says how to continue it as it ran
    assert main([*argv, "--set", "bf16_memory_products=true"]) == 2
    err = capsys.readouterr().err
    assert "bf16_memory_products: False in the study, True now" in err
    assert "--set bf16_memory_products=false continues the study as it ran" in err


def test_bad_arguments(corpus_file, tmp_path, capsys):
    from drmlab.cli import main

    base = [
        "ablate",
        "--preset",
        "micro",
        "--out",
        str(tmp_path),
        "--data",
        str(corpus_file),
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main(base + ["--models", "J,GTP2"]) == 2
    assert "did you mean 'GPT2'" in capsys.readouterr().err
    assert main(base + ["--models", "J", "--set", "J.d_stat=3"]) == 2
    assert "did you mean 'd_state'" in capsys.readouterr().err
    assert main(base + ["--models", "J", "--set", "X.d_state=3"]) == 2
    assert main(base + ["--models", "J", "--seeds", "1,a"]) == 2
    assert main(base + ["--models", "J,LOOPED:Q"]) == 2
    assert "unknown LOOPED arm 'Q'" in capsys.readouterr().err


def test_a_named_arm_is_its_own_row(corpus_file, tmp_path):
    """``LOOPED:B`` trains LOOPED's arm B under the label LOOPED:B (run folder LOOPED-B-seedS)."""
    from drmlab.cli import main

    out = tmp_path / "study"
    assert (
        main(
            [
                "ablate",
                "--models",
                "LOOPED:B,LOOPED",
                "--seeds",
                "1",
                "--preset",
                "micro",
                "--tokens",
                "256",
                "--out",
                str(out),
                "--data",
                str(corpus_file),
                "--cache-dir",
                str(tmp_path / "c"),
                "--eval-tokens",
                "512",
                "--quiet",
            ]
        )
        == 0
    )
    config = json.loads((out / "runs" / "LOOPED-B-seed1" / "config.json").read_text())
    assert config["model"] == "LOOPED" and config["label"] == "LOOPED:B" and config["overrides"] == {"arm": "B"}
    assert config["model_config"]["eps"] == 1.0
    default = json.loads((out / "runs" / "LOOPED-seed1" / "config.json").read_text())
    assert default["overrides"] == {} and default["model_config"]["eps"] == "1/N"
    results = json.loads((out / "results.json").read_text())
    assert set(results["models"]) == {"LOOPED:B", "LOOPED"}


def test_the_study_runs_from_python_with_plain_arguments(corpus_file, tmp_path, capsys):
    """ablate.run_study takes a StudySpec and a Runtime (no flags) and gives the numbers the command line gives."""
    from drmlab.cli import main
    from drmlab.experiments.ablate import protocol as ablate
    from drmlab.experiments.spec import Runtime, StudySpec

    data = dict(data=str(corpus_file), cache_dir=str(tmp_path / "c"))
    spec = StudySpec(
        models=["GPT2", "LOOPED:B"],
        seeds=[1],
        preset="micro",
        tokens="256",
        train={"eval_tokens": 512},
        model_settings={"GPT2": {"n_layer": 1}},
        data=data["data"],
    )
    results = ablate.run_study(spec, Runtime(cache_dir=data["cache_dir"]), tmp_path / "py")
    assert capsys.readouterr().out == ""  # nothing below the command line prints
    assert results["complete"] and set(results["models"]) == {"GPT2", "LOOPED:B"}
    assert (
        main(
            [
                "ablate",
                "--models",
                "GPT2,LOOPED:B",
                "--seeds",
                "1",
                "--preset",
                "micro",
                "--tokens",
                "256",
                "--eval-tokens",
                "512",
                "--set",
                "GPT2.n_layer=1",
                "--out",
                str(tmp_path / "cli"),
                "--quiet",
                "--data",
                data["data"],
                "--cache-dir",
                data["cache_dir"],
            ]
        )
        == 0
    )
    cli = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert {m: v["ce_mean"] for m, v in cli["models"].items()} == {
        m: v["ce_mean"] for m, v in results["models"].items()
    }
    assert cli["study"] == json.loads((tmp_path / "py" / "study.json").read_text())
    # planning checks every setting by its name, before any data is read
    with pytest.raises(ValueError, match="seed of each run"):
        ablate.plan_study(StudySpec(models=["J"], seeds=[1], train={"seed": 3}))
    with pytest.raises(ValueError, match="'lr' is a train setting"):
        ablate.plan_study(StudySpec(models=["J"], seeds=[1], model_settings={"J": {"lr": 1e-3}}))
    with pytest.raises(ValueError, match="n_positions=32; raise the model setting GPT2.n_positions to 64"):
        ablate.plan_study(StudySpec(models=["GPT2"], seeds=[1], preset="micro", train={"seq_len": 64}))


def test_a_stopped_run_inside_a_study_is_one_line(corpus_file, tmp_path, monkeypatch, capsys):
    """SIGTERM or a non-finite stop inside `drmlab ablate` ends the command with one line, no traceback."""
    from drmlab.cli import main
    from drmlab.training import trainer

    argv = [
        "ablate",
        "--models",
        "GPT2",
        "--seeds",
        "1",
        "--preset",
        "micro",
        "--tokens",
        "1k",
        "--out",
        str(tmp_path / "s"),
        "--data",
        str(corpus_file),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--quiet",
    ]

    def stopped(*args, **kwargs):
        raise trainer.TrainingInterrupted(
            "SIGTERM received: stopped after step 2 of 4, checkpoint committed in X", 15, 2
        )

    monkeypatch.setattr(trainer, "train", stopped)
    assert main(argv) == 143
    err = capsys.readouterr().err
    assert "SIGTERM received" in err and "rerun the same command" in err and "Traceback" not in err

    def diverged(*args, **kwargs):
        raise trainer.DivergenceError("the loss diverged: 9.9 at step 3; stopped")

    monkeypatch.setattr(trainer, "train", diverged)
    assert main(argv) == 1
    assert "error: the loss diverged" in capsys.readouterr().err
