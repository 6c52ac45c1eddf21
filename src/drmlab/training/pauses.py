"""Time a run spends suspended is not training time: a clock that stands still while the process is stopped.

SIGTSTP (Ctrl-Z in a terminal, or ``kill -TSTP PID`` for a run in the background) suspends a process. While
:func:`counting_pauses` holds (the trainer holds it for the whole run, main thread only), its handler reads
the clock, stops the process with SIGSTOP, and when SIGCONT (``fg``, ``kill -CONT PID``) wakes it adds the
time it stood still to :func:`paused_seconds`. :func:`now` is ``time.perf_counter()`` less every pause so
far, so a step, an evaluation or ``elapsed`` timed on it leaves the suspension out: a run's ``train_seconds``
and tokens/s are those of the time it ran.

A process cannot see SIGSTOP itself (``kill -STOP``): that time is counted as running time. Python runs the
handler between bytecodes, so the process stops once the operation in flight (one kernel) has returned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

_paused = 0.0


def now() -> float:
    """``time.perf_counter()`` less the seconds this process has spent suspended under :func:`counting_pauses`."""
    return time.perf_counter() - _paused


def paused_seconds() -> float:
    """The seconds this process has spent suspended by SIGTSTP under :func:`counting_pauses`, in all."""
    return _paused


def _suspend(signum, frame) -> None:
    global _paused
    start = time.perf_counter()
    os.kill(os.getpid(), signal.SIGSTOP)  # delivered before kill returns: the next line runs after SIGCONT
    _paused += time.perf_counter() - start


@contextlib.contextmanager
def counting_pauses():
    """While held (in the main thread; elsewhere it does nothing), SIGTSTP suspends the process and the time
    until SIGCONT is left out of :func:`now`. A nested hold leaves the outer one's handler in place."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTSTP) is _suspend:
        yield
        return
    previous = signal.signal(signal.SIGTSTP, _suspend)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, previous)
