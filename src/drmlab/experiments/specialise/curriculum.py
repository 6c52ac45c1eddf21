"""The specialisation's settings (docs/mqar.md section 9): the curriculum of stages ``length:steps``
(parse, check, scale; the default fitted to the task's pair count), the MQAR batch size per length, the
two recipes' rates and constants, and :class:`Settings` (:func:`recipe_settings`), everything besides the
base run and the data that decides the steps.

Two recipes (section 9.1): ``distill`` (ours, the default) draws each step's batch by a coin, a
language window distilled from the frozen base with probability 0.8, else an MQAR batch, the stage
counting optimizer steps; ``interleaved`` (upstream's PMCS-64 memory specialisation) takes the stage's
MQAR batches in order with one plain language step after every 4th, one rate for every parameter and
no teacher, the stage counting MQAR batches."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from drmlab.experiments.mqar import distance as mqar_distance

DEFAULT_CURRICULUM = ((40, 1000), (80, 500), (160, 500), (320, 300), (512, 200), (1024, 100), (4096, 25))
RECIPES = ("distill", "interleaved")
LANGUAGE_PROBABILITY = 0.8
LANGUAGE_WINDOW = 128
# the interleaved recipe (upstream's PMCS-64): a language step after every 4th MQAR batch, 4 windows of 256
INTERLEAVED_LANGUAGE_EVERY = 4
INTERLEAVED_LANGUAGE_ROWS = 4
INTERLEAVED_LANGUAGE_WINDOW = 256
INTERLEAVED_LR = 3e-4
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


def default_curriculum(pairs: int = mqar_distance.PAIRS) -> list[tuple[int, int]]:
    """:data:`DEFAULT_CURRICULUM` for the task of ``pairs`` pairs: a stage shorter than its control
    length (5 x pairs) is lifted to it and merged with the next, their steps added, so the steps and the
    longer stages stay those of the default (16 pairs: 80:1500,160:500,...; 32 pairs: 160:2000,320:300,...)."""
    control = mqar_distance.control_length(pairs)
    stages: list[tuple[int, int]] = []
    carried = 0
    for length, steps in DEFAULT_CURRICULUM:
        if length < control:
            carried += steps
            continue
        if carried and length > control:
            stages.append((control, carried))
        stages.append((length, steps + (carried if length == control else 0)))
        carried = 0
    if carried:
        stages.append((control, carried))
    return check_curriculum(stages, pairs)


def parse_curriculum(text: str, pairs: int = mqar_distance.PAIRS) -> list[tuple[int, int]]:
    """``"40:1000,80:500"`` -> [(40, 1000), (80, 500)]: increasing lengths of at least the control
    length of ``pairs`` (5 x pairs: 40 at 8 pairs), positive steps."""
    stages = []
    for item in str(text).split(","):
        length, colon, steps = item.strip().partition(":")
        try:
            stages.append((int(length), int(steps)))
        except ValueError:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}") from None
        if not colon:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}")
    return check_curriculum(stages, pairs)


def check_curriculum(stages, pairs: int = mqar_distance.PAIRS) -> list[tuple[int, int]]:
    stages = [(int(length), int(steps)) for length, steps in stages]
    if not stages:
        raise ValueError("the curriculum has no stage")
    control = mqar_distance.control_length(pairs)
    for length, steps in stages:
        if length < control:
            raise ValueError(
                f"curriculum length {length} is below {control}, the control length of {pairs} pairs "
                "(5 x --pairs: the pairs and their queries)"
            )
        if steps <= 0:
            raise ValueError(f"curriculum stage {length}:{steps} needs a positive number of steps")
    lengths = [length for length, _ in stages]
    if any(b <= a for a, b in itertools.pairwise(lengths)):
        raise ValueError(f"curriculum lengths must increase from stage to stage, got {lengths}")
    return stages


def scale_curriculum(stages, scale: float, pairs: int = mqar_distance.PAIRS) -> list[tuple[int, int]]:
    """Every stage's steps times ``scale``, rounded, at least 1."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"--steps-scale must be a positive number, got {scale!r}")
    return [(length, max(1, round(steps * scale))) for length, steps in check_curriculum(stages, pairs)]


