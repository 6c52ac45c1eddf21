"""The writer's lock of a run directory (docs/runs.md, "What a run directory promises": one writer).

The one process writing a run holds an exclusive ``flock`` on ``DIR/.lock``, a file naming it (pid, host,
start time); a second writer is refused at once with that name.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .jsonio import disk_error


class RunLockedError(OSError):
    """Another live process holds the run directory's lock; the message names it."""


class RunLock:
    """An exclusive ``flock`` on ``DIR/.lock`` naming its holder (pid, host, start time).

    The kernel drops the lock when its process dies, so the lock of a killed run is stale by
    construction and the next writer takes it over; the file itself is never removed (removing a
    locked file would let two processes lock two different files)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = None

    def acquire(self) -> RunLock:
        try:
            return self._acquire()
        except OSError as exc:
            if isinstance(exc, RunLockedError):
                raise
            raise disk_error(exc, self.path) from None

    def _acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        if not _lock_exclusive(handle.fileno()):
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise RunLockedError(
                f"{self.path.parent} is in use by {_holder(holder)}; wait for it to finish or "
                "stop it (a second writer would corrupt the run)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
            )
            + "\n"
        )
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


# How long a writer waits out the shared locks of looks (lock_holder), each held for an instant.
LOOK_WAIT_SECONDS = 1.0


def _lock_exclusive(fd: int) -> bool:
    """Take the exclusive lock of ``fd`` without blocking; False when a writer holds it. A conflict with
    shared locks only -- :func:`lock_holder`'s looks, each an instant -- is waited out (up to
    :data:`LOOK_WAIT_SECONDS`), so a look never turns a writer away."""
    deadline = time.monotonic() + LOOK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pass
        try:  # granted only where no writer holds the file: the conflict was a look
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def lock_holder(path: Path) -> str | None:
    """Who holds the lock file at ``path`` (``process 12 on host since ...``), or None when no live process
    does; writes nothing. It asks for a shared lock for an instant, which a writer starting at that instant
    waits out (:func:`_lock_exclusive`)."""
    try:
        handle = open(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise disk_error(exc, path) from None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder(handle.read().strip())
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return None


def _holder(text: str) -> str:
    """The lock file's ``text`` as words: ``process 12 on host since 2026-01-01 10:00:00 +0000``."""
    try:
        who = json.loads(text)
    except json.JSONDecodeError:
        return text or "another process"
    return (
        f"process {who.get('pid')} on {who.get('host')} since {who.get('started')}" if isinstance(who, dict) else text
    )
