"""A planned ablation study (:class:`Study`, what ``study.json`` records) and where its runs live:
``OUT/runs/LABEL-seedS`` for a paired run (:func:`run_dir`), ``OUT/tuning/LABEL-lrR`` for a sweep run
(:func:`tuning_dir`); docs/drm.md section A.7."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from drmlab.experiments import lr_sweep

STUDY_FILE = "study.json"


@dataclasses.dataclass(frozen=True)
class Study:
    """A planned study (:func:`~drmlab.experiments.ablate.plan.plan_study`): every label trains once per
    seed under one train config; what ``study.json`` records."""

    models: list[str]  # labels, in report order
    seeds: list[int]
    preset: str
    train: dict  # TrainConfig fields except the seed
    model_overrides: dict[str, dict]  # label -> model settings (only labels that have some)
    data_source: str | None
    tokenizer: str
    # label -> registered name where they differ (NAME:ARM specs, the loop study's arms)
    registry_names: dict[str, str] = dataclasses.field(default_factory=dict)
    lr_grid: list[float] | None = None  # sweep these rates per model first (None: train["lr"] for all)
    tune_tokens: int | None = None  # budget of each sweep run (None: the study's budget)
    rates: dict[str, float] | None = None  # label -> the rate of its paired runs (None: lr_grid or train["lr"])

    def registry_name(self, label: str) -> str:
        return self.registry_names.get(label, label)

    @property
    def tune_seed(self) -> int:
        return self.seeds[0]


def tuning_dir(out: str | Path, label: str, lr: float) -> Path:
    """Where the sweep run of ``label`` at rate ``lr`` lives."""
    from drmlab.models.registry import spec_path_name

    return Path(out) / "tuning" / f"{spec_path_name(label)}-lr{lr_sweep.lr_label(lr)}"


def run_dir(out: str | Path, label: str, seed: int) -> Path:
    """Where the run of ``label`` at ``seed`` lives."""
    from drmlab.models.registry import spec_path_name

    return Path(out) / "runs" / f"{spec_path_name(label)}-seed{seed}"
