"""Names the user types: the one did-you-mean helper and the unknown-name error built on it.

Imports nothing but the standard library, so the command line can check a name before torch loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

LISTED = 12  # a list of known names up to this long is printed whole; a longer one by its nearest names
NEAREST = 5


def suggest(word: str, options: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint for a misspelt name, or ''."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def known_names(word: str, options: Iterable[str]) -> str:
    """What a refusal of ``word`` lists: ``known: a, b, c`` for a short list of options; for a long one the
    nearest first, ``nearest: a, b, c, d, e (of 120)``, never a hundred names on one line."""
    options = sorted({str(o) for o in options})
    if len(options) <= LISTED:
        return f"known: {', '.join(options)}"
    nearest = difflib.get_close_matches(str(word), options, n=NEAREST, cutoff=0.0)
    return f"nearest: {', '.join(nearest)} (of {len(options)})"


def unknown(kind: str, name: str, options: Iterable[str]) -> ValueError:
    """``ValueError("unknown KIND 'name' (did you mean ...?); known: a, b, c")`` (:func:`known_names`)."""
    options = list(options)
    return ValueError(f"unknown {kind} {name!r}{suggest(name, options)}; {known_names(name, options)}")
