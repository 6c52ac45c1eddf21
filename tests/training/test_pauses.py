"""A suspended run (SIGTSTP, then SIGCONT) leaves the suspension out of its times (drmlab.training.pauses)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
from test_training import TinyLM, _cfg, _data

from drmlab.training import pauses, train
from drmlab.training.batches import LMWindows

SUSPENDED = 1.5  # seconds between the process stopping itself and the SIGCONT that wakes it

needs_main_thread = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signal handlers need the main thread"
)


def _suspend_for(seconds: float) -> None:
    """Ask a shell to wake this process in ``seconds``, then send this process SIGTSTP (as Ctrl-Z does)."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGTSTP)


@needs_main_thread
def test_the_clock_stands_still_while_suspended():
    with pauses.counting_pauses():
        before_paused, w0, c0 = pauses.paused_seconds(), time.perf_counter(), pauses.now()
        _suspend_for(SUSPENDED)
        w1, c1 = time.perf_counter(), pauses.now()
    paused = pauses.paused_seconds() - before_paused
    assert paused >= SUSPENDED * 0.9, paused  # the wall clock ran through the suspension ...
    assert w1 - w0 >= paused
    assert (c1 - c0) == pytest.approx((w1 - w0) - paused, abs=1e-3)  # ... and the run's clock did not
    assert c1 - c0 < SUSPENDED * 0.5


@needs_main_thread
def test_the_handler_is_held_only_inside_and_a_nested_hold_keeps_the_outer():
    outside = signal.getsignal(signal.SIGTSTP)
    with pauses.counting_pauses():
        held = signal.getsignal(signal.SIGTSTP)
        assert held is not outside
        with pauses.counting_pauses():
            assert signal.getsignal(signal.SIGTSTP) is held
        assert signal.getsignal(signal.SIGTSTP) is held  # the inner hold did not put the outside one back
    assert signal.getsignal(signal.SIGTSTP) is outside


class _SuspendAtStep(LMWindows):
    """Language-model windows whose batch for one step first suspends the process (inside the step's timing)."""

    def __init__(self, *args, at_step: int):
        super().__init__(*args)
        self.at_step = at_step

    def batch(self, seed, step, micro, rank=0, world_size=1):
        if step == self.at_step and micro == 0:
            _suspend_for(SUSPENDED)
        return super().batch(seed, step, micro, rank, world_size)


@needs_main_thread
def test_a_run_suspended_mid_step_leaves_the_suspension_out_of_its_times(tmp_path):
    tr, va = _data()
    cfg = _cfg(seed=3)
    batches = _SuspendAtStep(tr, cfg.batch_size, cfg.seq_len, at_step=2)
    t0 = time.perf_counter()
    summary = train(TinyLM(seed=3), batches, va, cfg, tmp_path / "run", quiet=True)
    wall = time.perf_counter() - t0
    assert summary["paused_seconds"] >= SUSPENDED * 0.9
    assert wall >= summary["paused_seconds"]
    assert summary["train_seconds"] < wall - summary["paused_seconds"] + 1e-3
    rows = [r for r in summary["rows"] if r["kind"] == "train"]
    second = next(r for r in rows if r["step"] == 2)
    assert cfg.tokens_per_step / second["tok_s"] < SUSPENDED * 0.5  # the suspended step's own time
    assert rows[-1]["elapsed"] < wall - summary["paused_seconds"] + 1e-3
    # the run's wall time: every step and the final evaluation, the suspension left out
    assert summary["train_seconds"] <= summary["elapsed"] < wall - summary["paused_seconds"] + 1e-3
