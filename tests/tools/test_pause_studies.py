"""tools/pause_studies.py: a study process suspended for a benchmark leaves the pause out of its times.

Only processes these tests start are stopped: the tool's ``stop`` and ``cont`` are given their pids (a study
running on the machine beside the tests is never touched)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from test_collectors import _tool

ps = _tool("pause_studies")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tool reads Linux's /proc")

# a stand-in study process: a drmlab study verb on its command line, the pause clock held, a child of its own
STAND_IN = """
import subprocess, sys, time
from drmlab.training import pauses
with pauses.counting_pauses():
    child = subprocess.Popen(["sleep", "30"])
    print(child.pid, flush=True)
    sys.stdin.readline()  # the test says when to finish
    print(pauses.paused_seconds(), flush=True)
    child.kill()
"""

IGNORES_TSTP = """
import signal, sys
signal.signal(signal.SIGTSTP, signal.SIG_IGN)  # as a background process of older code does
print("ready", flush=True)
sys.stdin.readline()
"""


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, "drmlab", "ablate", "--out", "x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_state(pid: int, states: str, seconds: float = 5.0) -> str:
    deadline = time.monotonic() + seconds
    while ps._state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    return ps._state(pid)


def test_which_command_lines_are_studies():
    assert ps.is_drmlab_study(["/v/bin/python3", "/v/bin/drmlab", "ablate", "--models", "J"])
    assert ps.is_drmlab_study(["python", "-m", "drmlab", "mqar", "--protocol", "zoology"])
    assert not ps.is_drmlab_study(["/v/bin/drmlab", "train", "--model", "J"])  # one run, not a study
    assert not ps.is_drmlab_study(["python", "-m", "pytest", "tests/experiments/test_ablate.py"])
    assert ps.is_driver(["python", "tools/capacity_study.py", "run", "--out", "studies/x"])


def test_stop_suspends_a_study_and_its_child_and_its_clock_leaves_the_pause_out():
    proc = _start(STAND_IN)
    try:
        child = int(proc.stdout.readline())
        assert proc.pid in ps.study_processes()
        assert ps.stop([proc.pid]) == [f"{proc.pid}: suspended by SIGTSTP"]
        assert _wait_state(proc.pid, "Tt") in ("T", "t") and _wait_state(child, "Tt") in ("T", "t")
        time.sleep(1.0)
        assert ps.cont([proc.pid]) == [f"{proc.pid}: going on"]
        assert _wait_state(child, "SR") in ("S", "R") and _wait_state(proc.pid, "SR") in ("S", "R")
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert float(proc.stdout.readline()) >= 0.9
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_ignores_sigtstp_is_stopped_with_sigstop_and_says_so():
    proc = _start(IGNORES_TSTP)
    try:
        assert proc.stdout.readline().strip() == "ready"
        (line,) = ps.stop([proc.pid], wait=0.3)
        assert "did not answer SIGTSTP" in line and line.endswith("SIGSTOP")
        assert _wait_state(proc.pid, "Tt") in ("T", "t")
        ps.cont([proc.pid])
        assert _wait_state(proc.pid, "SR") in ("S", "R")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
