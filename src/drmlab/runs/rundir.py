"""A run directory as one object (docs/runs.md, "What a run directory promises"; docs/architecture.md section 2).

:class:`RunDir` is the facade every reader and writer of a run goes through; it composes the modules of
:mod:`drmlab.runs`: :mod:`~drmlab.runs.layout` (its file names), :mod:`~drmlab.runs.lock` (the writer's
lock), :mod:`~drmlab.runs.jsonio` (config and summary as atomic JSON), :mod:`~drmlab.runs.metrics`
(metrics.jsonl), :mod:`~drmlab.runs.checkpoint` (the atomic commit and the checks on load) and
:mod:`~drmlab.runs.loading` (the run's model).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from . import checkpoint, config_seal, loading, orphans
from .jsonio import jsonable, make_dir, read_json, write_json_atomic
from .layout import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    CONFIG_SEAL_FILE,
    EVAL_FILE,
    LOCK_FILE,
    METRICS_FILE,
    POINTER_FILE,
    RUN_FILES,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    RunFile,
    holds_run,
)
from .lock import RunLock
from .metrics import MetricsLog, missing_rows, prefix_problem, read_rows, truncate


class RunDir:
    """One run directory: ``RunDir(path)``; nothing is created until something is written."""

    config_path = RunFile(CONFIG_FILE)
    metrics_path = RunFile(METRICS_FILE)
    summary_path = RunFile(SUMMARY_FILE)
    eval_path = RunFile(EVAL_FILE)
    pointer_path = RunFile(POINTER_FILE)
    seal_path = RunFile(CONFIG_SEAL_FILE)

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # the folder
    def create(self) -> RunDir:
        make_dir(self.path)
        return self

    def lock(self) -> RunLock:
        """Take the writer's lock (raises :class:`~drmlab.runs.lock.RunLockedError` naming the holder)."""
        return RunLock(self.path / LOCK_FILE).acquire()

    def holds_run(self) -> bool:
        """Whether a run was started here (a config, metrics, checkpoint or summary exists)."""
        return holds_run(self.path)

    def describe(self) -> str:
        """``a finished run (step 611)`` / ``an interrupted run (checkpoint at step 98)`` / ``a run that wrote
        no checkpoint``."""
        summary = self.read_summary()
        if summary and summary.get("finished"):
            return f"a finished run (step {summary.get('steps')})"
        if self.has_checkpoint():
            return f"an interrupted run (checkpoint at step {self.read_pointer().get('step')})"
        return "a run that wrote no checkpoint"

    def remove_run(self) -> None:
        """Delete this run's own files (config, metrics, summary, eval.json, checkpoints, TensorBoard
        event files); nothing else."""
        foreign = self.foreign_reason()
        if foreign is not None:
            raise FileExistsError(f"{self.path} is not a drmlab run ({foreign}); nothing was deleted")
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        self._remove_own_checkpoints()
        shutil.rmtree(self.path / TENSORBOARD_DIR, ignore_errors=True)
        self.clean_orphans()

    def foreign_reason(self) -> str | None:
        """Why this directory holds another tool's files rather than a drmlab run, or None: a config.json
        that is not a run's (a JSON object with model, train and runtime), or a checkpoints/ folder holding
        folders drmlab did not write."""
        if self.config_path.is_file():
            try:
                config = read_json(self.config_path)
            except Exception:
                config = None
            if not isinstance(config, dict) or not {"model", "train", "runtime"} <= set(config):
                return f"{CONFIG_FILE} is not a drmlab run's"
        folder = self.path / CHECKPOINTS_DIR
        if folder.is_dir():
            others = sorted(e.name for e in folder.iterdir() if checkpoint.own_manifest(e) is None)
            if others:
                return f"{CHECKPOINTS_DIR}/ holds {', '.join(others[:3])}, which drmlab did not write"
        return None

    def _remove_own_checkpoints(self) -> None:
        folder = self.path / CHECKPOINTS_DIR
        if not folder.is_dir():
            return
        for entry in folder.iterdir():
            if checkpoint.own_manifest(entry) is not None:
                shutil.rmtree(entry, ignore_errors=True)
        try:
            folder.rmdir()
        except OSError:  # not empty: what is left is not this run's
            pass

    def clean_orphans(self) -> list[str]:
        """Remove what a killed writer left (:func:`drmlab.runs.orphans.clean_orphans`); only while
        holding the lock. Returns the names removed."""
        return orphans.clean_orphans(self.path)

    def clear_outputs(self) -> None:
        """Forget a previous run's metrics, checkpoint and summary before a fresh start."""
        for name in (METRICS_FILE, SUMMARY_FILE, EVAL_FILE, POINTER_FILE):
            (self.path / name).unlink(missing_ok=True)
        self._remove_own_checkpoints()

    # config and summary
    def has_config(self) -> bool:
        return self.config_path.is_file()

    def read_config(self, *, accept_edited: bool = False) -> dict:
        """config.json, verified against its seal (:mod:`~drmlab.runs.config_seal`): an edited one raises
        :class:`~drmlab.runs.config_seal.EditedConfigError` listing the changed fields, unless
        ``accept_edited`` (then see :meth:`accept_config_edits`)."""
        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory: {self.config_path} is missing")
        config = read_json(self.config_path)
        if not accept_edited:
            changed = config_seal.edits(self.config_path, self.seal_path, config)
            if changed:
                raise config_seal.refusal(self.config_path, changed)
        return config

    def write_config(self, config: dict) -> None:
        """Write config.json and its seal."""
        config_seal.write_sealed(self.config_path, self.seal_path, config)

    def accept_config_edits(self) -> list[str]:
        """Take an edited config.json as the run's (the user said ``--accept-edited-config``): seal it again
        and record the changed fields in metrics.jsonl (a ``kind: config_edited`` row). Returns them."""
        config = read_json(self.config_path)
        changed = config_seal.edits(self.config_path, self.seal_path, config)
        if changed:
            log = self.metrics_log()
            log.log({"kind": "config_edited", "changed": changed})
            log.close()
            self.write_config(config)
        return changed

    def read_summary(self) -> dict | None:
        """The summary, or None when the run has none yet."""
        return read_json(self.summary_path) if self.summary_path.is_file() else None

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_path, jsonable(summary))

    def finished_summary(self) -> dict | None:
        """The summary of a finished, rescored run, else None."""
        summary = self.read_summary()
        return summary if summary and summary.get("finished") and summary.get("val_ce") is not None else None

    # metrics (drmlab.runs.metrics)
    def read_metrics(self) -> list[dict]:
        """The rows of ``metrics.jsonl`` (a half-written last line is skipped)."""
        return read_rows(self.metrics_path)

    def truncate_metrics(self, step: int, record: dict | None = None) -> str | None:
        """Drop rows logged after ``step`` (work lost with an interrupted run) before resuming; returns what is
        missing or damaged of the rows up to ``step`` (``record``: the checkpoint's ``metrics`` entry;
        :func:`drmlab.runs.metrics.truncate`), or None."""
        return truncate(self.metrics_path, step, record)

    def metrics_problem(self) -> str | None:
        """What is missing or damaged of metrics.jsonl before the committed checkpoint (its recorded length and
        sha256; for a run of an older drmlab, a train row per step), or None; None too without a readable
        checkpoint (a damaged one is said by its own check)."""
        try:
            state = self.read_state()
        except (OSError, ValueError):
            return None
        step = state.get("step") if isinstance(state, dict) else None
        if not isinstance(step, int):
            return None
        if isinstance(state.get("metrics"), dict):
            return prefix_problem(self.metrics_path, state["metrics"], step)
        return missing_rows(self.metrics_path, step)

    def metrics_log(self) -> MetricsLog:
        return MetricsLog(self.metrics_path)

    # the checkpoint (drmlab.runs.checkpoint)
    def has_checkpoint(self) -> bool:
        """A pointer, or a checkpoint folder of this run that a lost pointer can be recovered from."""
        folder = self.path / CHECKPOINTS_DIR
        return self.pointer_path.is_file() or (
            folder.is_dir() and any(checkpoint.own_manifest(entry) is not None for entry in folder.iterdir())
        )

    def read_pointer(self) -> dict:
        return checkpoint.read_pointer(self.path)

    def checkpoint_dir(self) -> Path:
        return checkpoint.checkpoint_dir(self.path)

    def read_state(self) -> dict:
        return checkpoint.read_state(self.path)

    def save_checkpoint(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        state: dict,
        *,
        full_state: tuple[dict[str, torch.Tensor], dict | None] | None = None,
    ) -> Path:
        """Write and commit a checkpoint (:func:`drmlab.runs.checkpoint.save_checkpoint`); returns its folder."""
        return checkpoint.save_checkpoint(self.path, model, optimizer, state, full_state=full_state)

    def resolve_checkpoint(self, only: tuple[str, ...] | None = None) -> tuple[Path, dict, str | None]:
        """(folder, pointer, note) after checking every file (of ``only``'s names when given); ``note`` says how
        a lost or damaged pointer was recovered, or is None (:func:`drmlab.runs.checkpoint.resolve_checkpoint`)."""
        return checkpoint.resolve_checkpoint(self.path, only)

    def verify_checkpoint(self) -> tuple[Path, dict]:
        """(folder, pointer) after checking every file's size and sha256; one-line errors name the file."""
        return checkpoint.verify_checkpoint(self.path)

    def read_checkpoint(
        self, model: torch.nn.Module, *, optimizer: bool = True, restore_rng: bool = True
    ) -> tuple[dict, dict[str, torch.Tensor], dict | None]:
        """(trainer state, full model state dict, optimizer state dict or None) for a sharded ``model``
        (:func:`drmlab.runs.checkpoint.read_checkpoint`)."""
        return checkpoint.read_checkpoint(self.path, model, optimizer=optimizer, restore_rng=restore_rng)

    def load_checkpoint(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, restore_rng: bool = True
    ) -> dict:
        """Load weights (and optimizer state, RNG) into ``model`` after verifying the checksums; return
        the trainer state."""
        return checkpoint.load_checkpoint(self.path, model, optimizer, restore_rng=restore_rng)

    # the model (drmlab.runs.loading, the one module of drmlab.runs that imports drmlab.models)
    def build_model(self, config: dict | None = None) -> torch.nn.Module:
        """The run's model, freshly built (untrained) from its config.json."""
        return loading.build_model(self, config)

    def load_model(
        self, device: str | torch.device | None = "cpu", *, allow_non_finite: bool = False
    ) -> tuple[torch.nn.Module, dict, dict]:
        """(the model with the checkpoint's weights in eval mode, the run's config, trainer state).
        Weights holding NaN or infinity are refused unless ``allow_non_finite``."""
        return loading.load_model(self, device, allow_non_finite=allow_non_finite)


def load_run_model(run_dir: str | Path, device: str | torch.device | None = "cpu"):
    """(model with the checkpoint's weights, the run's config.json dict, trainer state)."""
    return RunDir(run_dir).load_model(device)
