"""drmlab loop-study: looped arms through the ablation protocol, with the loop report."""

import json

from drmlab.cli import main


def test_loop_study_runs_arms_and_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"for i in range({i}):\n    total += i * {i}" for i in range(300)))
    out = tmp_path / "study"
    args = [
        "loop-study",
        "--arms",
        "C,I12u",
        "--seeds",
        "1,2",
        "--preset",
        "micro",
        "--tokens",
        "512",
        "--data",
        str(text),
        "--out",
        str(out),
        "--quiet",
        "--eval-tokens",
        "256",
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["models"]) == {"C", "I12u"}
    config = json.loads((out / "runs" / "C-seed1" / "config.json").read_text())
    assert config["model"] == "LOOPED" and config["overrides"] == {"arm": "C"}
    report = (out / "loop.md").read_text()
    assert "| C | 6 | 2 | layer | 1/N |" in report and "| I12u | 1 | 12 | layer | 1.0 |" in report
    assert (out / "loss_vs_n.png").stat().st_size > 0
    # a rerun resumes: nothing is trained again
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().err.count("skipped") == 4
    # the run directory is an ordinary run: drmlab eval reloads the right arm
    assert main(["eval", "--ckpt", str(out / "runs" / "I12u-seed1"), "--eval-tokens", "256", "--quiet"]) == 0


def test_loop_study_sweep_only_stops_after_the_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"for i in range({i}):\n    total += i * {i}" for i in range(300)))
    out = tmp_path / "study"
    args = [
        "loop-study",
        "--arms",
        "C",
        "--seeds",
        "1,2",
        "--preset",
        "micro",
        "--tokens",
        "512",
        "--data",
        str(text),
        "--out",
        str(out),
        "--quiet",
        "--eval-tokens",
        "256",
        "--lr-grid",
        "1e-3,3e-3",
        "--tune-tokens",
        "256",
    ]
    assert main(args + ["--sweep-only"]) == 0
    assert not (out / "runs").exists() and not (out / "loss_vs_n.png").exists()
    assert "results in" in capsys.readouterr().out and (out / "lr_sweep.png").stat().st_size > 0
    assert main(args) == 0  # the same command without the flag goes on with the paired runs
    assert set(json.loads((out / "results.json").read_text())["models"]) == {"C"}
    assert main(["loop-study", "--arms", "C", "--sweep-only", "--out", str(tmp_path / "x")]) == 2
    assert "--sweep-only needs --lr-grid" in capsys.readouterr().err
