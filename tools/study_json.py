"""The layout of the committed study records (docs/studies/*/results.json): indented one space per
level, a list or mapping on one line where the whole line fits in ``WIDTH`` characters."""

from __future__ import annotations

import json

WIDTH = 120


def dumps(obj, level: int = 0, lead: int = 0) -> str:
    """``obj`` as JSON at indentation ``level``, after ``lead`` characters on its first line."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, (dict, list)) and obj:
        flat = json.dumps(obj, separators=(", ", ": "))
        if len(flat) + lead <= WIDTH:
            return flat
    if isinstance(obj, dict) and obj:
        items = []
        for k, v in obj.items():
            head = f"{inner}{json.dumps(k)}: "
            items.append(head + dumps(v, level + 1, len(head)))
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj:
        return "[\n" + ",\n".join(inner + dumps(v, level + 1, len(inner)) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def write(path, record) -> None:
    path.write_text(dumps(record) + "\n")
