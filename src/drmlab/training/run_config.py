"""config.json of a run (:mod:`drmlab.runs` writes it): the model, preset and overrides, the model's
config, the train settings and what they derive to, the caller's run info and the runtime."""

from __future__ import annotations

import dataclasses
import platform

import numpy as np
import torch

from drmlab.models.parameters import count_parameters
from drmlab.runs import jsonable
from drmlab.training.config import TrainConfig
from drmlab.training.run_info import RunInfo


def resolved_config(model, cfg: TrainConfig, run_info: RunInfo | None, world_size: int, device: torch.device) -> dict:
    """config.json of a run: model, preset, overrides, the model's config, train settings, what
    they derive to, the caller's ``run_info`` (data provenance, tokenizer) and the runtime."""
    import drmlab

    info = run_info.record() if run_info is not None else {}
    config = getattr(model, "config", None)
    return jsonable(
        {
            "model": info.pop("model", getattr(model, "model_name", type(model).__name__)),
            "preset": info.pop("preset", getattr(model, "preset", None)),
            "overrides": info.pop("overrides", {}),
            "model_config": dataclasses.asdict(config)
            if config is not None and dataclasses.is_dataclass(config)
            else None,
            "params": count_parameters(model),
            "train": dataclasses.asdict(cfg),
            "derived": {
                "tokens_per_step": cfg.tokens_per_step,
                "total_steps": cfg.total_steps,
                "total_tokens": cfg.total_steps * cfg.tokens_per_step,
                "warmup_steps": cfg.warmup_steps,
                "eval_every_steps": cfg.eval_every_steps,
                "checkpoint_every_steps": cfg.checkpoint_every_steps,
            },
            **info,
            "runtime": {
                "world_size": world_size,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "drmlab": drmlab.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
        }
    )
