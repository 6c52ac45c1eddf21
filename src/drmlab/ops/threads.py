"""Running the pieces of one C kernel call on several threads.

A ctypes call releases the GIL, so disjoint pieces of one kernel call (batch rows, channel blocks)
run in parallel on a small pool of Python threads; the caller's thread runs the first piece.  The
thread count follows ``torch.get_num_threads()``, as torch's own CPU kernels do.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["thread_count", "run_pieces"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _forget_pool_after_fork() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the pool object but not its threads.
    global _pool, _pool_size, _lock
    _pool, _pool_size, _lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def thread_count() -> int:
    """How many threads a kernel call may use: ``torch.get_num_threads()`` (at least 1)."""
    return max(1, torch.get_num_threads())


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="drmlab-kernel")
            _pool_size = workers
        return _pool


def run_pieces(pieces: Sequence[Callable[[], None]]) -> None:
    """Run every piece, the first on this thread and the others on the pool; return when all
    are done (re-raising the first error)."""
    if len(pieces) == 1:
        pieces[0]()
        return
    pool = _get_pool(len(pieces) - 1)
    futures = [pool.submit(piece) for piece in pieces[1:]]
    pieces[0]()
    for future in futures:
        future.result()
