"""The names inside a run directory (README, "Runs that never lose work"; docs/architecture.md section 2).

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
* ``summary.json`` -- the finished run's numbers; ``eval.json`` -- a later ``drmlab eval``;
* ``tensorboard/`` -- with ``--tensorboard``, metrics.jsonl's rows as TensorBoard event files;
* ``.lock`` -- held (``flock``) by the one process writing the run; it names that process.

These names are the on-disk format: committed studies (``studies/*/runs/*``) are read with them.
"""

from __future__ import annotations

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
# Files a run writes at its top level (what --overwrite removes; nothing else is touched).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, EVAL_FILE, POINTER_FILE, CONFIG_SEAL_FILE)
# Leftovers of a killed writer: a checkpoint being written, metrics.jsonl being truncated.
TEMP_CHECKPOINT_PREFIX = ".checkpoint-"
TEMP_METRICS_FILE = METRICS_FILE + ".tmp"


def checkpoint_name(step: int) -> str:
    """``checkpoints/``'s folder for the checkpoint of ``step``: ``step-00000042``."""
    return f"step-{step:08d}"


def holds_run(run: Path) -> bool:
    """Whether a run was started in ``run`` (a config, metrics, checkpoint or summary exists)."""
    return any((run / name).exists() for name in RUN_FILES) or (run / CHECKPOINTS_DIR).exists()


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
