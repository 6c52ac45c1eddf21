"""``metrics.jsonl``: appending a run's rows, reading them, dropping lost ones on resume (README, "Runs that
never lose work" and "TensorBoard and HTML reports").

One JSON object a line: a row per optimizer step (``kind: train``), per sampled evaluation (``kind: eval``)
and per resume (``kind: resume``). A killed writer may leave a half-written last line; readers skip it. On
resume, rows logged after the checkpoint's step (work the kill lost) are dropped by an atomic rewrite.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .jsonio import disk_error
from .layout import METRICS_FILE


def _parse(path: Path) -> list[tuple[str, dict]]:
    """(line, row) of every row of ``path``. A half-written last line is skipped (a kill mid-write); any other
    line that is not a JSON object with an integer ``step`` (when it has one) is refused by its number."""
    parsed = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path} line {number} is not valid JSON; the file is damaged") from None
            continue
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {number} is not a JSON object ({type(row).__name__}); the file is damaged")
        step = row.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{path} line {number} has step {step!r}, not an integer; the file is damaged")
        parsed.append((line, row))
    return parsed


def read_rows(path: Path) -> list[dict]:
    """The rows of the metrics file ``path`` (a half-written last line is skipped; damage names its line)."""
    return [row for _, row in _parse(path)]


def truncate(path: Path, step: int) -> str | None:
    """Drop the rows of ``path`` logged after ``step`` (work lost with an interrupted run) before resuming.
    Returns what is missing of the rows up to ``step`` (one ``train`` row per optimizer step: a file deleted,
    truncated or edited since), or None when they are all there."""
    parsed = _parse(path) if path.is_file() else []
    kept = [line for line, row in parsed if row.get("step", 0) <= step]
    have = {row["step"] for _, row in parsed if row.get("kind") == "train" and 0 < row.get("step", 0) <= step}
    missing = [s for s in range(1, step + 1) if s not in have]
    if path.is_file() or kept:
        _rewrite(path, kept)
    if not missing:
        return None
    where = "is missing" if not path.is_file() else f"lacks the train rows of {len(missing)} of the {step} steps"
    return f"{path} {where} before the checkpoint (first missing step {missing[0]}): those rows are lost"


def _rewrite(path: Path, kept: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")  # layout.TEMP_METRICS_FILE for metrics.jsonl
    try:
        with open(tmp, "w") as handle:
            handle.write("".join(k + "\n" for k in kept))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise disk_error(exc, path) from None


class MetricsLog:
    """Appends rows to ``metrics.jsonl`` (line-buffered) and keeps them; ``path=None`` keeps them only.

    ``sinks``: objects with ``write(row)`` and ``close()`` that receive every row after it is in the
    file (metrics.jsonl stays the one source of truth), e.g. TensorBoard's
    (:class:`drmlab.training.tensorboard.TensorBoardSink`)."""

    def __init__(self, path: Path | None, sinks=()):
        self.path = path
        try:
            self.handle = open(path, "a", buffering=1) if path is not None else None
        except OSError as exc:
            raise disk_error(exc, path) from None
        self.rows: list[dict] = []
        self.sinks = list(sinks)

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if self.handle is not None:
            try:
                self.handle.write(json.dumps(row) + "\n")
            except OSError as exc:
                raise disk_error(exc, self.path) from None
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl``."""
    return read_rows(Path(run_dir) / METRICS_FILE)
