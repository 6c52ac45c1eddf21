"""The distance MQAR study as asked for (:class:`DistanceSpec`) and as planned (:class:`DistanceStudy`,
:func:`plan_study`): every model, run directory, length, milestone and setting checked before anything
trains (docs/mqar.md section 8).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from drmlab.experiments.mqar import controls as recall_controls
from drmlab.experiments.mqar.distance_read import DEFAULT_CHUNK, DEFAULT_EVAL_BATCH, DEFAULT_EVAL_SEED
from drmlab.experiments.mqar.distance_task import PAIRS, VOCAB_SIZE, check_length, check_pairs, control_length
from drmlab.experiments.mqar.models import ANCHOR_ARMS, POSITION_FIELDS, width_overrides
from drmlab.experiments.mqar.task import probe_train_config
from drmlab.experiments.spec import Spec
from drmlab.naming import suggest

DEFAULT_MODELS = ("J_NO_DIRECTION", "SSM_CONTROL")
DEFAULT_SEEDS = (1234,)
DEFAULT_LENGTHS = (40, 512, 4096, 32768)
DEFAULT_STEPS = 2000
DEFAULT_MILESTONES = (250, 500, 1000, 2000)
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 1e-3
DEFAULT_N_EVAL = 512  # x 8 targets = 4,096 per length, as the notes


def default_lengths(pairs: int = PAIRS) -> tuple:
    """The lengths read when none are asked for: those of :data:`DEFAULT_LENGTHS` above the control
    length of ``pairs`` (which is always read)."""
    return tuple(L for L in DEFAULT_LENGTHS if L > control_length(pairs))


def with_default_pairs(spec):
    """A saved spec (a dict) written before the pair count was a setting, with ``pairs`` at its default
    8 (what it was); any other value as it is."""
    return {"pairs": PAIRS, **spec} if isinstance(spec, dict) else spec


@dataclass(frozen=True)
class DistanceSpec(Spec):
    """A distance MQAR study as asked for: ``models`` (registered ``NAME`` or ``NAME:ARM``) x ``seeds``
    trained on the control and read at ``lengths``, and run directories ``ckpts`` read without training;
    ``pairs``: the task's pair count (1-32; the control is 5 x pairs tokens); ``lengths`` None: those of
    :data:`DEFAULT_LENGTHS` longer than the control (:func:`default_lengths`); ``milestones`` None: those of
    :data:`DEFAULT_MILESTONES` below ``steps``; ``settings``: TrainConfig or model-config fields for every run."""

    models: tuple = DEFAULT_MODELS
    seeds: tuple = DEFAULT_SEEDS
    lengths: tuple | None = None
    ckpts: tuple = ()
    preset: str = "tiny"
    width: int | None = None
    steps: int = DEFAULT_STEPS
    milestones: tuple | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: float = DEFAULT_LR
    n_eval: int = DEFAULT_N_EVAL
    eval_batch: int = DEFAULT_EVAL_BATCH
    eval_seed: int = DEFAULT_EVAL_SEED
    chunk: int = DEFAULT_CHUNK
    read_all: bool = False
    controls: tuple = ()
    settings: dict = dataclasses.field(default_factory=dict)
    pairs: int = PAIRS


@dataclass(frozen=True)
class DistanceStudy:
    """A planned distance study (:func:`plan_study`): lengths and milestones complete, settings split."""

    models: list[str]
    seeds: list[int]
    lengths: list[int]
    ckpts: list[str] = dataclasses.field(default_factory=list)
    preset: str = "tiny"
    width: int | None = None
    steps: int = DEFAULT_STEPS
    milestones: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_MILESTONES))
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: float = DEFAULT_LR
    n_eval: int = DEFAULT_N_EVAL
    eval_batch: int = DEFAULT_EVAL_BATCH
    eval_seed: int = DEFAULT_EVAL_SEED
    chunk: int = DEFAULT_CHUNK
    read_all: bool = False
    controls: list[str] = dataclasses.field(default_factory=list)
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)
    pairs: int = PAIRS

    @property
    def control_length(self) -> int:
        """The control's length, the training length: 5 x ``pairs``."""
        return control_length(self.pairs)

    def train_config(self, seed: int):
        return probe_train_config(
            batch_size=self.batch_size,
            seq_len=self.control_length - 1,
            seed=seed,
            lr=self.lr,
            steps=self.steps,
            overrides=self.train_overrides,
        )

    def eval_spec(self) -> dict:
        """What a length's result depends on besides the weights (the chunk changes only rounding)."""
        return {"n_eval": self.n_eval, "eval_seed": self.eval_seed, "pairs": self.pairs}


def _positive_ints(values, what: str) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        raise ValueError(f"{what} must be a non-empty list of positive integers, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what} lists a value twice: {values!r}")
    return values


def resolve_model(name: str, preset: str, width: int | None, overrides: dict, pairs: int = PAIRS) -> tuple[str, dict]:
    """(registered name, overrides) of a registered ``NAME`` or ``NAME:ARM``: the width, then
    ``overrides``, then a position table at least as long as the control of ``pairs`` (5 x pairs: 40 at
    8 pairs, one row more than the 39 training inputs, as before the pair count was a setting)."""
    from drmlab.models.registry import config_fields, parse_model_spec

    if name in ANCHOR_ARMS:
        raise ValueError(
            f"{name} is an anchor arm of the fixed MQAR protocol (vocabulary 130, no decoding "
            "state); the distance protocol takes registered models (NAME or NAME:ARM)"
        )
    registry, kw = parse_model_spec(name)
    kw.update(width_overrides(config_fields(registry, preset, VOCAB_SIZE, **kw), width))
    kw.update(overrides)
    fields = config_fields(registry, preset, VOCAB_SIZE, **kw)
    control = control_length(pairs)
    for key in POSITION_FIELDS:
        if key in fields and key not in overrides and isinstance(fields[key], int) and fields[key] < control:
            kw[key] = control
    return registry, kw


