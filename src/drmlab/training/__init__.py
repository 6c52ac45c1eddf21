"""Training: the config (``config``), batch sources (``batches``), AdamW and schedules (``optim``),
torchrun plumbing (``distributed``), ``torch.compile`` and its one-line errors (``compiling``), the
loss (``losses``) and the loop (``trainer``, with its parts: ``run_config``, ``resume``, ``stops``,
``evaluating``, ``checkpointing``, ``measuring``, ``finishing``), and the clock that leaves a
suspension out of a run's times (``pauses``). Run directories and checkpoints are
:mod:`drmlab.runs`.

Names are loaded on first use, so ``drmlab.training.config`` can be read without importing torch.
"""

import importlib

_EXPORTS = {
    "PRESET_DEFAULTS": "drmlab.training.config",
    "TrainConfig": "drmlab.training.config",
    "parse_tokens": "drmlab.training.config",
    "resolve_train_config": "drmlab.training.config",
    "CompileError": "drmlab.training.compiling",
    "NonFiniteLossError": "drmlab.training.trainer",
    "lm_loss": "drmlab.training.trainer",
    "read_metrics": "drmlab.runs",
    "train": "drmlab.training.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'drmlab.training' has no attribute {name!r}")