def mqar_batch_size(length: int) -> int:
    """Examples per MQAR batch at ``length``: 4 below 512, 2 below 1024, then 1."""
    return 4 if length < 512 else 2 if length < 1024 else 1


@dataclass
class Settings:
    """Everything besides the base run and the data that decides the specialisation's steps.
    ``curriculum`` counts optimizer steps per stage under ``distill`` and MQAR batches under
    ``interleaved``; ``lr`` is the interleaved recipe's one rate (``backbone_lr`` and ``memory_lr``
    are the distill recipe's two groups); ``pairs`` the MQAR task's pair count (docs/mqar.md 8.2);
    ``fast_weight_dim`` the width of a new memory (None: the model's default or the base's own); ``bf16``
    the teacher's and the student's forwards under a bf16 autocast (``drmlab specialise --fast``; the
    losses, the weights and the optimizer stay float32); ``bf16_memory_products`` the selective memory's
    products in that autocast's bf16 too (on under ``--fast``, docs/drm.md A.4.7; a run
    recorded before the setting existed reads as off)."""

    curriculum: list  # [[length, steps], ...] after scaling
    seed: int
    backbone_lr: float | None = BACKBONE_LR
    memory_lr: float | None = MEMORY_LR
    weight_decay: float = WEIGHT_DECAY
    grad_clip: float = GRAD_CLIP
    language_probability: float = LANGUAGE_PROBABILITY
    language_window: int = LANGUAGE_WINDOW
    temperature: float = TEMPERATURE
    kd_weight: float = KD_WEIGHT
    eval_sequences: int | None = None  # None: EVAL_BATCHES x the length's MQAR batch size
    eval_seed: int = mqar_distance.DEFAULT_EVAL_SEED
    recipe: str = "distill"
    language_rows: int = 1
    language_every: int | None = None  # interleaved: a language step after every this many MQAR batches
    lr: float | None = None  # interleaved: the one rate of every parameter
    pairs: int = mqar_distance.PAIRS
    fast_weight_dim: int | None = None
    bf16: bool = False
    bf16_memory_products: bool = False

    @classmethod
    def interleaved(
        cls, curriculum, seed: int, lr: float | None = None, backbone_lr=None, memory_lr=None, **kw
    ) -> Settings:
        """The interleaved recipe's settings (upstream's PMCS-64 memory specialisation); ``lr`` defaults
        to 3e-4; a ``backbone_lr`` or ``memory_lr`` given is refused by :meth:`validate`."""
        return cls(
            curriculum=curriculum,
            seed=seed,
            recipe="interleaved",
            backbone_lr=backbone_lr,
            memory_lr=memory_lr,
            lr=INTERLEAVED_LR if lr is None else lr,
            kd_weight=0.0,
            language_rows=INTERLEAVED_LANGUAGE_ROWS,
            language_window=INTERLEAVED_LANGUAGE_WINDOW,
            language_every=INTERLEAVED_LANGUAGE_EVERY,
            **kw,
        )

    def validate(self) -> Settings:
        mqar_distance.check_pairs(self.pairs)
        self.curriculum = [list(stage) for stage in check_curriculum(self.curriculum, self.pairs)]
        dim = self.fast_weight_dim
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0):
            raise ValueError(f"--fast-weight-dim must be a positive integer, got {dim!r}")
        if self.recipe not in RECIPES:
            raise ValueError(f"--recipe must be one of {', '.join(RECIPES)}, got {self.recipe!r}")
        if self.recipe == "distill":
            rates = (("backbone_lr", "a non-negative"), ("memory_lr", "a positive"))
            if self.lr is not None:
                raise ValueError(
                    "--lr is the interleaved recipe's rate; the distill recipe takes --backbone-lr and --memory-lr"
                )
        else:
            rates = (("lr", "a positive"),)
            if self.backbone_lr is not None or self.memory_lr is not None:
                raise ValueError(
                    "--recipe interleaved trains every parameter at --lr; --backbone-lr and --memory-lr are the distill recipe's"
                )
            if (
                isinstance(self.language_every, bool)
                or not isinstance(self.language_every, int)
                or self.language_every < 1
            ):
                raise ValueError(f"the interleaved recipe needs language_every >= 1, got {self.language_every!r}")
        for name, low in rates:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
                or (name != "backbone_lr" and value == 0)
            ):
                raise ValueError(f"--{name.replace('_', '-')} must be {low} number, got {value!r}")
        if not 0 <= self.language_probability <= 1:
            raise ValueError(f"the language probability must be in [0, 1], got {self.language_probability!r}")
        if self.eval_sequences is not None and (isinstance(self.eval_sequences, bool) or self.eval_sequences <= 0):
            raise ValueError(f"--eval-sequences must be a positive integer, got {self.eval_sequences!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {self.seed!r}")
        for name in ("bf16", "bf16_memory_products"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.bf16_memory_products and not self.bf16:
            raise ValueError("bf16_memory_products needs bf16: the memory's products follow the bf16 autocast")
        return self

    @property
    def trainer_lr(self) -> float:
        """The trainer's nominal rate (each optimizer group keeps its own)."""
        return self.lr if self.recipe == "interleaved" else self.memory_lr

    @property
    def total_steps(self) -> int:
        return self.stage_bounds()[-1][2]

    def is_language_step(self, step: int) -> bool:
        """Interleaved only: whether optimizer step ``step`` (from 1) is the language step that follows
        every ``language_every``-th MQAR batch."""
        return step % (self.language_every + 1) == 0

    def _step_of_mqar_batch(self, index: int) -> int:
        """Interleaved: the optimizer step of MQAR batch ``index`` (from 1)."""
        return index + (index - 1) // self.language_every

    def stage_bounds(self) -> list[tuple[int, int, int]]:
        """(length, first step, last step) of every stage; steps count from 1 across stages. Under
        ``interleaved`` a stage's steps are its MQAR batches and the language steps among and right
        after them."""
        bounds, last = [], 0
        if self.recipe != "interleaved":
            for length, steps in self.curriculum:
                bounds.append((length, last + 1, last + steps))
                last += steps
            return bounds
        for length, batches in self.curriculum:
            first = self._step_of_mqar_batch(last + 1)
            last += batches
            end = self._step_of_mqar_batch(last) + (1 if last % self.language_every == 0 else 0)
            bounds.append((length, first, end))
        return bounds

    def stage_of(self, step: int) -> int:
        """The length of the stage that optimizer step ``step`` belongs to."""
        for length, first, last in self.stage_bounds():
            if first <= step <= last:
                return length
        raise ValueError(f"step {step} is outside the curriculum's {self.total_steps} steps")

    def eval_count(self, length: int) -> int:
        return self.eval_sequences or EVAL_BATCHES * mqar_batch_size(length)


def recipe_settings(
    recipe: str,
    stages,
    seed: int,
    lr=None,
    backbone_lr=None,
    memory_lr=None,
    eval_sequences=None,
    pairs: int = mqar_distance.PAIRS,
    fast_weight_dim: int | None = None,
    bf16: bool = False,
    bf16_memory_products: bool = False,
) -> Settings:
    """The validated :class:`Settings` of ``recipe`` with these rates, pair count and memory width:
    another recipe's rates, a rate out of range or a bad curriculum is one ValueError (the CLI calls
    this before reading the corpus, so a refusal is immediate)."""
    kw = {
        "eval_sequences": eval_sequences,
        "pairs": pairs,
        "fast_weight_dim": fast_weight_dim,
        "bf16": bf16,
        "bf16_memory_products": bf16_memory_products,
    }
    if recipe == "interleaved":
        settings = Settings.interleaved([list(st) for st in stages], seed, lr, backbone_lr, memory_lr, **kw)
    else:
        settings = Settings(
            curriculum=[list(st) for st in stages],
            seed=seed,
            recipe=recipe,
            backbone_lr=BACKBONE_LR if backbone_lr is None else backbone_lr,
            memory_lr=MEMORY_LR if memory_lr is None else memory_lr,
            lr=lr,
            **kw,
        )
    return settings.validate()
