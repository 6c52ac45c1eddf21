"""The memory specialisation recipes (docs/mqar.md section 9; the upstream recipes restated in
``shared/notes/upstream-asm.md`` section 4 and ``upstream-asm-vr.md`` section 9): ``distill``, a
trained J_NO_DIRECTION run becomes an ASM_CM run that recalls over long distances without losing its
language modelling; ``interleaved``, upstream's PMCS-64 recipe, trains any run as it is on the same
curriculum with a plain language step after every 4th MQAR batch.

A curriculum, a loss and its stage evaluations on top of :func:`drmlab.training.train`:
``curriculum`` (stages, settings), ``batches`` (the mixed language / MQAR source, three random
streams keyed by the step), ``losses`` (distillation KL, language and MQAR losses, the loss piece)
and ``recipe`` (student and teacher, the two learning-rate groups, the hooks, verdicts, the run).
"""

from drmlab.experiments.specialise.batches import MixedBatches, language_batch, mqar_batch, uses_language
from drmlab.experiments.specialise.curriculum import (
    BACKBONE_LR,
    CE_REGRESSION_LIMIT,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_CURRICULUM,
    EVAL_BATCHES,
    EVAL_TOKENS_PER_FORWARD,
    GRAD_CLIP,
    INTERLEAVED_LANGUAGE_EVERY,
    INTERLEAVED_LANGUAGE_ROWS,
    INTERLEAVED_LANGUAGE_WINDOW,
    INTERLEAVED_LR,
    KD_WEIGHT,
    LANGUAGE_PROBABILITY,
    LANGUAGE_WINDOW,
    MEMORY_LR,
    PASS_THRESHOLD,
    RECIPES,
    TEMPERATURE,
    WEIGHT_DECAY,
    Settings,
    check_curriculum,
    mqar_batch_size,
    parse_curriculum,
    scale_curriculum,
)
from drmlab.experiments.specialise.losses import SpecialiseLoss, distillation_kl, language_loss, mqar_loss
from drmlab.experiments.specialise.recipe import (
    ADVICE,
    BASE_MODELS,
    FIXES_AFTER_NON_FINITE,
    MEMORY_PREFIX,
    PROGRESS_SECONDS,
    RESULT_FILE,
    STUDENT_MODEL,
    Specialisation,
    build_optimizer,
    build_single_rate_optimizer,
    build_student,
    check_base,
    load_base,
    memory_parameter_names,
    specialise,
    student_model,
)

__all__ = [
    "ADVICE",
    "BACKBONE_LR",
    "BASE_MODELS",
    "CE_REGRESSION_LIMIT",
    "DEFAULT_CHECKPOINT_EVERY",
    "DEFAULT_CURRICULUM",
    "EVAL_BATCHES",
    "EVAL_TOKENS_PER_FORWARD",
    "FIXES_AFTER_NON_FINITE",
    "GRAD_CLIP",
    "INTERLEAVED_LANGUAGE_EVERY",
    "INTERLEAVED_LANGUAGE_ROWS",
    "INTERLEAVED_LANGUAGE_WINDOW",
    "INTERLEAVED_LR",
    "KD_WEIGHT",
    "LANGUAGE_PROBABILITY",
    "LANGUAGE_WINDOW",
    "MEMORY_LR",
    "MEMORY_PREFIX",
    "PASS_THRESHOLD",
    "PROGRESS_SECONDS",
    "RECIPES",
    "RESULT_FILE",
    "STUDENT_MODEL",
    "TEMPERATURE",
    "WEIGHT_DECAY",
    "MixedBatches",
    "Settings",
    "Specialisation",
    "SpecialiseLoss",
    "build_optimizer",
    "build_single_rate_optimizer",
    "build_student",
    "check_base",
    "check_curriculum",
    "distillation_kl",
    "language_batch",
    "language_loss",
    "load_base",
    "memory_parameter_names",
    "mqar_batch",
    "mqar_batch_size",
    "mqar_loss",
    "parse_curriculum",
    "scale_curriculum",
    "specialise",
    "student_model",
    "uses_language",
]
