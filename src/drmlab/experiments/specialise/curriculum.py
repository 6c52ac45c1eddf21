"""The specialisation's settings (docs/mqar.md section 9): the curriculum of stages ``length:steps``
(parse, check, scale), the MQAR batch size per length, the recipe's rates and constants, and
:class:`Settings`, everything besides the base run and the data that decides the steps."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from drmlab.experiments.mqar import distance as mqar_distance

DEFAULT_CURRICULUM = ((40, 1000), (80, 500), (160, 500), (320, 300), (512, 200), (1024, 100), (4096, 25))
LANGUAGE_PROBABILITY = 0.8
LANGUAGE_WINDOW = 128
TEMPERATURE = 2.0
KD_WEIGHT = 0.5
BACKBONE_LR = 1e-5
MEMORY_LR = 1e-4
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
EVAL_BATCHES = 32  # stage evaluations: 32 batches at each length's MQAR batch size, as the notes
EVAL_TOKENS_PER_FORWARD = 16_384  # sequences per evaluation forward: about this many tokens
PASS_THRESHOLD = mqar_distance.GATE_THRESHOLD
CE_REGRESSION_LIMIT = 0.05
DEFAULT_CHECKPOINT_EVERY = 100


def parse_curriculum(text: str) -> list[tuple[int, int]]:
    """``"40:1000,80:500"`` -> [(40, 1000), (80, 500)]: increasing lengths of at least 40, positive steps."""
    stages = []
    for item in str(text).split(","):
        length, colon, steps = item.strip().partition(":")
        try:
            stages.append((int(length), int(steps)))
        except ValueError:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}") from None
        if not colon:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}")
    return check_curriculum(stages)


def check_curriculum(stages) -> list[tuple[int, int]]:
    stages = [(int(length), int(steps)) for length, steps in stages]
    if not stages:
        raise ValueError("the curriculum has no stage")
    for length, steps in stages:
        if length < mqar_distance.CONTROL_LENGTH:
            raise ValueError(
                f"curriculum length {length} is below {mqar_distance.CONTROL_LENGTH} (the 8 pairs and their queries)"
            )
        if steps <= 0:
            raise ValueError(f"curriculum stage {length}:{steps} needs a positive number of steps")
    lengths = [length for length, _ in stages]
    if any(b <= a for a, b in itertools.pairwise(lengths)):
        raise ValueError(f"curriculum lengths must increase from stage to stage, got {lengths}")
    return stages


def scale_curriculum(stages, scale: float) -> list[tuple[int, int]]:
    """Every stage's steps times ``scale``, rounded, at least 1."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"--steps-scale must be a positive number, got {scale!r}")
    return [(length, max(1, round(steps * scale))) for length, steps in check_curriculum(stages)]


def mqar_batch_size(length: int) -> int:
    """Examples per MQAR batch at ``length``: 4 below 512, 2 below 1024, then 1."""
    return 4 if length < 512 else 2 if length < 1024 else 1


@dataclass
class Settings:
    """Everything besides the base run and the data that decides the specialisation's steps."""

    curriculum: list  # [[length, steps], ...] after scaling
    seed: int
    backbone_lr: float = BACKBONE_LR
    memory_lr: float = MEMORY_LR
    weight_decay: float = WEIGHT_DECAY
    grad_clip: float = GRAD_CLIP
    language_probability: float = LANGUAGE_PROBABILITY
    language_window: int = LANGUAGE_WINDOW
    temperature: float = TEMPERATURE
    kd_weight: float = KD_WEIGHT
    eval_sequences: int | None = None  # None: EVAL_BATCHES x the length's MQAR batch size
    eval_seed: int = mqar_distance.DEFAULT_EVAL_SEED

    def validate(self) -> Settings:
        self.curriculum = [list(stage) for stage in check_curriculum(self.curriculum)]
        for name, low in (("backbone_lr", "a non-negative"), ("memory_lr", "a positive")):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
                or (name == "memory_lr" and value == 0)
            ):
                raise ValueError(f"--{name.replace('_', '-')} must be {low} number, got {value!r}")
        if not 0 <= self.language_probability <= 1:
            raise ValueError(f"the language probability must be in [0, 1], got {self.language_probability!r}")
        if self.eval_sequences is not None and (isinstance(self.eval_sequences, bool) or self.eval_sequences <= 0):
            raise ValueError(f"--eval-sequences must be a positive integer, got {self.eval_sequences!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {self.seed!r}")
        return self

    @property
    def total_steps(self) -> int:
        return sum(steps for _, steps in self.curriculum)

    def stage_bounds(self) -> list[tuple[int, int, int]]:
        """(length, first step, last step) of every stage; steps count from 1 across stages."""
        bounds, last = [], 0
        for length, steps in self.curriculum:
            bounds.append((length, last + 1, last + steps))
            last += steps
        return bounds

    def stage_of(self, step: int) -> int:
        """The length of the stage that optimizer step ``step`` belongs to."""
        for length, first, last in self.stage_bounds():
            if first <= step <= last:
                return length
        raise ValueError(f"step {step} is outside the curriculum's {self.total_steps} steps")

    def eval_count(self, length: int) -> int:
        return self.eval_sequences or EVAL_BATCHES * mqar_batch_size(length)
