"""Reading a distance-protocol results.json (``drmlab mqar --protocol distance --ckpt ...``) for the
study collectors: its one entry, the figures of every length read, and the controls' verdicts and
figures (docs/mqar.md sections 8 and 8.1); and a ``drmlab specialise`` run read both ways."""

from __future__ import annotations

import json
from pathlib import Path


def entry(folder: Path) -> dict:
    """The one entry of ``folder``/results.json."""
    (only,) = json.loads((folder / "results.json").read_text())["entries"]
    return only


def reads(record: dict, keys: tuple[str, ...]) -> dict:
    """``keys`` of every length of an entry; a length not read is an error (the studies read them all)."""
    out = {}
    for length, r in record["lengths"].items():
        if r.get("status") != "read":
            raise ValueError(f"{record['label']}: length {length} was not read ({r.get('why')}); read with --read-all")
        out[length] = {k: r[k] for k in keys}
    return out


def controls(record: dict, keys: tuple[str, ...]) -> dict:
    """Per control of an entry: its verdict and, per length read under it, those of ``keys`` it has."""
    out = {}
    for name, verdict in record["controls"].items():
        out[name] = {"verdict": verdict["verdict"]}
        for length, r in record["lengths"].items():
            c = (r.get("controls") or {}).get(name)
            if c is not None and c.get("status") == "read":
                out[name][length] = {k: c[k] for k in keys if k in c}
    return out


def specialised(spec: Path, read_keys: tuple[str, ...], control_keys: tuple[str, ...]) -> dict | None:
    """A finished ``drmlab specialise`` run ``spec`` with its reads (``spec``/reads) and controls
    (``spec``/controls): the language CE before and after, the recall verdict, ``read_keys`` of every
    length read and ``control_keys`` of every control; None until all three are written."""
    path = spec / "specialise.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    if "after" not in result or not all((spec / part / "results.json").is_file() for part in ("reads", "controls")):
        return None
    return {
        "ce_before": result["before"]["ce"],
        "ce_after": result["after"]["ce"],
        "recall_pass": result.get("recall_pass"),
        "reads": reads(entry(spec / "reads"), read_keys),
        "controls": controls(entry(spec / "controls"), control_keys),
    }
