"""The optimizer (AdamW) and the learning-rate schedules (constant, warm-up + cosine).

AdamW runs torch's fused implementation (one kernel over all parameters, ``fused=True``) wherever it
applies -- every parameter a floating tensor on the CPU or a CUDA device -- and the per-parameter loop
otherwise or under :func:`drmlab.ops.fusion.plain_reference` / ``DRMLAB_NO_FUSED=1``. Both compute the
same update to round-off (tests/training/test_optim.py); the fused one saves 3-7 ms of a 100-130 ms
float32 step at preset tiny (``docs/drm.md`` appendix A.4.6). A resumed run keeps the implementation
its checkpoint was written with (torch restores the group's ``fused`` flag).

The schedule is a pure function of the step, so there is no scheduler state to checkpoint. An
optimizer with parameter groups at their own rates (a study's ``optimizer_builder``,
:mod:`drmlab.training.pieces`) runs the same schedule from each group's own base rate.
"""

from __future__ import annotations

import math

import torch

from drmlab.ops.fusion import fused_enabled
from drmlab.training.config import TrainConfig

FUSED_DEVICES = ("cpu", "cuda")


def adamw(groups: list[dict], **settings) -> torch.optim.AdamW:
    """``torch.optim.AdamW(groups, **settings)``, fused where every parameter allows it (module docstring)."""
    params = [p for group in groups for p in group["params"]]
    fused = (
        fused_enabled()
        and bool(params)
        and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
        and len({p.device for p in params}) == 1
    )
    return torch.optim.AdamW(groups, **settings, **({"fused": True} if fused else {}))


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
    return adamw(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


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
