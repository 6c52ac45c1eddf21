"""The training loss of the trainer's equation: a window ``w`` [B, T + 1] is scored as
``CE(model(w[:, :T], step=k).logits[:, t], w[:, t + 1])`` (the explicit next-token target; no model is ever
handed labels to shift), mean over the targets that are not :data:`IGNORE_INDEX`, plus ``aux["loss_aux"]``
when the model gives one. :func:`lm_loss_fn` is the default loss piece of :mod:`drmlab.training.pieces`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drmlab.training.batches import BatchSource
from drmlab.training.pieces import LossFn

IGNORE_INDEX = BatchSource.IGNORE_INDEX  # a target that is not scored


def lm_loss(
    model: torch.nn.Module, window: torch.Tensor, step: int | None = None, *, bf16: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, next-token CE) of ``window`` [B, T + 1]: logits[:, t] are scored against window[:, t + 1]."""
    return targets_loss(model, window[:, :-1], window[:, 1:], step, bf16=bf16)


def targets_loss(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    step: int | None = None,
    *,
    bf16: bool = False,
    scored_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, CE) of ``model(inputs)``: logits[:, t] scored against targets[:, t], mean over the
    targets that are not :data:`IGNORE_INDEX`; the total adds ``aux["loss_aux"]`` when the model gives one.
    ``scored_only``: the model's head runs at the scored positions only (``logits_at``,
    :mod:`drmlab.models.inputs`) -- the same loss up to float rounding, and much cheaper when few
    positions are scored (MQAR's queries) and the vocabulary is large."""
    device_type = inputs.device.type
    scored = targets != IGNORE_INDEX if scored_only else None
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        out = model(inputs, step=step) if scored is None else model(inputs, step=step, logits_at=scored)
    logits = out.logits.float()
    if scored is None:
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    else:
        ce = F.cross_entropy(logits, targets[scored])
    aux = out.aux.get("loss_aux") if out.aux else None
    loss = ce + aux.float() if aux is not None else ce
    return loss, ce


def lm_loss_fn(bf16: bool = False, scored_only: bool = False) -> LossFn:
    """The default loss piece: :func:`targets_loss` of the batch (inputs, targets), its CE as the row's ``ce``."""

    def loss_fn(model: torch.nn.Module, batch: tuple, step: int) -> tuple[torch.Tensor, dict]:
        loss, ce = targets_loss(model, batch[0], batch[1], step, bf16=bf16, scored_only=scored_only)
        return loss, {"ce": ce}

    return loss_fn
