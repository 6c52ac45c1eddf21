"""The optimizer (AdamW) and the learning-rate schedules (constant, warm-up + cosine).

The schedule is a pure function of the step, so there is no scheduler state to checkpoint. An
optimizer with parameter groups at their own rates (a study's ``optimizer_builder``,
:mod:`drmlab.training.pieces`) runs the same schedule from each group's own base rate.
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


def lr_at(step: int, cfg: TrainConfig, peak: float | None = None) -> float:
    """Learning rate of optimizer step ``step`` (1-based) for a group whose base rate is ``peak``
    (default ``cfg.lr``).

    Linear warm-up over ``cfg.warmup_steps`` (peak * step / warmup), then either constant or a
    cosine from ``peak`` down to ``min_lr_ratio * peak`` at the last step.
    """
    lr = cfg.lr if peak is None else peak
    warmup, total = cfg.warmup_steps, cfg.total_steps
    if warmup and step <= warmup:
        return lr * step / warmup
    if cfg.schedule == "constant":
        return lr
    span = max(1, total - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    floor = cfg.min_lr_ratio * lr
    return floor + 0.5 * (lr - floor) * (1.0 + math.cos(math.pi * progress))
