"""How the study reports draw their figures: matplotlib's pyplot on the file-only Agg backend, and
the reports' rule that a figure is a convenience -- when it cannot be drawn (matplotlib missing, a
drawing error) the tables are still written and the reason goes to the report's log.
"""

from __future__ import annotations

from collections.abc import Callable


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_or_log(draw: Callable[[], bool | None], log: Callable[[str], None] | None, what: str) -> bool:
    """Call ``draw()`` and return whether it wrote its figure (``draw`` may return False for "nothing
    to draw"); on any error log ``warning: WHAT not written (reason)`` and return False."""
    try:
        wrote = draw()
    except Exception as exc:  # a figure never costs the tables
        if log is not None:
            log(f"warning: {what} not written ({exc})")
        return False
    return wrote is None or bool(wrote)
