"""Names the user types: the one did-you-mean helper and the unknown-name error built on it.

Imports nothing but the standard library, so the command line can check a name before torch loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggest(word: str, options: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint for a misspelt name, or ''."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown(kind: str, name: str, options: Iterable[str]) -> ValueError:
    """``ValueError("unknown KIND 'name' (did you mean ...?); known: a, b, c")``."""
    options = list(options)
    return ValueError(f"unknown {kind} {name!r}{suggest(name, options)}; known: {', '.join(sorted(map(str, options)))}")
