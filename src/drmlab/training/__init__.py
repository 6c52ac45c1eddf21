"""Training: the config (``config``), batches (``batches``), AdamW and schedules (``optim``),
atomic safetensors checkpoints (``checkpoint``), torchrun plumbing (``distributed``), the loop
(``trainer``) and the ``drmlab train`` command (``command``)."""

from drmlab.training.config import PRESET_DEFAULTS, TrainConfig, parse_tokens, resolve_train_config
from drmlab.training.trainer import NonFiniteLossError, lm_loss, read_metrics, train

__all__ = [
    "PRESET_DEFAULTS",
    "NonFiniteLossError",
    "TrainConfig",
    "lm_loss",
    "parse_tokens",
    "read_metrics",
    "resolve_train_config",
    "train",
]
