"""TensorBoard event files of a run: a metrics sink that turns every row of metrics.jsonl into scalars.

metrics.jsonl stays the one source of truth (:class:`drmlab.runs.MetricsLog` writes each row there
first, then hands it to its sinks). :class:`TensorBoardSink` writes a row of kind ``K`` as the
scalars ``K/FIELD`` at ``global_step = row["step"]`` -- nested fields joined by ``/``, so an
evaluation's DRM diagnostics become ``eval/diagnostics/dimD_mean`` and so on -- leaving out the
step and token axes, the wall clock and constants (:data:`NOT_SCALARS`); a ``resume`` row records an
event, not a measurement, and gives no scalars. The event files live in ``RUN_DIR/tensorboard/``
(``tensorboard --logdir RUN_DIR`` or a folder of runs).

**Resuming** never duplicates a step: on opening, the sink deletes the event files already in the
folder and writes the kept rows of metrics.jsonl again (the trainer has already cut the rows after
the checkpoint it resumes from), then appends the new rows. The folder therefore always equals
metrics.jsonl, even when the previous process was killed before flushing its events, or ran without
``--tensorboard``. The new file starts with a ``SessionLog.START`` at step 0 (``purge_step=0``), so a
TensorBoard that is watching the folder drops what it read from the deleted file instead of drawing
it twice.

:func:`require_tensorboard` is the one check for the package (``pip install 'drmlab[tensorboard]'``);
it imports nothing heavy, so the command line runs it before loading any corpus.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable
from pathlib import Path

EVENT_FILE_PREFIX = "events.out.tfevents."
MISSING_MESSAGE = "--tensorboard needs the tensorboard package: pip install 'drmlab[tensorboard]'"
# Row fields that are axes, clocks or constants rather than measurements.
NOT_SCALARS = ("kind", "step", "tokens", "elapsed", "val_windows")
# Row kinds that record an event (what changed on resuming), not a measurement.
EVENT_KINDS = ("resume",)
FLUSH_SECONDS = 30


class TensorBoardMissing(ImportError):
    """``tensorboard=True`` without the tensorboard package; the message says how to install it."""


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def require_tensorboard() -> None:
    """Raise :class:`TensorBoardMissing` (one line) when the tensorboard package is not installed."""
    if not tensorboard_available():
        raise TensorBoardMissing(MISSING_MESSAGE)


def row_scalars(row: dict) -> list[tuple[str, float]]:
    """The ``(tag, value)`` scalars of one metrics row (module docstring); booleans, strings, lists
    and non-finite numbers are not scalars."""
    kind = row.get("kind")
    if kind is None or kind in EVENT_KINDS or "step" not in row:
        return []
    out: list[tuple[str, float]] = []

    def walk(prefix: str, values: dict) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                walk(f"{prefix}/{key}", value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.append((f"{prefix}/{key}", float(value)))

    walk(str(kind), {k: v for k, v in row.items() if k not in NOT_SCALARS})
    return out


class TensorBoardSink:
    """Writes metrics rows as TensorBoard scalars into ``log_dir``; ``history`` (the rows already in
    metrics.jsonl) replaces whatever event files were there. A sink of :class:`drmlab.runs.MetricsLog`."""

    def __init__(self, log_dir: str | Path, history: Iterable[dict] = ()):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            for old in self.log_dir.glob(EVENT_FILE_PREFIX + "*"):
                old.unlink()
        except OSError as exc:
            raise OSError(f"could not prepare {self.log_dir} for TensorBoard: {exc.strerror or exc}") from None
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=0, flush_secs=FLUSH_SECONDS)
        for row in history:
            self._add(row)
        self.writer.flush()

    def _add(self, row: dict) -> None:
        step = int(row["step"]) if "step" in row else None
        for tag, value in row_scalars(row):
            self.writer.add_scalar(tag, value, global_step=step)

    def write(self, row: dict) -> None:
        self._add(row)
        if row.get("kind") != "train":  # evaluations are rare: let a watching TensorBoard see them at once
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def open_sink(run_path: str | Path, history: Iterable[dict] = ()) -> TensorBoardSink:
    """The sink of the run in ``run_path``: event files in ``run_path/tensorboard``."""
    from drmlab.runs import TENSORBOARD_DIR

    return TensorBoardSink(Path(run_path) / TENSORBOARD_DIR, history)
