"""``metrics.jsonl``: appending a run's rows, reading them, dropping lost ones on resume (docs/runs.md, "What a
run directory promises"; docs/guide.md section 5, TensorBoard).

One JSON object a line: a row per optimizer step (``kind: train``), per sampled evaluation (``kind: eval``)
and per resume (``kind: resume``). A killed writer may leave a half-written last line; readers skip it. On
resume, rows logged after the checkpoint's step (work the kill lost) are dropped by an atomic rewrite.
Each checkpoint records the length and sha256 of the file as it stood at the commit (:meth:`MetricsLog.committed`);
resume and ``drmlab report`` check that prefix (:func:`prefix_problem`), so a deleted, truncated or edited
row before the checkpoint is said, not kept silently.
"""

from __future__ import annotations

import hashlib
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


def prefix_problem(path: Path, record, step: int) -> str | None:
    """What differs between ``path`` and ``record`` (``{"bytes", "sha256"}`` of the file when the checkpoint of
    ``step`` was committed), or None when the file starts with those bytes (or there is no record: a run of an
    older drmlab)."""
    if not isinstance(record, dict) or not isinstance(record.get("bytes"), int):
        return None
    where = f"when the checkpoint of step {step} was committed"
    if not path.is_file():
        return f"{path} is missing; it held {record['bytes']:,} bytes {where}: the run's record is lost"
    with open(path, "rb") as handle:
        head = handle.read(record["bytes"])
    if len(head) < record["bytes"]:
        return f"{path} has {len(head):,} bytes, {record['bytes']:,} {where} (truncated): rows are lost"
    if hashlib.sha256(head).hexdigest() != record.get("sha256"):
        return f"{path} does not match the sha256 recorded {where} (rows before it were edited or damaged)"
    return None


def truncate(path: Path, step: int, record=None) -> str | None:
    """Drop the rows of ``path`` logged after ``step`` (work lost with an interrupted run) before resuming.
    Returns what is missing or damaged of the rows up to ``step`` (one ``train`` row per optimizer step, and
    the bytes ``record`` of the checkpoint says: :func:`prefix_problem`), or None when they are all there."""
    damaged = prefix_problem(path, record, step)
    parsed = _parse(path) if path.is_file() else []  # a line that is not a row is refused by its number
    missing = missing_rows(path, step, parsed)
    if path.is_file():
        _rewrite(path, [line for line, row in parsed if row.get("step", 0) <= step])
    if damaged is not None and not path.is_file():
        return damaged  # the one statement of a deleted file
    return "; ".join(p for p in (damaged, missing) if p) or None


def missing_rows(path: Path, step: int, parsed: list[tuple[str, dict]] | None = None) -> str | None:
    """Which ``train`` rows of steps 1..``step`` ``path`` lacks (one per optimizer step), or None."""
    if parsed is None:
        parsed = _parse(path) if path.is_file() else []
    have = {row["step"] for _, row in parsed if row.get("kind") == "train" and 0 < row.get("step", 0) <= step}
    missing = [s for s in range(1, step + 1) if s not in have]
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
        self.digest, self.bytes = hashlib.sha256(), 0  # of the whole file, kept rows and new ones
        if self.handle is not None and path.stat().st_size:
            kept = path.read_bytes()
            self.digest.update(kept)
            self.bytes = len(kept)

    def committed(self) -> dict | None:
        """``{"bytes", "sha256"}`` of the file as it stands (every row logged so far), for the checkpoint to
        record; None without a file."""
        if self.handle is None:
            return None
        self.handle.flush()
        return {"bytes": self.bytes, "sha256": self.digest.hexdigest()}

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if self.handle is not None:
            try:
                line = json.dumps(row) + "\n"
                self.handle.write(line)
                data = line.encode()
                self.digest.update(data)
                self.bytes += len(data)
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
