"""An output path given to a verb never lands on a run's own files (config, metrics, pointer,
the checkpoint's files): report, eval, export and the other writers refuse it in one line, saying where to
write instead."""

from __future__ import annotations

import pytest
from cli_runs import one_line, train_argv

from drmlab.cli import main


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "target, argv",
    [
        ("checkpoints/step-00000008/model.safetensors", ["report", "{run}", "--out", "{target}"]),
        ("config.json", ["report", "{run}", "--out", "{target}"]),
        ("checkpoint.json", ["eval", "--ckpt", "{run}", "--output", "{target}"]),
        ("metrics.jsonl", ["eval", "--ckpt", "{run}", "--output", "{target}"]),
        ("checkpoints/hf", ["export", "--ckpt", "{run}", "--out", "{target}"]),
        ("checkpoints/step-00000008/again", ["train", "--out", "{target}", "--preset", "micro", "--tokens", "1k"]),
    ],
)
def test_an_output_on_a_runs_own_files_is_refused_in_one_line(finished_run, capsys, target, argv):
    run, corpus = finished_run
    before = _files(run)
    argv = [a.format(run=run, target=run / target) for a in argv]
    if argv[0] == "eval":
        argv += ["--data", str(corpus), "--cache-dir", str(corpus.parent / "cache"), "--quiet", "--threads", "1"]
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{run / target} is " in line and f"of the run in {run}" in line and "write it elsewhere" in line
    assert _files(run) == before  # nothing of the run changed


def test_the_advised_place_works(finished_run, capsys):
    run, _ = finished_run
    assert main(["report", str(run), "--out", str(run / "config.json")]) == 2
    advice = one_line(capsys.readouterr().err).split("(e.g. ", 1)[1].rstrip(")")
    assert advice == f"--out {run / 'report.html'}"
    assert main(["report", str(run), *advice.split()]) == 0  # the advised place is written
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_eval_may_write_its_own_eval_json_and_places_outside_runs(finished_run, capsys, tmp_path):
    run, corpus = finished_run
    data = ["--data", str(corpus), "--cache-dir", str(corpus.parent / "cache"), "--quiet", "--threads", "1"]
    assert main(["eval", "--ckpt", str(run), "--output", str(run / "eval.json"), *data]) == 0
    (tmp_path / "checkpoints").mkdir()  # a folder of that name outside any run is an ordinary folder
    assert main(["eval", "--ckpt", str(run), "--output", str(tmp_path / "checkpoints" / "eval.json"), *data]) == 0
    other = tmp_path / "other"
    assert main(train_argv(other, corpus, tokens="1k")) == 0
    assert main(["eval", "--ckpt", str(run), "--output", str(other / "eval.json"), *data]) == 2  # another run's
    assert "eval.json of the run in" in one_line(capsys.readouterr().err)