def plan_study(spec: DistanceSpec) -> DistanceStudy:
    """Check every model, run directory, length and setting of ``spec`` and plan the study. The
    milestones (steps at which the control accuracy is measured) always end at ``steps``; the control
    (5 x ``pairs`` tokens) is always among the lengths."""
    from drmlab.models import list_models
    from drmlab.models.registry import config_fields
    from drmlab.runs import RunDir
    from drmlab.training.config import split_overrides

    preset, width, steps, lr = spec.preset, spec.width, spec.steps, spec.lr
    pairs = check_pairs(spec.pairs)
    models = [str(m).strip() for m in spec.models or ()]
    ckpts = [str(c) for c in spec.ckpts or ()]
    if not models and not ckpts:
        raise ValueError("give at least one model to train or one run directory to evaluate (--ckpt)")
    if any(not m for m in models):
        raise ValueError("models: no empty names")
    known = set(list_models())
    fields: set = set()
    for name in models:
        if name not in ANCHOR_ARMS and name.partition(":")[0] not in known:
            raise ValueError(f"unknown model {name!r}{suggest(name, known)}")
        registry, kw = resolve_model(name, preset, width, {}, pairs)
        fields |= set(config_fields(registry, preset, VOCAB_SIZE, **kw))
    for path in ckpts:
        run = RunDir(path)
        if not run.has_config() or not run.has_checkpoint():
            raise FileNotFoundError(
                f"--ckpt {path}: not a drmlab run directory with a checkpoint (config.json and checkpoint.json)"
            )
    names = [Path(c).resolve().name for c in ckpts]
    if len(set(names)) != len(names):
        raise ValueError(f"--ckpt: two run directories share a name ({', '.join(names)}); their results would collide")
    seeds = list(spec.seeds)
    if (
        not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds!r}")
    asked = default_lengths(pairs) if spec.lengths is None else spec.lengths
    lengths = sorted(set([control_length(pairs)] + [check_length(L, pairs) for L in asked]))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if spec.milestones is None:  # the defaults below steps (none below 250), then steps itself
        milestones = sorted({m for m in DEFAULT_MILESTONES if m < steps} | {steps})
    else:
        milestones = sorted(set(_positive_ints(spec.milestones, "milestones")) | {steps})
    if milestones[-1] > steps:
        raise ValueError(f"milestone {milestones[-1]} is beyond the {steps} training steps")
    for what, value in (("n_eval", spec.n_eval), ("eval_batch", spec.eval_batch), ("chunk", spec.chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    controls = recall_controls.parse_controls(spec.controls)
    shuffles = [c for c in controls if c in recall_controls.STREAM]
    if shuffles and pairs < recall_controls.SHUFFLES_NEED:
        raise ValueError(
            f"--controls {','.join(shuffles)}: a shuffle needs at least {recall_controls.SHUFFLES_NEED} pairs "
            f"(--pairs {pairs} has no derangement)"
        )
    memory = [c for c in controls if c in recall_controls.MEMORY_CONTROLS]
    holders = [_has_memory(*resolve_model(name, preset, width, {}, pairs), preset) for name in models]
    holders += [_has_memory(c["model"], c.get("overrides") or {}, c["preset"]) for c in map(_ckpt_config, ckpts)]
    if memory and not any(holders):
        raise ValueError(
            f"--controls {','.join(memory)}: none of the study's models has a fast-weight memory "
            "(ASM_CM, or a DRM with fast_weight_memory=True)"
        )
    train_kw, model_kw = split_overrides(spec.settings, fields) if spec.settings else ({}, {})
    for key in ("tokens", "seq_len", "seed", "lr", "batch_size"):
        if key in train_kw:
            raise ValueError(
                f"the train setting {key!r} is the protocol's own (its steps, length, seeds, "
                "lr and batch size decide it)"
            )
    study = DistanceStudy(
        models=models,
        seeds=seeds,
        lengths=lengths,
        ckpts=ckpts,
        preset=preset,
        width=width,
        steps=steps,
        milestones=milestones,
        batch_size=spec.batch_size,
        lr=float(lr),
        n_eval=spec.n_eval,
        eval_batch=spec.eval_batch,
        eval_seed=spec.eval_seed,
        chunk=spec.chunk,
        read_all=spec.read_all,
        controls=controls,
        model_overrides=model_kw,
        train_overrides=train_kw,
        pairs=pairs,
    )
    for name in models:  # a bad model setting fails now, on the meta device
        registry, kw = resolve_model(name, preset, width, study.model_overrides, pairs)
        config_fields(registry, preset, VOCAB_SIZE, **kw)
    if models:
        study.train_config(seeds[0])  # validate early
    return study


def _has_memory(registry: str, overrides: dict, preset: str) -> bool:
    from drmlab.models.registry import config_fields

    return bool(config_fields(registry, preset, VOCAB_SIZE, **overrides).get("fast_weight_memory"))


def _ckpt_config(path: str) -> dict:
    from drmlab.runs import RunDir

    return RunDir(path).read_config()
