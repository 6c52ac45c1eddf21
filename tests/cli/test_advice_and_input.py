"""Advice that works when followed (each test runs the advised command once), and bad
input refused in one line: a NaN temperature, an eval_windows the validation stream cannot hold."""

from __future__ import annotations

import json
import shlex

import pytest
from cli_runs import one_line, train_argv

from drmlab.cli import main


def test_the_advice_after_a_stop_trains_at_the_advised_rate_over_a_set_lr(tmp_path, capsys, finished_run_source):
    """``--set lr=1e6`` won over the advised ``--lr 100000``: the advice failed again at the same rate."""
    _, corpus = finished_run_source
    out = tmp_path / "run"
    assert main(train_argv(out, corpus, "--set", "lr=1e6")) == 1
    err = capsys.readouterr().err
    advice = err.split("start again with a fix: drmlab ", 1)[1].split(" (or --set")[0]
    assert "lr=1e6" not in advice and advice.endswith("--overwrite --lr 100000")
    main(shlex.split(advice))  # the advised command, as printed (1e5 may diverge too: it is still too high)
    assert json.loads((out / "config.json").read_text())["train"]["lr"] == 100000
    assert "--overwrite --lr 10000 " in capsys.readouterr().err  # and the next advice goes on down


def test_report_takes_the_flag_its_edited_config_refusal_advises(finished_run, capsys):
    run, _ = finished_run
    config = json.loads((run / "config.json").read_text())
    config["train"]["eval_tokens"] = 64
    (run / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "config.json was edited after the run wrote it" in line and "pass --accept-edited-config" in line
    assert main(["report", str(run), "--accept-edited-config"]) == 0  # the advice
    assert "accepted the edited" in capsys.readouterr().err and (run / "report.html").is_file()


@pytest.mark.parametrize("flags", [(), ("--overwrite",)])
def test_a_folder_of_another_tool_is_advised_another_out_which_works(tmp_path, capsys, finished_run_source, flags):
    """A folder with another tool's config.json was told to use --overwrite, which then refused."""
    _, corpus = finished_run_source
    theirs = tmp_path / "theirs"
    (theirs / "checkpoints" / "epoch-10").mkdir(parents=True)
    (theirs / "config.json").write_text('{"epochs": 10}')
    capsys.readouterr()
    assert main(train_argv(theirs, corpus, *flags, tokens="1k")) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{theirs} is not a drmlab run (config.json is not a drmlab run's)" in line
    assert "--overwrite" not in line.split("; ")[-1] and line.endswith("give another --out")
    assert (theirs / "config.json").read_text() == '{"epochs": 10}' and (theirs / "checkpoints" / "epoch-10").is_dir()
    assert main(train_argv(tmp_path / "another", corpus, *flags, tokens="1k")) == 0  # the advice


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--temperature", "nan"), "--temperature must be a finite number >= 0 (0 is greedy), got nan"),
        (("--temperature", "inf"), "--temperature must be a finite number >= 0 (0 is greedy), got inf"),
        (("--temperature", "-1"), "--temperature must be a finite number >= 0"),
        (("--top-p", "nan"), "--top-p must be in (0, 1], got nan"),
        (("--top-k", "0"), "--top-k must be >= 1, got 0"),
        (("--max-tokens", "-3"), "--max-tokens must be >= 0, got -3"),
    ],
)
def test_bad_sampling_numbers_are_one_line_before_anything_is_printed(finished_run_source, capsys, flags, words):
    run, _ = finished_run_source
    capsys.readouterr()
    assert main(["generate", "--ckpt", str(run), "--prompt", "def ", *flags]) == 2
    captured = capsys.readouterr()
    assert one_line(captured.err) == f"drmlab generate: error: {words}" or words in one_line(captured.err)
    assert captured.out == ""  # not even the prompt


def test_an_eval_windows_beyond_the_validation_stream_is_refused_naming_the_largest(
    tmp_path, capsys, finished_run_source
):
    """``--set eval_windows=1000000`` on a micro run sampled for over 5 minutes."""
    _, corpus = finished_run_source
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(train_argv(out, corpus, "--set", "eval_windows=1000000")) == 2
    line = one_line(capsys.readouterr().err)
    assert "eval_windows=1000000: the validation stream (" in line and "windows of 32" in line
    assert not out.exists()  # refused before anything was written
    largest = line.split("--set eval_windows=", 1)[1].split()[0]
    assert main(train_argv(out, corpus, "--set", f"eval_windows={largest}")) == 0  # the advice
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["val_windows"] for r in rows if r["kind"] == "eval"} == {int(largest)}
