"""Training settings: the :class:`TrainConfig` dataclass, preset defaults, token budgets, and the routing of
settings to the train config or the model.

A run is fully described by (model name, preset, model overrides, :class:`TrainConfig`, data).
``resolve_train_config`` layers them: the preset's defaults (``PRESET_DEFAULTS``), then the named
recipe's settings (:mod:`drmlab.training.recipes`), then explicit arguments; ``split_overrides`` routes ``{key: value}`` settings to the train config or to the
model builder and rejects unknown keys with the nearest known one.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from drmlab.naming import known_names, suggest, unknown
from drmlab.presets import PRESET_DEFAULTS
from drmlab.training.recipes import DEFAULT_RECIPE, RECIPES, recipe_settings

SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    """Everything the trainer needs besides the model and the data.

    Sizes: one optimizer step consumes ``batch_size * grad_accum * seq_len`` target tokens;
    ``batch_size`` is the *global* micro-batch (split across processes under torchrun). The run
    takes ``ceil(tokens / tokens_per_step)`` steps, so ``tokens`` is rounded up to whole steps. A budget
    given in optimizer steps (``steps``, ``drmlab train --steps``) sets ``tokens`` to
    ``steps * tokens_per_step`` on validation; both are recorded.
    """

    tokens: int = 1_000_000  # token budget (targets), rounded up to whole optimizer steps
    steps: int | None = None  # the budget in optimizer steps instead (then tokens = steps x tokens_per_step)
    batch_size: int = 32  # sequences per micro-batch, all processes together
    grad_accum: int = 1  # micro-batches per optimizer step (loss divided by this)
    seq_len: int = 256  # training window; each row is seq_len + 1 tokens
    seed: int = 0  # drives the model init and the batch order
    lr: float = 1e-3  # peak learning rate
    # the named recipe (drmlab.training.recipes) the settings below come from; its own settings can still be
    # changed one by one. The defaults below are the "reference" recipe's: a record without it ran that one
    recipe: str = "reference"
    schedule: str = "constant"  # "constant" or "cosine" (linear warm-up, cosine decay)
    warmup_fraction: float | None = None  # share of steps warming up; None: 0 (constant), 0.05 (cosine)
    min_lr_ratio: float = 0.1  # cosine: final lr = min_lr_ratio * lr
    weight_decay: float = 0.01  # AdamW decoupled decay
    decay_all_params: bool = True  # the reference decays every tensor; False skips 1-D ones (norms, biases)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    bf16: bool = False  # bf16 autocast for the training forward (weights stay fp32)
    # under bf16: the DRM selective memory's matrix products in bf16 too (gates and scan stay float32;
    # docs/drm.md A.4.7); --fast turns it on; without bf16 it changes nothing
    bf16_memory_products: bool = False
    # torch.compile the training forward as one graph (fullgraph=True, inductor); "auto": where the run's
    # length repays the compile (drmlab.training.compile_choice; drmlab train's default)
    compile: bool | str = False
    eval_every: int | None = None  # tokens between sampled evaluations; None: tokens / 5; 0: never
    eval_windows: int = 32  # validation windows of seq_len in the sampled evaluation (fixed set)
    eval_tokens: int | None = None  # cap on targets in the final rescoring; None: whole validation stream
    eval_batch_size: int = 8  # windows per forward when evaluating
    checkpoint_every: int | None = None  # tokens between checkpoints; None: at every sampled evaluation
    divergence_nats: float = 1.0  # a loss this far above the uniform guess, ln(vocab), counts as diverging
    divergence_steps: int = 20  # ... for this many steps in a row stops the run; 0: never
    # token counts at which the whole final evaluation (the rescoring) also runs during training, as
    # ``milestone`` rows of metrics.jsonl (the upstream milestone view: 1M, 2M, 5M tokens); None: none
    milestones: list | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    @property
    def total_steps(self) -> int:
        return max(1, math.ceil(self.tokens / self.tokens_per_step))

    def steps_between(self, tokens: int | None) -> int:
        """A token interval as a whole number of optimizer steps (at least 1); 0 means never."""
        if tokens == 0:
            return 0
        return max(1, round(tokens / self.tokens_per_step))

    @property
    def eval_every_steps(self) -> int:
        tokens = self.eval_every if self.eval_every is not None else self.total_steps * self.tokens_per_step // 5
        return self.steps_between(tokens)

    @property
    def checkpoint_every_steps(self) -> int:
        if self.checkpoint_every is None:
            return self.eval_every_steps
        return self.steps_between(self.checkpoint_every)

    @property
    def warmup_steps(self) -> int:
        fraction = self.warmup_fraction
        if fraction is None:
            fraction = 0.05 if self.schedule == "cosine" else 0.0
        return int(round(fraction * self.total_steps))

    def validate(self) -> TrainConfig:
        """Raise ValueError naming the first bad field (wrong type, out of range, not finite); return self."""

        def number(key, low=None, high=None, *, open_low=False, open_high=False, integer=False, optional=False):
            value = getattr(self, key)
            if value is None and optional:
                return
            kinds = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or (not integer and not math.isfinite(value)):
                raise ValueError(
                    f"{key} must be {'an integer' if integer else 'a finite number'}"
                    f"{' or null' if optional else ''}, got {value!r}"
                )
            if low is not None and (value <= low if open_low else value < low):
                raise ValueError(f"{key} must be {'>' if open_low else '>='} {low}, got {value!r}")
            if high is not None and (value >= high if open_high else value > high):
                raise ValueError(f"{key} must be {'<' if open_high else '<='} {high}, got {value!r}")

        for key in ("tokens", "batch_size", "grad_accum", "seq_len", "eval_batch_size"):
            number(key, 0, open_low=True, integer=True)
        number("steps", 0, open_low=True, integer=True, optional=True)
        if self.steps is not None:
            self.tokens = self.steps * self.tokens_per_step
        for key in ("seed", "eval_windows", "divergence_steps"):
            number(key, 0, integer=True)
        for key in ("eval_every", "eval_tokens", "checkpoint_every"):
            number(key, 0, integer=True, optional=True)
        number("lr", 0, open_low=True)
        number("eps", 0, open_low=True)
        number("divergence_nats", 0, open_low=True)
        number("weight_decay", 0)
        number("grad_clip", 0)
        number("min_lr_ratio", 0, 1)
        number("beta1", 0, 1, open_high=True)
        number("beta2", 0, 1, open_high=True)
        number("warmup_fraction", 0, 1, optional=True)
        for key in ("decay_all_params", "bf16", "bf16_memory_products"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.compile, bool) and self.compile != "auto":
            raise ValueError(f'compile must be true, false or "auto", got {self.compile!r}')
        if self.milestones is not None:
            marks = self.milestones
            if not isinstance(marks, (list, tuple)) or any(
                isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in marks
            ):
                raise ValueError(f"milestones must be a list of positive token counts, got {marks!r}")
            if list(marks) != sorted(set(marks)) or (marks and marks[-1] >= self.tokens):
                raise ValueError(
                    f"milestones must increase and stay below the budget of {self.tokens:,} tokens "
                    f"(the final evaluation scores the end), got {list(marks)!r}"
                )
            self.milestones = list(marks)
        if self.recipe not in RECIPES:
            raise unknown("recipe", self.recipe, RECIPES)
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {self.schedule!r}{suggest(str(self.schedule), SCHEDULES)}; known: {', '.join(SCHEDULES)}"
            )
        if self.tokens < self.tokens_per_step:
            raise ValueError(
                f"the budget of {self.tokens:,} tokens is smaller than one optimizer step of "
                f"{self.tokens_per_step:,} tokens (batch_size {self.batch_size} x grad_accum {self.grad_accum} "
                f"x seq_len {self.seq_len}); raise tokens or lower seq_len / batch_size"
            )
        return self


TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig))
# A setting missing from an older record had its default (settings are only ever added with a default).
TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def with_train_defaults(spec):
    """A saved run spec (a dict with a ``train`` dict of TrainConfig fields) with the train settings added
    since it was written at their defaults: each new setting defaults to the behaviour before it, so a saved
    run compares equal to today's spec of the same settings. Anything else is returned as it is."""
    if not isinstance(spec, dict) or not isinstance(spec.get("train"), dict):
        return spec
    added = {k: v for k, v in TRAIN_DEFAULTS.items() if k not in spec["train"]}
    return dict(spec, train={**added, **spec["train"]}) if added else spec


