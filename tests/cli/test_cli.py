"""The command line's start-up and its early refusals: help answers without importing torch, numpy or
matplotlib; an unknown model or arm is refused in one line before any corpus is read; the verbs'
defaults agree with the studies' own; nothing below drmlab.cli reads flags or prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import drmlab
from drmlab.cli import VERBS, main

HEAVY = ("torch", "numpy", "matplotlib")

# Runs drmlab's main in a fresh interpreter, then reports which heavy modules it imported.
RUNNER = f"""\
import sys
from drmlab.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("HEAVY", sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def _drmlab(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, timeout=120)


def test_building_the_parser_imports_nothing_heavy():
    code = (
        "import sys, drmlab.cli as c; c.build_parser(); "
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]; assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_installed_command_answers_help():
    script = Path(sys.executable).with_name("drmlab")
    assert script.is_file(), f"no console script beside {sys.executable}: install the package (pip install -e .)"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "VERB" in done.stdout
    assert all(verb in done.stdout for verb in VERBS)


def test_python_dash_m_drmlab_is_the_same_command():
    env = dict(os.environ, PYTHONPATH=str(Path(drmlab.__file__).resolve().parents[1]))
    done = subprocess.run(
        [sys.executable, "-m", "drmlab", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and "usage: drmlab" in done.stdout and all(verb in done.stdout for verb in VERBS)
    done = subprocess.run(
        [sys.executable, "-m", "drmlab", "train", "--threads", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2 and "--threads must be a positive integer" in done.stderr


@pytest.mark.parametrize("argv", [["--help"], *[[verb, "--help"] for verb in VERBS]], ids=lambda a: " ".join(a))
def test_help_exits_0_without_heavy_imports(argv):
    done = _drmlab(*argv)
    assert done.returncode == 0, done.stderr
    assert "usage: drmlab" in done.stdout
    assert "HEAVY []" in done.stderr


def test_an_argument_error_answers_without_heavy_imports():
    done = _drmlab("ablate", "--preset", "huge")
    assert done.returncode == 2 and "invalid choice: 'huge'" in done.stderr and "HEAVY []" in done.stderr


@pytest.fixture
def no_corpus(monkeypatch):
    """Any corpus load fails the test: the refusals below must come before the data is touched."""
    import drmlab.data

    def refuse(*args, **kwargs):
        raise AssertionError("a corpus was loaded before the names were checked")

    monkeypatch.setattr(drmlab.data, "load_corpus", refuse)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "JJ"], "unknown model 'JJ' (did you mean 'J'?)"),
        (["ablate", "--models", "J,NOPE"], "unknown model 'NOPE' (did you mean 'LOOPED'?)"),
        (["mqar", "--models", "NOPE", "--steps", "1"], "unknown model 'NOPE' (did you mean 'LOOPED'?)"),
        (["loop-study", "--arms", "C,I13"], "unknown LOOPED arm 'I13' (did you mean 'I12'?)"),
        (["ablate", "--models", "J,LOOPED:I13"], "unknown LOOPED arm 'I13' (did you mean 'I12'?)"),
        (["inspect", "--model", "GTP2"], "unknown model 'GTP2' (did you mean 'GPT2'?)"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_an_unknown_name_is_refused_in_one_line_before_the_data(argv, message, tmp_path, no_corpus, capsys):
    missing = str(tmp_path / "no-such-corpus")
    data = [] if argv[0] in ("mqar", "inspect") else ["--data", missing]
    assert main([*argv, *data, "--out" if argv[0] != "inspect" else "--json", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"drmlab {argv[0]}: error: "), err
    assert message in err and missing not in err
    assert not (tmp_path / "out").exists()


def test_a_bad_setting_is_refused_before_the_data(tmp_path, no_corpus, capsys):
    base = ["--data", str(tmp_path / "no-such-corpus"), "--out", str(tmp_path / "out")]
    assert main(["ablate", "--models", "J", "--set", "J.d_stat=3", *base]) == 2
    assert "did you mean 'd_state'" in capsys.readouterr().err
    assert main(["loop-study", "--arms", "C", "--set", "lrr=1e-3", *base]) == 2
    assert "unknown setting 'lrr' (did you mean 'lr'?)" in capsys.readouterr().err


def test_the_verbs_defaults_are_the_studies_defaults():
    from drmlab.cli import ablate as ablate_cli
    from drmlab.cli import loop_study as loop_cli
    from drmlab.cli import mqar as mqar_cli
    from drmlab.experiments.ablate import protocol as ablate
    from drmlab.experiments.loop import study as loop_study
    from drmlab.experiments.mqar import models as mqar_models
    from drmlab.experiments.mqar import study as mqar

    assert mqar_cli.ANCHOR_ARM_NAMES == tuple(mqar_models.ANCHOR_ARMS)
    assert mqar_cli.ARM_MODELS == mqar_models.ARM_MODELS
    assert mqar_cli.DEFAULT_MODELS == ",".join(mqar.DEFAULT_MODELS)
    assert mqar_cli.DEFAULT_KVS == ",".join(map(str, mqar.DEFAULT_KVS))
    assert mqar_cli.DEFAULT_SEEDS == ",".join(map(str, mqar.DEFAULT_SEEDS))
    assert ablate_cli.DEFAULT_MODELS == ",".join(ablate.DEFAULT_MODELS)
    assert ablate_cli.DEFAULT_SEEDS == loop_cli.DEFAULT_SEEDS == ",".join(map(str, ablate.DEFAULT_SEEDS))
    assert loop_cli.DEFAULT_ARMS == ",".join(loop_study.DEFAULT_ARMS)


def test_nothing_below_the_cli_reads_flags_or_prints():
    experiments = Path(drmlab.__file__).parent / "experiments"
    offending = []
    for path in sorted(experiments.rglob("*.py")):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        for pattern in (r"\bprint\(", r"\bNamespace\b", r"\badd_parser\b", r"\bdrmlab\.cli\b", r"ArgumentParser"):
            if re.search(pattern, code.split('"""', 2)[-1]):  # past the module docstring
                offending.append(f"{path.relative_to(experiments)}: {pattern}")
    assert not offending, offending


def test_a_busy_machine_trains_on_the_cores_left_and_says_so_in_one_line(monkeypatch, capsys):
    from drmlab.cli import machine

    assert machine.busy_thread_choice(threads=2, cores=2, others=0) is None
    assert machine.busy_thread_choice(threads=1, cores=2, others=5) is None  # one thread waits for no other
    assert machine.busy_thread_choice(threads=4, cores=8, others=3) is None
    assert machine.busy_thread_choice(threads=2, cores=2, others=None) is None  # not Linux: nothing known
    assert machine.busy_thread_choice(threads=2, cores=2, others=1) == 1
    assert machine.busy_thread_choice(threads=2, cores=2, others=7) == 1  # never fewer than one
    assert machine.busy_thread_choice(threads=8, cores=8, others=3) == 5
    line = machine.busy_machine_note(2, 1, 2, 1)
    assert "1 other task already busy on this 2-core machine: using 1 thread instead of torch's 2" in line
    assert "\n" not in line and line.endswith("pass --threads N to choose")
    # the count is the fewest runnable tasks over the looks, less this process
    looks = iter(["0.5 0.4 0.3 3/80 1\n", "0.5 0.4 0.3 2/80 1\n", "0.5 0.4 0.3 4/80 1\n"])
    import builtins
    import io

    real_open = builtins.open
    monkeypatch.setattr(
        builtins,
        "open",
        lambda path, *a, **k: io.StringIO(next(looks)) if path == "/proc/loadavg" else real_open(path, *a, **k),
    )
    assert machine.other_busy_tasks(gap=0) == 1
    # apply_threads takes the cores left on the CPU when --threads is not given; never with --threads, and a
    # resumed run's recorded thread count (``recorded``) wins over the busy machine's choice
    import argparse

    monkeypatch.setattr(machine, "other_busy_tasks", lambda: 1)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    import torch

    chosen = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    machine.apply_threads(argparse.Namespace(threads=None, device="cpu"))
    assert chosen == [1] and "using 1 thread instead of torch's 2" in capsys.readouterr().err
    machine.apply_threads(argparse.Namespace(threads=2, device="cpu"))
    assert chosen == [1, 2] and capsys.readouterr().err == ""
    machine.apply_threads(argparse.Namespace(threads=None, device="cpu"), recorded=2)
    assert chosen == [1, 2, 2] and capsys.readouterr().err == ""
    machine.apply_threads(argparse.Namespace(threads=1, device="cpu"), recorded=2)  # told otherwise
    assert chosen == [1, 2, 2, 1]


@pytest.mark.parametrize(
    "verb, module", [("ablate", "drmlab.experiments.ablate.protocol"), ("loop-study", "drmlab.experiments.loop.study")]
)
def test_leave_held_reaches_the_study_and_a_left_study_prints_no_report(verb, module, tmp_path, monkeypatch, capsys):
    import importlib

    seen = []
    monkeypatch.setattr(importlib.import_module(module), "run_study", lambda spec, rt, out, **kw: seen.append(rt))
    assert main([verb, "--out", str(tmp_path / "s"), "--leave-held"]) == 0
    assert seen[0].leave_held and capsys.readouterr().out == ""
    assert main([verb, "--out", str(tmp_path / "s")]) == 0
    assert seen[-1].leave_held is False  # off unless given
