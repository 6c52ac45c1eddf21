"""The names inside a run directory (docs/runs.md, "What a run directory promises"; docs/architecture.md section 2).

A run directory holds

* ``config.json`` -- the resolved run (model, preset, overrides, train settings, data provenance);
  ``config.seal.json`` -- its sha256 and the copy it was taken of, so an edit is refused, with the
  fields it changed (:mod:`~drmlab.runs.config_seal`);
* ``metrics.jsonl`` -- one JSON row per optimizer step (``kind: train``), per sampled evaluation
  (``kind: eval``) and per resume (``kind: resume``, with any settings changed on resuming);
* ``checkpoint.json`` -- the pointer to the committed checkpoint: its folder, step and the sha256
  and size of each of its files;
* ``checkpoints/step-NNNNNNNN/`` -- the checkpoint: ``model.safetensors`` (the state dict, tied
  tensors once), ``optimizer.safetensors`` (optimizer tensors as ``state.<param index>.<name>`` and
  the torch RNG state(s) as ``rng.*``), ``trainer_state.json`` (step, tokens, timings, optimizer
  hyper-parameters and its non-tensor state) and ``manifest.json`` (the same sums as the pointer);
* ``summary.json`` -- the finished run's numbers; ``eval.json`` -- a later ``drmlab eval``; ``eval-carried.json``,
  ``eval-by-position.json`` / ``.png`` and ``eval-carried-by-position.json`` / ``.png`` -- its long-context modes;
* ``tensorboard/`` -- with ``--tensorboard``, metrics.jsonl's rows as TensorBoard event files;
* ``.lock`` -- held (``flock``) by the one process writing the run; it names that process.

These names are the on-disk format: committed studies (``studies/*/runs/*``) are read with them.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVAL_FILE = "eval.json"
POINTER_FILE = "checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"  # event files written with --tensorboard (drmlab.training.tensorboard)
LOCK_FILE = ".lock"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
CONFIG_SEAL_FILE = "config.seal.json"  # config.json's sha256 and the copy it was taken of
# The long-context evaluation's outputs (drmlab eval --carry-state / --by-position; each figure beside its JSON)
EVAL_CONTEXT_FILES = (
    "eval-carried.json",
    "eval-by-position.json",
    "eval-by-position.png",
    "eval-carried-by-position.json",
    "eval-carried-by-position.png",
)
# Files a run writes at its top level (what --overwrite removes; nothing else is touched).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, EVAL_FILE, POINTER_FILE, CONFIG_SEAL_FILE, *EVAL_CONTEXT_FILES)
# Leftovers of a killed writer: a checkpoint being written, metrics.jsonl being truncated.
TEMP_CHECKPOINT_PREFIX = ".checkpoint-"
TEMP_METRICS_FILE = METRICS_FILE + ".tmp"


def checkpoint_name(step: int) -> str:
    """``checkpoints/``'s folder for the checkpoint of ``step``: ``step-00000042``."""
    return f"step-{step:08d}"


def holds_run(run: Path) -> bool:
    """Whether a run was started in ``run`` (a config, metrics, checkpoint or summary exists)."""
    return any((run / name).exists() for name in RUN_FILES) or (run / CHECKPOINTS_DIR).exists()


def _is_run(folder: Path) -> bool:
    """Whether ``folder`` is a run directory: it holds a run's config or checkpoint pointer."""
    return (folder / CONFIG_FILE).is_file() or (folder / POINTER_FILE).is_file()


OWN_FOLDERS = (CHECKPOINTS_DIR, TENSORBOARD_DIR)  # folders of a run whose every file is the run's


def run_owning(path: str | Path) -> tuple[Path, str] | None:
    """(the run directory, what of it) when ``path`` is one of an existing run's own files (config,
    metrics, pointer, summary, eval.json, seal, lock) or lies inside its checkpoints/ or tensorboard/
    folder (or is that folder); None otherwise. Links are followed: the place written is judged."""
    target = Path(os.path.realpath(path))
    if target.name in RUN_FILES + (LOCK_FILE,) and _is_run(target.parent):
        return target.parent, target.name
    for folder in [target, *target.parents]:
        if folder.name in OWN_FOLDERS and _is_run(folder.parent):
            return folder.parent, f"inside {folder.name}/"
    return None


def refuse_run_output(path: str | Path, flag: str, instead: str | Path | None = None, *, allow=()) -> None:
    """Refuse, in one line naming ``flag`` and ``path``, an output a verb would write over an existing run's
    own files (:func:`run_owning`); ``instead``: a place to suggest; ``allow``: paths that may be written
    (a verb's own output in the run, e.g. eval's eval.json)."""
    owner = run_owning(path)
    if owner is None or any(os.path.realpath(path) == os.path.realpath(a) for a in allow):
        return
    run, what = owner
    where = f" (e.g. {flag} {instead})" if instead is not None else ""
    raise FileExistsError(
        f"{flag} {path} is {what} of the run in {run}: writing there would destroy the run's own files; "
        f"write it elsewhere{where}"
    )


class RunFile:
    """A read-only attribute of a run directory object: the path of its file ``name`` (``run.path / name``)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, run, owner=None) -> Path:
        if run is None:
            return self
        return run.path / self.name

    def __set__(self, run, value) -> None:
        raise AttributeError(f"the path of {self.name} is fixed by the run directory's layout")
