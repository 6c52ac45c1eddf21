"""The switch between drmlab's fused kernels and their plain references (``docs/drm.md`` appendix
A.4.6).

Fused paths (the state bound, the selective memory's packed gates) are on by default wherever they
apply; each computes its plain reference's function to round-off (tested per dtype). ``plain_reference()``
turns them off inside a ``with`` block -- the tests compare the two, and a user can rule the fused
kernels out of a result -- and ``DRMLAB_NO_FUSED=1`` turns them off for the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DISABLE_ENV", "fused_enabled", "plain_reference"]

DISABLE_ENV = "DRMLAB_NO_FUSED"
_state = {"plain": 0}


def fused_enabled() -> bool:
    """True unless inside :func:`plain_reference` or ``DRMLAB_NO_FUSED`` is set."""
    if _state["plain"]:
        return False
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("", "0", "false", "no")


@contextmanager
def plain_reference() -> Iterator[None]:
    """Run every operator by its plain reference inside the block (nests; not per thread)."""
    _state["plain"] += 1
    try:
        yield
    finally:
        _state["plain"] -= 1
