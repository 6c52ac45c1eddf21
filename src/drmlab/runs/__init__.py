"""Run directories: their files, lock, atomic writes, checkpoints, metrics and model (docs/runs.md, "What a
run directory promises"; docs/architecture.md section 2).

Everything that reads or writes a run goes through :class:`RunDir`, a facade over one module per job:

* :mod:`~drmlab.runs.layout` -- the file names of a run directory (the on-disk format);
* :mod:`~drmlab.runs.jsonio` -- atomic JSON writes, reads that name their file, the one-line disk error;
* :mod:`~drmlab.runs.lock` -- the writer's ``flock`` naming its holder;
* :mod:`~drmlab.runs.metrics` -- metrics.jsonl: appending, reading, truncating on resume;
* :mod:`~drmlab.runs.checkpoint` -- the atomic commit (temporary folder, sha256 manifest, one rename,
  the pointer), the checks on load;
* :mod:`~drmlab.runs.orphans` -- what a killed writer left, removed by the next one;
* :mod:`~drmlab.runs.optimizer_state` -- the optimizer and RNG state as named tensors;
* :mod:`~drmlab.runs.rundir` -- :class:`RunDir` itself, and :func:`load_run_model`;
* :mod:`~drmlab.runs.loading` -- the run's model, for the facade (the only module here that imports
  :mod:`drmlab.models`).
"""

from __future__ import annotations

from .checkpoint import CHECKPOINT_FORMAT, CorruptCheckpointError, sha256_file, tied_names
from .config_seal import EditedConfigError
from .jsonio import jsonable, read_json, write_json_atomic
from .layout import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    EVAL_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    POINTER_FILE,
    RUN_FILES,
    STATE_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    refuse_run_output,
    run_owning,
)
from .loading import non_finite_parameters
from .lock import RunLock, RunLockedError, lock_holder
from .metrics import MetricsLog, read_metrics
from .rundir import RunDir, load_run_model

__all__ = [
    "EditedConfigError",
    "CHECKPOINTS_DIR",
    "CHECKPOINT_FORMAT",
    "CONFIG_FILE",
    "EVAL_FILE",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "METRICS_FILE",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "POINTER_FILE",
    "RUN_FILES",
    "STATE_FILE",
    "SUMMARY_FILE",
    "TENSORBOARD_DIR",
    "CorruptCheckpointError",
    "MetricsLog",
    "RunDir",
    "RunLock",
    "RunLockedError",
    "jsonable",
    "lock_holder",
    "load_run_model",
    "non_finite_parameters",
    "read_json",
    "read_metrics",
    "refuse_run_output",
    "run_owning",
    "sha256_file",
    "tied_names",
    "write_json_atomic",
]
