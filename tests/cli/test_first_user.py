"""What a first user meets on the command line: each verb's help says what it does with the
data (eval reads the run's own), every verb that computes takes --threads, a budget may be given in optimizer
steps, an unknown setting names the nearest ones first, a recovered checkpoint.json is said in one line by every
reader, and the folders the documentation's examples write are ignored by git."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runs import CORPUS, one_line, train_argv

from drmlab.cli import VERBS, build_parser, main
from drmlab.runs import RunDir

ROOT = Path(__file__).resolve().parents[2]

# Verbs that run no torch computation of their own, and why they need no --threads.
NO_TORCH_WORK = {
    "export": "copies a checkpoint's tensors into a Hugging Face folder; no forward pass",
    "compare": "joins two finished studies' tables and draws a plot",
    "report": "renders a run's or study's files as one HTML page",
    "proofs": "numpy in float64 on one BLAS thread by design (drmlab.experiments.loop.proofs.common)",
}


def _options(verb: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {option: action for action in sub.choices[verb]._actions for option in action.option_strings}


@pytest.mark.parametrize("verb", ["eval", "geometry", "specialise"])
def test_the_readers_of_a_run_say_their_data_is_the_run_s_own(verb):
    """eval --help said --data defaulted to the embedded corpus; eval scores the run's own data."""
    data, tokenizer = _options(verb)["--data"].help, _options(verb)["--tokenizer"].help
    assert "embedded corpus" not in data and "run's" in data and "config.json" in data
    assert "run's own" in tokenizer and "the default" not in tokenizer
    assert "embedded corpus" in _options("train")["--data"].help  # a fresh run's default is the embedded corpus


def test_every_verb_that_computes_takes_threads():
    assert set(NO_TORCH_WORK) <= set(VERBS)
    missing = [verb for verb in VERBS if verb not in NO_TORCH_WORK and "--threads" not in _options(verb)]
    assert missing == []