_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def parse_tokens(text: str | int) -> int:
    """Parse a token count: ``5M``, ``500k``, ``5_005_312``, ``5,005,312``, ``1.5M``, ``2e6``."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip().replace("_", "").replace(",", "")
        match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgb]?)", s, flags=re.IGNORECASE)
        if not match:
            raise ValueError(f"cannot read token count {text!r}; write e.g. 5M, 500k or 5_005_312")
        number = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
        if number != int(number):
            raise ValueError(f"token count {text!r} is not a whole number")
        value = int(number)
    if value <= 0:
        raise ValueError(f"token count must be positive, got {text!r}")
    return value


def split_overrides(assignments: dict, model_keys) -> tuple[dict, dict]:
    """Route assignments to (train config, model config); unknown keys are an error with a suggestion."""
    model_keys = set(model_keys)
    train, model = {}, {}
    for key, value in assignments.items():
        if key in TRAIN_KEYS:
            train[key] = value
        elif key in model_keys:
            model[key] = value
        else:
            known = set(TRAIN_KEYS) | model_keys
            raise ValueError(
                f"unknown setting {key!r}{suggest(key, known)}; {known_names(key, known)}: "
                "`drmlab inspect --settings --model NAME` lists them all"
            )
    if "tokens" in train:
        train["tokens"] = parse_tokens(train["tokens"])
    if isinstance(train.get("steps"), str):
        train["steps"] = parse_tokens(train["steps"])
    for key in ("eval_every", "eval_tokens", "checkpoint_every"):
        if isinstance(train.get(key), str):
            train[key] = parse_tokens(train[key])
    if isinstance(train.get("milestones"), str):  # "1M,2M"
        train["milestones"] = [parse_tokens(part.strip()) for part in train["milestones"].split(",") if part.strip()]
    elif isinstance(train.get("milestones"), (list, tuple)):
        train["milestones"] = [parse_tokens(m) if isinstance(m, str) else m for m in train["milestones"]]
    return train, model


def resolve_train_config(preset: str, **values) -> TrainConfig:
    """The preset's defaults, then the settings of the recipe ``values["recipe"]`` (default
    :data:`~drmlab.training.recipes.DEFAULT_RECIPE`), then every other non-None value in ``values``;
    validated. An unknown recipe is refused listing the known ones."""
    if preset not in PRESET_DEFAULTS:
        raise ValueError(
            f"unknown preset {preset!r}{suggest(preset, PRESET_DEFAULTS)}; known: {', '.join(PRESET_DEFAULTS)}"
        )
    recipe = values.get("recipe") or DEFAULT_RECIPE
    merged = {**PRESET_DEFAULTS[preset], **recipe_settings(recipe), "recipe": recipe}
    for key, value in values.items():
        if key not in TRAIN_KEYS:
            raise ValueError(f"unknown train setting {key!r}{suggest(key, TRAIN_KEYS)}")
        if value is not None:
            merged[key] = value
    if isinstance(merged.get("tokens"), str):
        merged["tokens"] = parse_tokens(merged["tokens"])
    return TrainConfig(**merged).validate()
