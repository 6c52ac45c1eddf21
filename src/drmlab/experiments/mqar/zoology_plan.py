"""The Zoology MQAR study as planned (:class:`ZoologyStudy`, :func:`plan_study`): every model, width,
length, rate and setting checked before anything trains (docs/mqar.md section 10)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from drmlab.experiments.mqar.zoology_models import ATTENTION
from drmlab.experiments.mqar.zoology_recipe import LR_GRID, RECIPE, SETTINGS, WIDTHS, ZoologyRecipe
from drmlab.experiments.mqar.zoology_task import VOCAB_SIZE
from drmlab.naming import suggest
from drmlab.runs import jsonable

DEFAULT_MODELS = (
    ATTENTION,
    "GPT2",
    "MAMBA",
    "RESOLVENT",
    "SSM_CONTROL",
    "J_NO_DIRECTION",
    "ASM_CM",
    "LOOPED:A",
    "LOOPED:C",
)
# Train settings the protocol decides itself.
PROTOCOL_TRAIN_KEYS = ("tokens", "seq_len", "seed", "lr", "batch_size", "grad_accum", "schedule")


@dataclass
class ZoologyStudy:
    models: list[str]
    widths: list[int]
    settings: list[tuple[int, int]]
    lr_grid: list[float]
    preset: str = "tiny"
    recipe: ZoologyRecipe = RECIPE
    batch_size: int | None = None  # None: the recipe's per length
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)

    def batch_for(self, seq_len: int) -> int:
        return self.batch_size or self.recipe.batch_size(seq_len)

    def per_epoch(self, seq_len: int) -> int:
        return math.ceil(self.recipe.n_train / self.batch_for(seq_len))

    def train_config(self, seq_len: int, lr: float):
        from drmlab.training.config import TrainConfig

        values = dict(
            batch_size=self.batch_for(seq_len),
            grad_accum=1,
            seq_len=seq_len,
            seed=self.recipe.seed,
            lr=lr,
            schedule="cosine",
            warmup_fraction=0.0,
            min_lr_ratio=0.0,
            weight_decay=self.recipe.weight_decay,
            decay_all_params=True,
            grad_clip=0.0,
            bf16=False,
            eval_every=0,
            eval_windows=0,
            checkpoint_every=0,
            divergence_steps=0,
        )
        values.update(self.train_overrides)
        cfg = TrainConfig(**values)
        cfg.tokens = self.recipe.epochs * self.per_epoch(seq_len) * cfg.tokens_per_step
        return cfg.validate()

    def record(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def plan_study(
    models=DEFAULT_MODELS,
    widths=WIDTHS,
    seq_lens=None,
    *,
    preset: str = "tiny",
    lr_grid=LR_GRID,
    epochs: int = RECIPE.epochs,
    n_train: int = RECIPE.n_train,
    n_test: int = RECIPE.n_test,
    batch_size: int | None = None,
    seed: int = RECIPE.seed,
    data_seed: int = RECIPE.data_seed,
    early_stop: float = RECIPE.early_stop,
    probe_epochs: int | None = None,
    settings: dict | None = None,
) -> ZoologyStudy:
    """Check every model, width, length and setting and plan the study. ``seq_lens`` picks among the
    protocol's lengths (default all four; each brings its own kv and batch size). ``probe_epochs``: choose
    each cell's rate after that many epochs of every rate and train only the chosen one on (a CPU budget;
    None: Zoology's, every rate trains every epoch)."""
    from drmlab.models import list_models
    from drmlab.models.registry import config_fields
    from drmlab.training.config import split_overrides

    models = [str(m).strip() for m in models]
    if not models or not all(models):
        raise ValueError("models: give at least one name, and no empty ones")
    known = set(list_models()) | {ATTENTION}
    for name in models:
        if name.partition(":")[0] not in known:
            raise ValueError(
                f"unknown model {name!r}{suggest(name, known)}; {ATTENTION} is Zoology's attention baseline"
            )
    pairs = dict(SETTINGS)
    seq_lens = list(pairs) if seq_lens is None else list(seq_lens)
    for L in seq_lens:
        if L not in pairs:
            raise ValueError(f"seq_len {L!r} is not one of the protocol's lengths {', '.join(map(str, pairs))}")
    widths = list(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
        raise ValueError(f"widths must be positive integers, got {widths!r}")
    for what, value in (("epochs", epochs), ("n_train", n_train), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
        raise ValueError(f"batch_size must be a positive integer or None (the protocol's), got {batch_size!r}")
    if not (isinstance(early_stop, (int, float)) and 0 < early_stop <= 1):
        raise ValueError(f"early_stop must be an accuracy in (0, 1], got {early_stop!r}")
    if probe_epochs is not None and (
        isinstance(probe_epochs, bool) or not isinstance(probe_epochs, int) or not 0 < probe_epochs < epochs
    ):
        raise ValueError(f"probe_epochs must be a whole number of epochs below epochs ({epochs}), got {probe_epochs!r}")
    grid = parse_rates(lr_grid)
    recipe = dataclasses.replace(
        RECIPE,
        epochs=epochs,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        data_seed=data_seed,
        early_stop=float(early_stop),
        probe_epochs=probe_epochs,
    )
    study = ZoologyStudy(
        models=models,
        widths=widths,
        settings=[(L, pairs[L]) for L in sorted(seq_lens)],
        lr_grid=grid,
        preset=preset,
        recipe=recipe,
        batch_size=batch_size,
    )
    fields: set = set()
    for name in models:
        registry, kw = ("GPT2", {}) if name == ATTENTION else _spec(name)
        fields |= set(config_fields(registry, preset, VOCAB_SIZE, **kw))
    if settings:
        train_kw, model_kw = split_overrides(settings, fields)
        for key in PROTOCOL_TRAIN_KEYS:
            if key in train_kw:
                raise ValueError(
                    f"the train setting {key!r} is the protocol's own (its lengths, batch sizes, "
                    "epochs, seed and rate grid decide it)"
                )
        study.train_overrides, study.model_overrides = train_kw, model_kw
    study.train_config(study.settings[0][0], grid[0])  # validate early
    return study


def parse_rates(rates) -> list[float]:
    """``"1e-4,1e-3"`` or numbers -> the sorted distinct rates (one rate is allowed: no sweep)."""
    parts = [p.strip() for p in rates.split(",") if p.strip()] if isinstance(rates, str) else list(rates)
    try:
        values = [float(p) for p in parts if not isinstance(p, bool)]
    except (TypeError, ValueError):
        raise ValueError(f"lr grid {rates!r}: give comma-separated numbers, e.g. 1e-4,1e-3") from None
    if not values or len(values) != len(parts) or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"lr grid {rates!r}: give at least one rate, each a finite number above 0")
    if len(set(values)) != len(values):
        raise ValueError(f"lr grid {rates!r} lists a rate twice")
    return sorted(values)


def _spec(name: str) -> tuple[str, dict]:
    from drmlab.models.registry import parse_model_spec

    return parse_model_spec(name)
