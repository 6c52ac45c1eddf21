"""Damage is said, not passed over: a damaged manifest.json is refused by the readers as by resume;
metrics.jsonl's rows before the checkpoint are checked against the length and sha256 the checkpoint recorded
(resume and report say it in one line); report never calls a run with lost metrics verified; a recovered
checkpoint.json is said."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from cli_runs import one_line, train_argv

from drmlab.cli import main
from drmlab.runs import RunDir


def _readers(run, corpus, scratch):
    data = ["--data", str(corpus), "--cache-dir", str(corpus.parent / "cache"), "--quiet", "--threads", "1"]
    return {
        "eval": ["eval", "--ckpt", str(run), *data],
        "generate": ["generate", "--ckpt", str(run), "--prompt", "def ", "--max-tokens", "4", "--temperature", "0"],
        "export": ["export", "--ckpt", str(run), "--out", str(scratch / "hf")],
        "resume": train_argv(run, corpus, "--resume", tokens="3k"),
    }


def _flip_a_sum(path, name):
    """Change one hex digit of ``name``'s sha256 in the manifest ``path`` (still valid JSON)."""
    text = path.read_text()
    at = text.index(f'"{name}"')
    digit = text.index('"sha256": "', at) + 11
    path.write_text(text[:digit] + ("0" if text[digit] != "0" else "1") + text[digit + 1 :])


@pytest.mark.parametrize("verb", ["eval", "generate", "export", "resume"])
@pytest.mark.parametrize("name", ["optimizer.safetensors", "model.safetensors"])
def test_a_damaged_manifest_is_refused_by_every_reader_and_the_advice_repairs_it(
    finished_run, tmp_path, capsys, verb, name
):
    if verb == "export":
        pytest.importorskip("transformers")
    run, corpus = finished_run
    manifest = RunDir(run).checkpoint_dir() / "manifest.json"
    _flip_a_sum(manifest, name)
    argv = _readers(run, corpus, tmp_path)[verb]
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{manifest} differs from {run / 'checkpoint.json'}, which verifies (the manifest is damaged)" in line
    assert line.endswith(f"copy {run / 'checkpoint.json'} over it to use this checkpoint")
    shutil.copyfile(run / "checkpoint.json", manifest)  # the advice
    assert main(argv) == 0


def _report_status(run) -> str:
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    return re.search(r"<p[^>]*>(Finished: [^<]*)</p>", page).group(1)


@pytest.mark.parametrize("damage", ["a flipped digit", "truncated", "deleted"])
def test_report_never_calls_a_run_with_damaged_metrics_verified(finished_run, capsys, damage):
    run, _ = finished_run
    assert "verified" in _report_status(run)
    metrics = run / "metrics.jsonl"
    text = metrics.read_text()
    if damage == "a flipped digit":  # still valid JSON, every row still there
        at = text.index('"loss": ') + 9
        metrics.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1 :])
    elif damage == "truncated":
        metrics.write_text("".join(text.splitlines(keepends=True)[:4]))
    else:
        metrics.unlink()
    status = _report_status(run)
    assert "verified" not in status and "Metrics incomplete or damaged: " in status
    assert str(metrics) in status


def test_resume_says_in_one_line_that_metrics_were_edited(finished_run, capsys):
    run, corpus = finished_run
    metrics = run / "metrics.jsonl"
    text = metrics.read_text()
    at = text.index('"loss": ') + 9
    metrics.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1 :])
    capsys.readouterr()
    assert main(train_argv(run, corpus, "--resume", tokens="3k")) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "metrics.jsonl" in line]
    assert len(notes) == 1 and "does not match the sha256 recorded when the checkpoint of step 8" in notes[0]
    (resume,) = [r for r in RunDir(run).read_metrics() if r["kind"] == "resume"]
    assert "does not match the sha256" in resume["lost_rows"]
    assert RunDir(run).metrics_problem() is None  # the resumed run's checkpoint records the file as it is now


def test_a_recovered_pointer_is_said_in_one_line(finished_run, capsys):
    run, corpus = finished_run
    pointer = run / "checkpoint.json"
    record = json.loads(pointer.read_text())
    pointer.write_text(json.dumps(dict(record, step=9)))
    capsys.readouterr()
    assert main(train_argv(run, corpus, "--resume", tokens="3k")) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "recovered checkpoint.json" in line]
    assert len(notes) == 1 and "checkpoint.json is damaged; checkpoints/step-00000008" in notes[0]
    assert "rewritten from checkpoints/step-00000008/manifest.json" in notes[0]
