"""Start the processes of a data-parallel run on this machine (``drmlab train --procs``): N copies of one
command joined over gloo on the loopback address (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, as
torchrun sets them; :mod:`drmlab.training.distributed` joins the group from them).

The processes start in their own session, so that the terminal's Ctrl-C reaches only the launcher, which
passes each SIGINT or SIGTERM it gets on once to every process: the first finishes the step and commits a
checkpoint on all of them (the trainer agrees on the stop in one all-reduce), a second stops at once, as
for one process. Process 0 reports; the others write their errors to a file the launcher reads when one
of them fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

# after one process fails, how long the others get to end on their own before SIGTERM, and then SIGKILL
FAILURE_GRACE_SECONDS = 15.0


def free_port() -> int:
    """A TCP port free on the loopback address now (the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(command: list[str], procs: int, threads: int, poll_seconds: float = 0.1) -> int:
    """Run ``command`` as ``procs`` processes of ``threads`` threads each, joined over gloo on the loopback
    address; return the exit code of the run: process 0's (which reports the run, as one process does), or
    1 with one line naming the process that failed when only another did."""
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(procs),
        LOCAL_WORLD_SIZE=str(procs),
        OMP_NUM_THREADS=str(threads),
    )
    errors = [None] + [tempfile.TemporaryFile() for _ in range(procs - 1)]
    children: list[subprocess.Popen] = []

    signalled: list[int] = []

    def forward(signum, frame):  # each signal the launcher gets goes once to every process
        signalled.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(procs):
            children.append(
                subprocess.Popen(
                    command,
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                    stdout=None if rank == 0 else subprocess.DEVNULL,
                    stderr=errors[rank],
                    start_new_session=True,
                )
            )
        codes, first = _wait_all(children, poll_seconds, signalled)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    if first is None:
        return 0
    if first == 0 or signalled:  # process 0 said why it stopped, as one process does
        return exit_code(codes[0])
    print(
        f"drmlab: error: process {first} of {procs} exited with {exit_code(codes[first])}: {_last_line(errors[first])}",
        file=sys.stderr,
    )
    return 1


def exit_code(code: int) -> int:
    """A process's exit code as a shell reports it: 128 + the signal for one a signal ended."""
    return 128 - code if code < 0 else code


def _wait_all(
    children: list[subprocess.Popen], poll_seconds: float, signalled: list[int]
) -> tuple[list[int], int | None]:
    """Every process's exit code and the rank of the first that failed (None: none); once one fails, the
    others get :data:`FAILURE_GRACE_SECONDS` to end (a group that lost a member fails its next collective),
    then SIGTERM, then as long again before SIGKILL -- unless a signal was passed on (``signalled``): then
    every process is stopping on its own, and process 0 may be committing a checkpoint that takes longer."""
    failed_at, first = None, None
    while True:
        codes = [child.poll() for child in children]
        if first is None:
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                failed_at, first = time.monotonic(), (0 if 0 in failed else failed[0])
        if all(code is not None for code in codes):
            return codes, first
        if failed_at is not None and not signalled:
            waited = time.monotonic() - failed_at
            for child in children:
                if child.poll() is None and waited > 2 * FAILURE_GRACE_SECONDS:
                    child.kill()
                elif child.poll() is None and waited > FAILURE_GRACE_SECONDS:
                    child.terminate()
        time.sleep(poll_seconds)


def _last_line(handle) -> str:
    """The last non-empty line a process wrote to stderr (its one-line error), or a placeholder."""
    if handle is None:
        return ""
    handle.seek(0)
    lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(it wrote nothing)"