def test_generate_applies_threads(finished_run, capsys):
    import torch

    run, _ = finished_run
    before = torch.get_num_threads()
    try:
        argv = ["generate", "--ckpt", str(run), "--prompt", "def ", "--max-tokens", "3", "--temperature", "0"]
        torch.set_num_threads(2)
        assert main([*argv, "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert main([*argv, "--threads", "0"]) == 2
        assert "--threads must be a positive integer" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def _readers(run: Path, corpus: Path, scratch: Path) -> dict[str, list[str]]:
    data = ["--data", str(corpus), "--cache-dir", str(corpus.parent / "cache"), "--quiet", "--threads", "1"]
    return {
        "eval": ["eval", "--ckpt", str(run), *data],
        "generate": ["generate", "--ckpt", str(run), "--prompt", "def ", "--max-tokens", "4", "--threads", "1"],
        "export": ["export", "--ckpt", str(run), "--out", str(scratch / "hf")],
        "inspect": ["inspect", "--ckpt", str(run), "--length", "16", "--threads", "1"],
        "resume": train_argv(run, corpus, "--resume", tokens="3k"),
    }


@pytest.mark.parametrize("verb", ["eval", "generate", "export", "inspect", "resume"])
def test_a_checkpoint_json_full_of_garbage_is_recovered_and_said_in_one_line(finished_run, tmp_path, capsys, verb):
    if verb == "export":
        pytest.importorskip("transformers")
    run, corpus = finished_run
    (run / "checkpoint.json").write_bytes(b"\x00garbage{{{ not json \xff" * 7)
    capsys.readouterr()
    assert main(_readers(run, corpus, tmp_path)[verb]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "checkpoint.json" in line]
    assert len(notes) == 1, notes
    assert "checkpoint.json is damaged; checkpoints/step-00000008" in notes[0] and "verifies" in notes[0]
    # a pointer that verifies is read unsaid
    if verb != "resume":
        shutil.copyfile(RunDir(run).checkpoint_dir() / "manifest.json", run / "checkpoint.json")
        assert main(_readers(run, corpus, tmp_path / "again")[verb]) == 0
        assert "checkpoint.json" not in capsys.readouterr().err


def _steps_argv(out: Path, corpus: Path, *flags: str) -> list[str]:
    argv = train_argv(out, corpus, *flags)
    at = argv.index("--tokens")
    return argv[:at] + argv[at + 2 :]  # no --tokens: the budget comes from the flags


def test_a_budget_in_optimizer_steps_is_recorded_and_resumed(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    run = tmp_path / "run"
    assert main(_steps_argv(run, corpus, "--steps", "3")) == 0
    train = RunDir(run).read_config()["train"]
    per_step = train["batch_size"] * train["grad_accum"] * train["seq_len"]
    assert (train["steps"], train["tokens"]) == (3, 3 * per_step)
    assert RunDir(run).read_summary()["tokens"] == 3 * per_step
    # resumed with a higher budget in steps: it goes on to step 5 and records the new budget
    assert main(_steps_argv(run, corpus, "--resume", "--steps", "5")) == 0
    train = RunDir(run).read_config()["train"]
    assert (train["steps"], train["tokens"]) == (5, 5 * per_step)
    assert max(r["step"] for r in RunDir(run).read_metrics() if r["kind"] == "train") == 5
    (resume,) = [r for r in RunDir(run).read_metrics() if r["kind"] == "resume" and "steps" in r.get("changed", {})]
    assert resume["changed"]["steps"] == [3, 5]
    # and then in tokens: the budget in steps gives way
    assert main(_steps_argv(run, corpus, "--resume", "--tokens", str(6 * per_step))) == 0
    train = RunDir(run).read_config()["train"]
    assert (train["steps"], train["tokens"]) == (None, 6 * per_step)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--steps", "3", "--tokens", "2k"], "--tokens and --steps exclude each other"),
        (["--steps", "3", "--set", "tokens=2k"], "--tokens and --steps exclude each other"),
        (["--steps", "0"], "--steps must be a positive whole number of optimizer steps"),
        (["--steps", "two"], "--steps must be a positive whole number of optimizer steps"),
    ],
)
def test_steps_and_tokens_exclude_each_other(tmp_path, capsys, flags, message):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    assert main(_steps_argv(tmp_path / "run", corpus, *flags)) == 2
    assert message in one_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_an_unknown_setting_names_the_nearest_first_in_one_short_line(tmp_path, capsys):
    """It printed all ~120 train and model settings on one line."""
    missing = str(tmp_path / "no-such-corpus")
    assert main(["train", "--set", "lrr=1e-3", "--data", missing, "--out", str(tmp_path / "out")]) == 2
    line = one_line(capsys.readouterr().err)
    assert "unknown setting 'lrr' (did you mean 'lr'?); nearest: lr, " in line and "(of 1" in line
    assert len(line) < 300 and "drmlab inspect --settings" in line
    assert main(["train", "--model", "J", "--set", "d_stat=3", "--data", missing, "--out", str(tmp_path / "out")]) == 2
    assert "nearest: d_state, " in one_line(capsys.readouterr().err)
    # where every name is listed, with its value at the preset
    assert main(["inspect", "--settings", "--model", "J", "--preset", "micro", "--set", "d_state=12"]) == 0
    listed = capsys.readouterr().out
    assert "\n  lr = 0.003\n" in listed and "\n  d_state = 12\n" in listed and "\n  steps = null\n" in listed


def test_a_short_list_of_names_is_printed_whole():
    from drmlab.naming import known_names, unknown

    assert known_names("tni", ["micro", "tiny"]) == "known: micro, tiny"
    many = [f"name_{i}" for i in range(40)] + ["d_state"]
    listed = known_names("d_stat", many)
    assert listed.startswith("nearest: d_state, name_") and listed.endswith(" (of 41)") and listed.count(",") == 4
    assert str(unknown("setting", "d_stat", many)).startswith("unknown setting 'd_stat' (did you mean 'd_state'?)")


def test_the_folders_the_docs_examples_write_are_ignored_by_git():
    """`drmlab export ... --out hf/J-tiny` (docs/integrations.md) left an export that `git status` offered to commit."""
    listed = subprocess.run(["git", "ls-files", "README.md", "docs"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    outputs = set()
    for name in listed.stdout.split():
        if name.endswith(".md"):
            outputs |= set(re.findall(r"--out[= ]([a-z][\w.-]*/[\w./-]*)", (ROOT / name).read_text()))
    assert "hf/J-tiny" in outputs
    for out in sorted(outputs):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{out}/config.json"], cwd=ROOT)
        assert ignored.returncode == 0, f"{out} (an example's output folder) is not ignored by git"
