"""The teacher and the student of the specialisation recipes (docs/mqar.md section 9): the base run
checked and loaded frozen (:func:`load_base`), the student built from it holding its weights
(:func:`build_student`: ASM_CM with a new fast-weight memory under ``distill``, of width
``--fast-weight-dim`` where given, :func:`student_overrides`; the base's own model under ``interleaved``) and the student's learning-rate groups (:func:`build_optimizer`: ``backbone`` and
``memory`` under ``distill``; :func:`build_single_rate_optimizer`: one group under ``interleaved``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.experiments.specialise.curriculum import BACKBONE_LR, MEMORY_LR, WEIGHT_DECAY
from drmlab.runs import RunDir
from drmlab.training.optim import adamw

STUDENT_MODEL = "ASM_CM"
BASE_MODELS = ("J_NO_DIRECTION", "ASM_CM")
MEMORY_PREFIX = "fast_weight_memory."


def student_model(base_config: dict, recipe: str = "distill") -> str:
    """The specialised model's registry name: ASM_CM under ``distill``, the base's own model under
    ``interleaved`` (upstream's PMCS-64 specialises every arm as it is)."""
    return STUDENT_MODEL if recipe == "distill" else base_config["model"]


def check_base(base: str | Path, recipe: str = "distill") -> dict:
    """The config.json of the run directory ``base`` after checking it can be specialised: a run of
    the 256-id bytes vocabulary with a checkpoint, of J_NO_DIRECTION or ASM_CM under ``distill``, of
    any model under ``interleaved`` (one line otherwise)."""
    run = RunDir(base)
    if not run.has_config():
        raise FileNotFoundError(f"--base {base}: not a drmlab run directory (no {run.config_path.name})")
    config = run.read_config()
    name = config.get("model")
    if recipe == "distill" and name not in BASE_MODELS:
        raise ValueError(
            f"--base {base}: a {name} run; the distill recipe starts from a J_NO_DIRECTION run "
            f"(or continues an ASM_CM one); --recipe interleaved specialises any model as it is"
        )
    if not run.has_checkpoint():
        raise FileNotFoundError(f"--base {base}: no checkpoint to start from (missing {run.pointer_path.name})")
    vocab = config.get("vocab_size") or (config.get("model_config") or {}).get("vocab_size")
    if vocab != mqar_distance.VOCAB_SIZE:
        raise ValueError(
            f"--base {base}: its vocabulary has {vocab} ids; the recall task's tokens need exactly "
            f"{mqar_distance.VOCAB_SIZE} (a bytes run)"
        )
    return config


def load_base(base: str | Path, device, recipe: str = "distill") -> tuple[nn.Module, dict, dict]:
    """(the base model, frozen, in eval mode; its config.json; the checkpoint pointer), after
    :func:`check_base`."""
    check_base(base, recipe)
    run = RunDir(base)
    pointer = run.read_pointer()
    teacher, config, _ = run.load_model(device)
    teacher.eval().requires_grad_(False)
    return teacher, config, pointer


def student_overrides(base_config: dict, recipe: str = "distill", fast_weight_dim: int | None = None) -> dict:
    """The student's model overrides: the base run's, plus ``fast_weight_dim`` when the student gets a
    new memory (a J_NO_DIRECTION base under ``distill``). A memory the student copies from its base (an
    ASM_CM base) keeps its width: another ``fast_weight_dim`` is refused in one line, as is one for a
    student without a memory (a memory-less base under ``interleaved``)."""
    from drmlab.models.registry import config_fields

    overrides = dict(base_config.get("overrides") or {})
    if fast_weight_dim is None:
        return overrides
    base_name, preset = base_config["model"], base_config["preset"]
    vocab = int(base_config.get("vocab_size") or mqar_distance.VOCAB_SIZE)
    base_fields = config_fields(base_name, preset, vocab, **overrides)
    if base_fields.get("fast_weight_memory"):
        if base_fields.get("fast_weight_dim") != fast_weight_dim:
            raise ValueError(
                f"--fast-weight-dim {fast_weight_dim}: the base's {base_name} memory is "
                f"{base_fields.get('fast_weight_dim')} wide and is copied whole; a new width needs a "
                "J_NO_DIRECTION base under --recipe distill"
            )
        return overrides
    name = student_model(base_config, recipe)
    if not config_fields(name, preset, vocab, **overrides).get("fast_weight_memory"):
        raise ValueError(
            f"--fast-weight-dim {fast_weight_dim}: the student {name} has no fast-weight memory "
            f"(--recipe {recipe} trains the base's model as it is)"
        )
    overrides["fast_weight_dim"] = fast_weight_dim
    config_fields(name, preset, vocab, **overrides)  # a width the model refuses fails now, in its words
    return overrides


def memory_parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if name.startswith(MEMORY_PREFIX)]


def build_student(
    base_config: dict, teacher: nn.Module, seed: int, recipe: str = "distill", overrides: dict | None = None
) -> nn.Module:
    """The student (:func:`student_model`) at the base run's preset, vocabulary and overrides
    (``overrides``, from :func:`student_overrides`, where given), holding the teacher's weights (all of
    them but the new memory's from a J_NO_DIRECTION base under ``distill``), on the teacher's device,
    in train mode."""
    from drmlab.models import build_model

    name = student_model(base_config, recipe)
    student = build_model(
        name,
        base_config["preset"],
        vocab_size=int(base_config["vocab_size"]),
        seed=seed,
        **(base_config.get("overrides") or {} if overrides is None else overrides),
    )
    student.to(next(teacher.parameters()).device)
    source = teacher.state_dict()
    if base_config["model"] == name:
        student.load_state_dict(source, strict=True)
    else:
        missing, unexpected = student.load_state_dict(source, strict=False)
        new = set(memory_parameter_names(student))
        if set(missing) != new or unexpected:
            raise ValueError(
                f"the base's weights do not fit {STUDENT_MODEL} beside its memory: missing "
                f"{sorted(set(missing) - new)[:3]}, unexpected {sorted(unexpected)[:3]}"
            )
    return student.train()


def build_single_rate_optimizer(student: nn.Module, lr: float, weight_decay: float = WEIGHT_DECAY) -> torch.optim.AdamW:
    """The interleaved recipe's AdamW: every trainable parameter in one group ``all`` at ``lr``."""
    trainable = [parameter for parameter in student.parameters() if parameter.requires_grad]
    return adamw([{"params": trainable, "lr": lr, "weight_decay": weight_decay, "name": "all"}], lr=lr)


def build_optimizer(
    student: nn.Module,
    backbone_lr: float = BACKBONE_LR,
    memory_lr: float = MEMORY_LR,
    weight_decay: float = WEIGHT_DECAY,
) -> torch.optim.AdamW:
    """AdamW with two groups, ``backbone`` (every parameter but the memory's) and ``memory``
    (``fast_weight_memory.*``), both with ``weight_decay``; each group's rate is its base rate for
    the trainer's (constant) schedule."""
    backbone, memory = [], []
    for name, parameter in student.named_parameters():
        (memory if name.startswith(MEMORY_PREFIX) else backbone).append(parameter)
    if not memory:
        raise ValueError(f"the student has no {MEMORY_PREFIX}* parameters")
    return adamw(
        [
            {"params": backbone, "lr": backbone_lr, "weight_decay": weight_decay, "name": "backbone"},
            {"params": memory, "lr": memory_lr, "weight_decay": weight_decay, "name": "memory"},
        ],
        lr=memory_lr,
    )
