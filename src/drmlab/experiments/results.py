"""What every study writes as its ``results.json`` beside the numbers (docs/studies/README.md).

* :func:`curves` -- a run's ``metrics.jsonl`` rows reduced to what its plots draw: the training loss
  (step, tokens, loss) and the sampled validation CE (step, tokens, val_ce), each at most
  :data:`MAX_POINTS` points taken from the rows themselves (first and last kept, evenly spaced
  between), as columns, the losses rounded to :data:`CURVE_DECIMALS` places (far finer than a plot
  draws; the run's own numbers -- final CE, milestones -- keep every digit). A results file with these curves is enough to redraw a study's figures; the
  raw logs stay in the study's run directories.
* :func:`provenance` -- the command, the commit of the code and the date that produced a result,
  with the settings it was produced under. No machine paths beyond what the command itself names.
* :func:`dumps` / :func:`write` -- JSON with one space of indent, any container that fits in a line
  (and every list of numbers) on one line, so a results file stays short enough to commit.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

MAX_POINTS = 64
CURVE_DECIMALS = 4  # nats: 1e-4 is under a pixel of any loss plot, and a third of the characters of a float64
WIDTH = 120
TRAIN_KEYS = ("step", "tokens", "loss")
EVAL_KEYS = ("step", "tokens", "val_ce")


def downsample(rows: list[dict], keys: tuple[str, ...], max_points: int = MAX_POINTS) -> dict[str, list]:
    """``{key: [values]}`` of at most ``max_points`` of ``rows`` (the first, the last and evenly spaced
    ones between; values copied, never averaged)."""
    n = len(rows)
    if n > max_points:
        picked = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
        rows = [rows[i] for i in picked]
    return {key: [r.get(key) for r in rows] for key in keys}


def curves(rows: list[dict], max_points: int = MAX_POINTS) -> dict[str, dict[str, list]]:
    """A run's curves from its metrics rows: ``{"train": {step, tokens, loss}, "eval": {step, tokens,
    val_ce}}``, each downsampled to ``max_points``, the losses rounded to :data:`CURVE_DECIMALS` places."""
    train = [r for r in rows if r.get("kind") == "train" and r.get("loss") is not None]
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("val_ce") is not None]
    return {
        "train": _rounded(downsample(train, TRAIN_KEYS, max_points), "loss"),
        "eval": _rounded(downsample(evals, EVAL_KEYS, max_points), "val_ce"),
    }


def _rounded(columns: dict[str, list], key: str) -> dict[str, list]:
    columns[key] = [None if v is None else round(float(v), CURVE_DECIMALS) for v in columns[key]]
    return columns


def source_commit() -> str | None:
    """The git commit of the drmlab source in use (with ``+dirty`` when it has uncommitted changes), or
    None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def invoked_command(argv: list[str] | None = None) -> str:
    """The command line this process was started with, as ``drmlab VERB ...`` when it is the CLI."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name in ("drmlab", "__main__.py"):
        argv[0] = "drmlab"
    return shlex.join(argv)


def provenance(
    settings: dict | None = None, *, command: str | None = None, commit: str | None = None, date: str | None = None
) -> dict:
    """``{"command", "commit", "date", "settings"}`` of a result produced now (or as given)."""
    from drmlab import __version__

    return {
        "command": command if command is not None else invoked_command(),
        "commit": commit if commit is not None else (source_commit() or f"drmlab {__version__}"),
        "date": date if date is not None else datetime.date.today().isoformat(),
        "settings": settings if settings is not None else {},
    }


def _is_flat(value) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value)


def dumps(obj, width: int = WIDTH) -> str:
    """``obj`` as JSON: one space of indent; a container whose compact form fits in ``width`` (with its
    indent and key), and every list of scalars, on one line."""

    def render(value, indent: int, prefix: str) -> str:
        compact = json.dumps(value, separators=(", ", ": "))
        if not isinstance(value, (dict, list)) or _is_flat(value) or indent + len(prefix) + len(compact) <= width:
            return compact
        pad = " " * (indent + 1)
        if isinstance(value, dict):
            items = [
                f"{pad}{json.dumps(str(k))}: " + render(v, indent + 1, json.dumps(str(k)) + ": ")
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}" if items else "{}"
        items = [pad + render(v, indent + 1, "") for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]" if items else "[]"

    return render(obj, 0, "") + "\n"


def write(path: str | Path, obj) -> None:
    """Write ``obj`` with :func:`dumps` to ``path`` atomically (a temporary file, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(dumps(obj))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
