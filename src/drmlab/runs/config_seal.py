"""config.json protected like the weights (docs/runs.md, "What a run directory promises"): written with a seal,
``config.seal.json`` = its sha256 and the copy it was taken of, verified on every read. Resume and
every reader take the run's settings from config.json, so an edit there would silently change what a
resumed or evaluated run is; an edited config is refused with the fields it changed, unless the user
accepts it (``--accept-edited-config``), which is then sealed again and recorded in metrics.jsonl.
Runs written before the seal existed have none and are read as they are.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .jsonio import jsonable, read_json, write_json_atomic


class EditedConfigError(ValueError):
    """config.json differs from the copy sealed when the run wrote it; the message lists the fields."""


def digest(config) -> str:
    """sha256 of the canonical JSON of ``config`` (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_sealed(path: Path, seal_path: Path, config: dict) -> None:
    """Write ``config`` to ``path`` and its seal to ``seal_path`` (both atomically; the seal last)."""
    config = jsonable(config)
    write_json_atomic(path, config)
    write_json_atomic(seal_path, {"sha256": digest(config), "config": config})


def differences(before, now, prefix: str = "") -> list[str]:
    """``key.sub: before -> now`` for every leaf that differs between two JSON values."""
    if isinstance(before, dict) and isinstance(now, dict):
        out = []
        for key in list(before) + [k for k in now if k not in before]:
            name = f"{prefix}{key}"
            if key not in now:
                out.append(f"{name}: {before[key]!r} -> removed")
            elif key not in before:
                out.append(f"{name}: added {now[key]!r}")
            else:
                out += differences(before[key], now[key], name + ".")
        return out
    return [] if before == now else [f"{prefix.rstrip('.')}: {before!r} -> {now!r}"]


def edits(path: Path, seal_path: Path, config) -> list[str]:
    """The fields of ``config`` (read from ``path``) that differ from its seal; [] when intact or unsealed."""
    if not seal_path.is_file():
        return []
    seal = read_json(seal_path)
    if not isinstance(seal, dict) or not isinstance(seal.get("sha256"), str) or "config" not in seal:
        raise ValueError(f"{seal_path} is damaged: it holds no sha256 and config; the run's settings cannot be checked")
    if digest(config) == seal["sha256"]:
        return []
    if digest(seal["config"]) != seal["sha256"]:
        raise ValueError(f"{seal_path} is damaged (its copy does not match its sha256)")
    return differences(seal["config"], config) or ["the file's values are equal but its sha256 differs"]


def refusal(path: Path, changed: list[str]) -> EditedConfigError:
    shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
    return EditedConfigError(
        f"{path} was edited after the run wrote it ({shown}); restore it, or pass "
        "--accept-edited-config to use it as it is (the edit is then recorded)"
    )
