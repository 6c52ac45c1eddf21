"""The specialisation's losses (docs/mqar.md section 9): on a language batch the student's CE plus
``kd_weight T^2 KL(softmax(teacher / T) || softmax(student / T))`` per position against the frozen
teacher (the CE alone at ``kd_weight`` 0), on an MQAR batch the CE on the query positions (one per
pair); :class:`SpecialiseLoss` is the trainer's loss piece (:data:`drmlab.training.pieces.LossFn`)
choosing between them by the step's coin."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.experiments.specialise.batches import MixedBatches
from drmlab.experiments.specialise.curriculum import KD_WEIGHT, TEMPERATURE, Settings


def distillation_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = TEMPERATURE
) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) summed over the vocabulary, averaged over the
    positions [..., vocab]; computed in float32 or wider."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_student = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    positions = log_student.numel() // log_student.shape[-1]
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="sum") / positions


def next_token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean CE of ``logits`` [..., vocab] against every target, in float32 or wider."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def language_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = TEMPERATURE,
    kd_weight: float = KD_WEIGHT,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(CE + kd_weight T^2 KL, CE, KL) of a language batch: CE of the student against the next tokens."""
    logits = student_logits.to(torch.promote_types(student_logits.dtype, torch.float32))
    ce = next_token_ce(logits, targets)
    kl = distillation_kl(logits, teacher_logits, temperature)
    return ce + kd_weight * temperature**2 * kl, ce, kl


def mqar_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CE on the scored positions only (targets other than the ignore index: the queries, one per pair)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(dtype)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=mqar_distance.IGNORE)


class SpecialiseLoss:
    """``(student, (inputs, targets), step) -> (loss, row entries)``: the language loss against the
    frozen ``teacher`` or the MQAR loss, by the coin of ``step`` (the batch source's); both models at
    ``step=None``; plus the student's ``loss_aux`` when it gives one. Under ``settings.bf16`` both
    forwards run in a bf16 autocast and the losses widen the logits to float32. The row gets ``ce``, ``kd``
    (None on an MQAR batch), ``stage``, ``batch`` (language or mqar) and ``batch_tokens``."""

    def __init__(self, teacher: nn.Module, batches: MixedBatches, settings: Settings):
        self.teacher, self.batches, self.settings = teacher, batches, settings

    def _forward(self, model: nn.Module, inputs: torch.Tensor):
        with torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16, enabled=self.settings.bf16):
            return model(inputs, step=None)

    def __call__(self, model: nn.Module, batch: tuple, step: int) -> tuple[torch.Tensor, dict]:
        s = self.settings
        inputs, targets = batch
        language = self.batches.is_language(s.seed, step)
        if language and s.kd_weight:
            with torch.no_grad():
                teacher_logits = self._forward(self.teacher, inputs).logits
            out = self._forward(model, inputs)
            loss, ce, kl = language_loss(
                out.logits, teacher_logits, targets, temperature=s.temperature, kd_weight=s.kd_weight
            )
        elif language:  # no distillation (the interleaved recipe): the plain next-token CE
            out = self._forward(model, inputs)
            loss = ce = next_token_ce(out.logits, targets)
            kl = None
        else:
            out = self._forward(model, inputs)
            loss = ce = mqar_loss(out.logits, targets)
            kl = None
        aux = out.aux.get("loss_aux") if out.aux else None
        if aux is not None:
            loss = loss + aux.float()
        return loss, {
            "ce": ce,
            "kd": kl,
            "stage": s.stage_of(step),
            "batch": "language" if language else "mqar",
            "batch_tokens": int(inputs.numel()),
        }
