"""The optimizer (AdamW) and the learning-rate schedules (constant, warm-up + cosine).

The schedule is a pure function of the step, so there is no scheduler state to checkpoint.
"""

from __future__ import annotations

import math

import torch

from drmlab.training.config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay on all of them unless ``decay_all_params`` is off."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.decay_all_params:
        groups = [{"params": params, "weight_decay": cfg.weight_decay}]
    else:
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based).

    Linear warm-up over ``cfg.warmup_steps`` (lr * step / warmup), then either constant or a
    cosine from ``lr`` down to ``min_lr_ratio * lr`` at the last step.
    """
    warmup, total = cfg.warmup_steps, cfg.total_steps
    if warmup and step <= warmup:
        return cfg.lr * step / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, total - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))
