"""``drmlab eval --carry-state`` and ``--by-position`` end to end on micro runs: each writes its own file
beside eval.json (and a figure), the recurrent run carries its state through each document and scores
every target once, an attention run says in one line what it does instead, GPT2's positions past its
table are "n/a" with the reason, a window too long for the memory is one line naming the largest that
fits (which is then accepted), and an older corpus cache is rebuilt with the document starts."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_runs import CORPUS, one_line, train_argv

from drmlab.cli import main


def _eval(run, corpus, *flags, cache=None):
    cache = cache or corpus.parent / "cache"
    return ["eval", "--ckpt", str(run), "--cache-dir", str(cache), "--threads", "1", "--quiet", *flags]


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS)
    argv = train_argv(root / "run", corpus)
    argv[argv.index("SSM_CONTROL")] = "GPT2"
    assert main(argv) == 0
    return root / "run", corpus


def test_carry_state_scores_each_document_whole_and_every_target_once(finished_run, capsys):
    run, corpus = finished_run
    assert main(_eval(run, corpus, "--carry-state")) == 0
    report = json.loads((run / "eval-carried.json").read_text())
    assert not (run / "eval.json").exists()  # the run's standard evaluation is left alone
    assert report["context"] == "carried" and report["resets"] == "documents" and report["note"] is None
    assert report["targets"] == report["data"]["val_tokens"] - 1  # the whole stream, each target once
    assert report["segments"] == report["data"]["val_docs"]
    assert report["chunk"] == report["longest_segment"]  # memory holds each document in one forward
    assert "state carried" in capsys.readouterr().out
    # the parallel chunk and the lanes change the speed only: 4-token prefills, then 3 documents stepping together
    assert (
        main(
            _eval(run, corpus, "--carry-state", "--seq-len", "4", "--batch-size", "3", "--output", str(run / "b.json"))
        )
        == 0
    )
    stepped = json.loads((run / "b.json").read_text())
    assert stepped["chunk"] == 4 and stepped["ce"] == pytest.approx(report["ce"], rel=1e-5)
    # carried across documents: one sequence, another number
    assert (
        main(_eval(run, corpus, "--carry-state", "--no-reset", "--eval-tokens", "600", "--output", str(run / "c.json")))
        == 0
    )
    across = json.loads((run / "c.json").read_text())
    assert across["resets"] == "none" and across["segments"] == 1 and across["targets"] == 600


def test_carry_state_on_an_attention_model_says_what_it_does_instead(gpt2_run, capsys):
    run, corpus = gpt2_run
    capsys.readouterr()
    assert main(_eval(run, corpus, "--carry-state")) == 0
    out = capsys.readouterr().out
    report = json.loads((run / "eval-carried.json").read_text())
    assert report["context"] == "windows" and report["window"] == 32  # GPT2 micro's n_positions
    notes = [line for line in out.splitlines() if "no fixed-size state" in line]
    assert notes == [report["note"]] and "windows of 32 tokens" in notes[0]
    assert report["targets"] == report["data"]["val_tokens"] - 1


def test_by_position_past_gpt2s_table_is_na_with_the_reason(gpt2_run, capsys):
    run, corpus = gpt2_run
    assert main(_eval(run, corpus, "--by-position", "--seq-len", "128")) == 0
    report = json.loads((run / "eval-by-position.json").read_text())
    assert (run / "eval-by-position.png").stat().st_size > 0
    assert report["position_limit"] == 32 and report["seq_len"] == 128
    na = [r for r in report["buckets"] if r["ce"] == "n/a"]
    assert [(r["lo"], r["hi"]) for r in na] == [(32, 64), (64, 128)]
    assert all("32 rows" in r["reason"] for r in na)
    assert sum(r["tokens"] for r in report["buckets"]) == report["targets"] < report["targets_in_windows"]
    assert "n/a: GPT2 has a learned position table of 32 rows" in capsys.readouterr().out


def test_by_position_defaults_to_16_windows_and_counts_every_target(finished_run, capsys):
    run, corpus = finished_run
    assert main(_eval(run, corpus, "--by-position")) == 0
    report = json.loads((run / "eval-by-position.json").read_text())
    assert report["seq_len"] == 16 * report["train_seq_len"] == 16 * 32
    assert sum(r["tokens"] for r in report["buckets"]) == report["targets"] == report["targets_in_windows"]
    assert report["buckets"][-1]["hi"] == 512 and all(r["low"] is not None for r in report["buckets"])
    assert (run / "eval-by-position.png").stat().st_size > 0
    assert main(_eval(run, corpus, "--by-position", "--carry-state", "--seq-len", "8")) == 0
    carried = json.loads((run / "eval-carried-by-position.json").read_text())
    assert sum(r["tokens"] for r in carried["buckets"]) == carried["targets"]
    assert carried["buckets"][-1]["hi"] == carried["longest_segment"]  # positions counted in each document


def test_a_window_past_the_memory_is_one_line_naming_the_largest_that_fits(finished_run, capsys, monkeypatch):
    from drmlab.cli import machine
    from drmlab.evaluation.memory import fit_memory
    from drmlab.models import build_model

    run, corpus = finished_run
    budget = fit_memory(build_model("SSM_CONTROL", "micro", seed=0), "cpu").bytes(1, 1000)  # about 1,000 tokens
    monkeypatch.setattr(machine, "available_memory_bytes", lambda device: budget)
    # the streams are cut to a little more than the window (a window is bounded by the stream it scores), so
    # the memory bounds it while the scoring stays short
    for flags in (["--by-position"], [], ["--carry-state", "--no-reset"]):  # --no-reset: the stream is one document
        capsys.readouterr()
        assert main(_eval(run, corpus, *flags, "--seq-len", "5000", "--eval-tokens", "6000")) == 2
        line = one_line(capsys.readouterr().err)
        assert "does not fit in memory" in line and "the largest --seq-len that fits is " in line
        largest = int(line.rsplit(" ", 1)[1].replace(",", ""))
        assert 500 < largest < 5000
        stream = str(largest + largest // 5)
        assert main(_eval(run, corpus, *flags, "--seq-len", str(largest), "--eval-tokens", stream)) == 0
        assert main(_eval(run, corpus, *flags, "--seq-len", str(largest + 200), "--eval-tokens", stream)) == 2
    # a window longer than the stream needs only the stream
    assert main(_eval(run, corpus, "--seq-len", "100000000", "--eval-tokens", "800")) == 0


def test_an_older_corpus_cache_is_rebuilt_with_the_document_starts(finished_run, tmp_path):
    run, corpus = finished_run
    cache = tmp_path / "cache"
    shutil.copytree(corpus.parent / "cache", cache)
    manifests = list(cache.glob("*/manifest.json"))
    for path in manifests:  # as written before the document starts were recorded
        manifest = json.loads(path.read_text())
        manifest.pop("documents", None)
        path.write_text(json.dumps(manifest))
    assert main(_eval(run, corpus, "--carry-state", cache=cache)) == 0
    assert all("documents" in json.loads(p.read_text()) for p in manifests)
    assert json.loads((run / "eval-carried.json").read_text())["resets"] == "documents"


def test_flags_that_do_not_go_together_are_one_line(finished_run, capsys):
    run, corpus = finished_run
    assert main(_eval(run, corpus, "--no-reset")) == 2
    assert "--no-reset goes with --carry-state" in one_line(capsys.readouterr().err)
    assert main(_eval(run, corpus, "--by-position", "--seq-len", "0")) == 2
    assert "--seq-len must be a positive" in one_line(capsys.readouterr().err)


def test_the_help_names_the_long_context_flags(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    for words in ("--carry-state", "--by-position", "--no-reset", "Long-context evaluation", "95% band"):
        assert words in text, words
